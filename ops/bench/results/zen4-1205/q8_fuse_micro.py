import time, statistics, torch, gguf, sys
from kernels import cpu_ops
ops = cpu_ops.load(None)
torch.set_num_threads(2)
res = {}
for n, k in ((192, 576), (576, 576), (1536, 576), (576, 1536)):
    w = torch.randn(n, k)
    b = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1))
    for rows in (8, 16, 64):
        x = torch.randn(rows, k)
        for _ in range(200): ops.gguf_linear_q8(x, b, 3, None)
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(500): ops.gguf_linear_q8(x, b, 3, None)
            ts.append((time.perf_counter() - t) / 500 * 1e6)
        res[(n, k, rows)] = statistics.median(ts)
print(sys.argv[1], " ".join(f"{n}x{k}@{r}:{v:.1f}" for (n, k, r), v in res.items()))
