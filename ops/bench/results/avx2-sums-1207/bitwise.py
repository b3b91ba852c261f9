"""The haswell build's 8-bit GEMM outputs of one tree, saved for a bitwise comparison with another:

cd BEFORE && PATERNOSTER_CPU_ARCH=haswell python bitwise.py BEFORE /tmp/b.pt
cd AFTER && PATERNOSTER_CPU_ARCH=haswell python bitwise.py AFTER /tmp/a.pt
python -c "import torch; a, b = torch.load('/tmp/a.pt'), torch.load('/tmp/b.pt');
print(len(a), all(torch.equal(a[k], b[k]) for k in a))"   # printed: 24 True
"""

import sys

import torch

root = sys.argv[1]
sys.path.insert(0, root)
sys.path.insert(0, root + "/tests/kernels")
from test_q8_panels import random_blocks  # noqa: E402

import kernels.quant_reference as qr  # noqa: E402
from kernels import cpu_ops  # noqa: E402

module = cpu_ops.load("haswell")
outs = {}
for fmt in (qr.Q4_1, qr.Q4_0, qr.Q8_0):
    blocks = random_blocks(96, 1536, fmt)
    panels = qr.pack_panels(blocks, fmt.type_id, module.q8_panel_rows())
    gen = torch.Generator().manual_seed(1)
    for rows in (3, 8, 17, 64):
        x = torch.randn(rows, 1536, generator=gen)
        outs[(fmt.name, rows, "panels")] = module.gguf_linear_q8(x, panels, fmt.type_id, None, True)
        outs[(fmt.name, rows, "file")] = module.gguf_linear_q8(x, blocks, fmt.type_id, None)
torch.save(outs, sys.argv[2])
