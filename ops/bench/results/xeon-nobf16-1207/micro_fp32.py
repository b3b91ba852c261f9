# 1 thread, from the repository root: python ops/bench/results/xeon-nobf16-1207/micro_fp32.py
# Two fp32 microkernels (micro_fp32.cpp) on one weight in cache, GFLOP/s, beside torch.
import time, torch
from torch.utils.cpp_extension import load
torch.set_num_threads(1)
m = load("micro_k", ["ops/bench/results/xeon-nobf16-1207/micro_fp32.cpp"], extra_cflags=["-O3", "-march=native"], verbose=False)
def rate(fn, flop, s=0.4):
    fn(); c=0; t=time.perf_counter()
    while time.perf_counter()-t < s: fn(); c+=1
    return flop*c/(time.perf_counter()-t)/1e9
big=torch.randn(2048,2048)
print("mm", rate(lambda: big@big, 2*2048**3))
for n,k in [(64,576),(576,576),(1536,576),(576,1536)]:
    w=torch.randn(n,k); wp=w.view(n//32,32,k).transpose(1,2).contiguous()
    for rows in [12, 24, 48]:
        x=torch.randn(rows,k); f=2*rows*n*k
        ref=x@w.T
        assert torch.allclose(m.dot(x,w),ref,atol=1e-3) and torch.allclose(m.bc(x,wp),ref,atol=1e-3)
        print(n,k,rows, "dot %.1f bc %.1f mkl %.1f" % (rate(lambda: m.dot(x,w),f), rate(lambda: m.bc(x,wp),f), rate(lambda: x@w.T, f)))
