import torch, sys
sys.path.insert(0, '.')
from kernels import cpu_ops, quant_reference as qr
from tests.kernels.test_quant_linear_kernel import random_blocks
import inspect; print(inspect.signature(random_blocks))
ops = cpu_ops.load(sys.argv[1] if len(sys.argv) > 1 else None)
torch.manual_seed(0)
for t in (3, 8, 2):
    for n, k in ((192, 576), (1536, 576), (576, 1536), (64, 160)):
        b = random_blocks(qr.block_format(t), n, k, 0)
        km = qr.pack_kmajor(b, t)
        x = torch.randn(300, k)
        full = ops.gguf_linear_kmajor(x, km, t, None)
        ref = x.double() @ qr.dequantize(b, t).double().T
        err = ((full - ref).abs().max() / ref.abs().max()).item()
        same = all(torch.equal(ops.gguf_linear_kmajor(x[:r], km, t, None), full[:r]) for r in (1, 5, 12, 13, 23, 24, 25, 80, 299))
        print(t, n, k, f"{err:.2e}", same)
