"""Decode attention's outputs of one tree, saved for a bitwise comparison with another:

cd BEFORE && python bitwise.py BEFORE /tmp/b.pt;  cd AFTER && python bitwise.py AFTER /tmp/a.pt
python bitwise.py --compare /tmp/a.pt /tmp/b.pt
"""

import sys

import torch

if sys.argv[1] == "--compare":
    a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
    for key in a:
        same = torch.equal(a[key], b[key])
        print(key, "equal" if same else f"differs, max {float((a[key] - b[key]).abs().max()):.3g}")
    raise SystemExit(0)
root = sys.argv[1]
sys.path.insert(0, root)
sys.path.insert(0, root + "/tests/kernels")
from paged_cases import make_paged_kv  # noqa: E402

from kernels import cpu_ops  # noqa: E402

ops = cpu_ops.load()
outs = {}
for dtype in (torch.float32, torch.bfloat16):
    for group, hs, bs, kv_heads in [(3, 64, 16, 3), (1, 64, 16, 2), (4, 128, 32, 2), (8, 32, 16, 1),
                                    (2, 80, 1, 1)]:
        gen = torch.Generator().manual_seed(group * 100 + hs)
        contexts = [1, 15, 17, 100, 1000, 33, 7, 250]
        kv = make_paged_kv(contexts, kv_heads, hs, bs, dtype, gen)
        q = torch.randn(len(contexts), kv_heads * group, hs, generator=gen)
        out = torch.empty_like(q)
        ops.paged_decode_attention(out, q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens,
                                   hs**-0.5)
        outs[(str(dtype), group, hs, bs, kv_heads)] = out
torch.save(outs, sys.argv[2])
