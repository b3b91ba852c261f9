import torch, time, sys
from torch.utils.cpp_extension import load
names=sys.argv[1].split(',')
from build import flags
mods={n:load(name='attn_'+n, sources=['/tmp/attn_exp/attn.cpp'], extra_cflags=flags(n), extra_ldflags=['-fopenmp'], verbose=False) for n in names}
import collections
for th in (2,1):
  torch.set_num_threads(th)
  for B,ctx in ((14,400),(8,1000),(40,300)):
    Hq,Hkv,D,bs,layers=9,3,64,16,30
    nblk_per=-(-ctx//bs); nblocks=B*nblk_per*layers+8
    kc=torch.randn(nblocks,Hkv,bs,D); vc=torch.randn(nblocks,Hkv,bs,D)
    perm=torch.randperm(nblocks-8)
    q=torch.randn(B,Hq,D); outs={n:torch.empty_like(q) for n in names}
    tables=[perm[l*B*nblk_per:(l+1)*B*nblk_per].view(B,nblk_per).int().contiguous() for l in range(layers)]
    lens=torch.full((B,),ctx,dtype=torch.int32)
    T=collections.defaultdict(list)
    for rnd in range(7):
      for n in names:
        f=mods[n].paged_decode_attention; o=outs[n]
        t=time.perf_counter()
        for l in range(layers): f(o,q,kc,vc,tables[l],lens,0.125)
        T[n].append(time.perf_counter()-t)
    assert all(torch.equal(outs[names[0]],outs[n]) for n in names)
    by=B*ctx*Hkv*D*4*2*layers
    print(f'th {th} B {B} ctx {ctx}: '+'  '.join(f'{n} {sorted(T[n])[3]*1e3:.2f}ms/{by/sorted(T[n])[3]/1e9:.1f}' for n in names), flush=True)
