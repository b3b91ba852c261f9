import torch, time, sys, collections
sys.path.insert(0,'/tmp/attn_exp'); sys.path.insert(0,'/work/main')
from torch.utils.cpp_extension import load
from build import flags
from worker.engine import huge_pages
mod=load(name='attn_base', sources=['/tmp/attn_exp/attn.cpp'], extra_cflags=flags('base'), extra_ldflags=['-fopenmp'], verbose=False)
for th in (2,1):
  torch.set_num_threads(th)
  for B,ctx in ((14,400),(8,1000),(40,300)):
    res={}
    for bs in (16,32,64,128):
      for huge in (False,True):
        Hq,Hkv,D,layers=9,3,64,30
        nblk_per=-(-ctx//bs); nblocks=B*nblk_per*layers+8
        shape=(nblocks,Hkv,bs,D)
        mk=(lambda: huge_pages.zeros(shape, torch.float32)) if huge else (lambda: torch.zeros(shape))
        kc=mk(); vc=mk(); kc.normal_(); vc.normal_()
        perm=torch.randperm(nblocks-8)
        q=torch.randn(B,Hq,D); o=torch.empty_like(q)
        tables=[perm[l*B*nblk_per:(l+1)*B*nblk_per].view(B,nblk_per).int().contiguous() for l in range(layers)]
        lens=torch.full((B,),ctx,dtype=torch.int32)
        f=mod.paged_decode_attention; ts=[]
        for rnd in range(9):
            t=time.perf_counter()
            for l in range(layers): f(o,q,kc,vc,tables[l],lens,0.125)
            ts.append(time.perf_counter()-t)
        by=B*ctx*Hkv*D*4*2*layers
        res[(bs,huge)]=by/sorted(ts)[4]/1e9
        del kc,vc
    print(f'th {th} B {B} ctx {ctx} GB/s: '+' '.join(f'bs{bs}{"H" if h else ""}={v:.1f}' for (bs,h),v in res.items()), flush=True)
