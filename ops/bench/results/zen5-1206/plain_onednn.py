import time, torch
torch.set_num_threads(2)
def t(f, n=30):
    f(); s=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-s)/n*1e3
for m, k, n in [(512, 576, 1536), (512, 1536, 576), (128, 576, 1536), (96, 576, 192), (1024, 576, 1536)]:
    x = torch.randn(m, k); w = torch.randn(n, k)
    flops = 2*m*k*n
    a = t(lambda: torch.nn.functional.linear(x, w))
    try:
        b = t(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
        ok = torch.allclose(torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), x @ w.T, atol=1e-3, rtol=1e-4)
    except Exception as e:
        b = float('nan'); ok = repr(e)[:80]
    c = t(lambda: torch.mm(x, w.t()))
    print(f"{m}x{k}x{n}: F.linear {a:.3f} ms ({flops/a/1e6:.0f}) | onednn plain {b:.3f} ({flops/b/1e6:.0f}) {ok} | mm {c:.3f}")
