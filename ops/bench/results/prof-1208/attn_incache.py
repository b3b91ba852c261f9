# The shipped kernel (cpu_ops) on one layer in L2 against 30 layers from DRAM, blocks scattered or
# in order: python ops/bench/results/prof-1208/attn_incache.py THREADS
import sys, time, statistics, torch
sys.path.insert(0, '.')
from kernels import cpu_ops
ops = cpu_ops.load()
torch.set_num_threads(int(sys.argv[1]))
KV, QH, HS, B = 3, 9, 64, 16
for batch, ctx, layers, scattered in ((4, 128, 1, True), (4, 128, 1, False), (14, 400, 30, True), (14, 400, 30, False)):
    per = -(-ctx // B)
    shape = (batch * per * layers, KV, B, HS)
    k, v = torch.randn(shape), torch.randn(shape)
    order = torch.randperm(shape[0], dtype=torch.int32) if scattered else torch.arange(shape[0], dtype=torch.int32)
    tables = order.view(layers, batch, per)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    q = torch.randn(batch, QH, HS); out = torch.empty_like(q)
    reps = max(1, 300 // layers)
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(reps):
            for l in range(layers):
                ops.paged_decode_attention(out, q, k, v, tables[l], lens, 0.125)
        ts.append(time.perf_counter() - t)
    med = statistics.median(ts[1:])
    gb = 2 * layers * batch * ctx * KV * HS * 4 * reps / 1e9
    print(f"{batch}x{ctx} layers {layers} {'scattered' if scattered else 'contiguous'}: {gb/med:.1f} GB/s, {1e6*med/reps/layers:.1f} us/layer")
