"""The native build's exact GGUF outputs of one tree, saved for a bitwise comparison with another:

cd BEFORE && python bitwise.py BEFORE /tmp/b.pt
cd AFTER && python bitwise.py AFTER /tmp/a.pt
python -c "import torch; a, b = torch.load('/tmp/a.pt'), torch.load('/tmp/b.pt');
print(len(a), all(torch.equal(a[k], b[k]) for k in a))"   # printed: 30 True
"""

import sys

import torch

root = sys.argv[1]
sys.path.insert(0, root)
sys.path.insert(0, root + "/tests/kernels")
from test_q8_panels import random_blocks  # noqa: E402

import kernels.quant_reference as qr  # noqa: E402
from kernels import cpu_ops  # noqa: E402

module = cpu_ops.load()
outs = {}
for fmt in (qr.Q4_1, qr.Q4_0, qr.Q8_0):
    blocks = random_blocks(96, 1536, fmt)
    outs[(fmt.name, "dequantize")] = module.gguf_dequantize(blocks, fmt.type_id, False)
    outs[(fmt.name, "dequantize bf16")] = module.gguf_dequantize(blocks, fmt.type_id, True)
    gen = torch.Generator().manual_seed(1)
    for rows in (1, 2, 3, 8, 9, 12, 17, 64):
        x = torch.randn(rows, 1536, generator=gen)
        outs[(fmt.name, rows)] = module.gguf_linear(x, blocks, fmt.type_id, None)
torch.save(outs, sys.argv[2])
