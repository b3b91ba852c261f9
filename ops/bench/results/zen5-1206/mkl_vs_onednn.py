import time, torch
torch.set_num_threads(2)
x = torch.randn(512, 576); w = torch.randn(1536, 576)
from torch.utils import mkldnn as mkldnn_utils
lin = torch.nn.Linear(576, 1536, bias=False); lin.weight.data = w.clone()
packed = mkldnn_utils.to_mkldnn(lin) if hasattr(mkldnn_utils,'to_mkldnn') else None
def t(f, n=50):
    f(); s=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-s)/n*1e3
flops = 2*512*576*1536
a = t(lambda: torch.nn.functional.linear(x, w))
print(f"F.linear (MKL?) {a:.3f} ms {flops/a/1e6:.0f} GFLOP/s")
wp = torch.ops.mkldnn._reorder_linear_weight(w, batch_size=512) if hasattr(torch.ops.mkldnn, "_reorder_linear_weight") else None
if wp is not None:
    b = t(lambda: torch.ops.mkldnn._linear_pointwise(x, wp, None, "none", [], ""))
    print(f"oneDNN packed {b:.3f} ms {flops/b/1e6:.0f} GFLOP/s")
print(torch.__config__.show().split('\n')[:12])
