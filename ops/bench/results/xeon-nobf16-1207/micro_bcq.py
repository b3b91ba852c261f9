# 1 thread, from the repository root: python ops/bench/results/xeon-nobf16-1207/micro_bcq.py
# The exact tile (ops.gguf_linear) against micro_bcq.cpp (columns in lanes) on one Q4_1 weight.
import os, sys, time, torch
sys.path.insert(0, ".")
from torch.utils.cpp_extension import load
from kernels import cpu_ops, quant_reference as qr
torch.set_num_threads(1)
ops = cpu_ops.load()
m = load("micro_bcq", ["ops/bench/results/xeon-nobf16-1207/micro_bcq.cpp"], extra_cflags=["-O3", "-march=native", "-I" + os.path.abspath("kernels")], verbose=False)
g = torch.Generator().manual_seed(0)
def q4_1_blocks(n, k):
    nb = k // 32
    b = torch.randint(0, 256, (n, nb, 20), dtype=torch.uint8, generator=g)
    b[:, :, 0:2] = (torch.rand(n, nb, generator=g) * 0.01 + 0.001).half().view(torch.uint8).view(n, nb, 2)
    b[:, :, 2:4] = (-torch.rand(n, nb, generator=g) * 0.05).half().view(torch.uint8).view(n, nb, 2)
    return b.reshape(n, nb * 20).contiguous()
def rate(fn, flop, s=0.4):
    fn(); c=0; t=time.perf_counter()
    while time.perf_counter()-t < s: fn(); c+=1
    return flop*c/(time.perf_counter()-t)/1e9
for n,k in [(64,576),(768,576),(3072,576),(576,1536)]:
    w = q4_1_blocks(n, k); wf = qr.dequantize(w, 3)
    for rows in [1, 8, 12, 16, 24, 48]:
        x = torch.randn(rows, k); f = 2*rows*n*k
        ref = x @ wf.T
        a, b = ops.gguf_linear(x, w, 3, None), m.bcq(x, w)
        assert torch.allclose(b, ref, atol=1e-4, rtol=1e-4), (b - ref).abs().max()
        print(n, k, rows, "tile %.1f  bcq %.1f  mkl(fp32 w) %.1f GFLOP/s" % (rate(lambda: ops.gguf_linear(x, w, 3, None), f), rate(lambda: m.bcq(x, w), f), rate(lambda: x @ wf.T, f)), flush=True)
