"""The AVX2 k-major variants of runs.txt: kmajor_exp.cpp compiled -march=haswell once per
(TILE_R, TILE_MIN), bound alone, timed over the bundled file's 210 Q4_1 projections packed
k-major (1 thread: CPU ms, median of 6). From the repository root:

    python ops/bench/results/kmajor-avx2-1207/harness/bench.py "4,1000 6,16" "1 12 24 48"
"""

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.cpp_extension import load  # noqa: E402

from kernels import quant_reference as qr  # noqa: E402
from ops.bench.quant_linear import file_weights  # noqa: E402

configs = [tuple(map(int, c.split(","))) for c in sys.argv[1].split()]  # tile_r,tile_min
rows_list = [int(r) for r in sys.argv[2].split()]
torch.set_num_threads(1)
packed = [qr.pack_kmajor(b, 3) for b in file_weights(210).q41]
mods = {
    (tr, tm): load(
        name=f"kxt_{tr}_{tm}",
        sources=[str(HERE / "bind.cpp"), str(HERE / "kmajor_exp.cpp")],
        extra_cflags=[
            "-O3",
            "-march=haswell",
            "-fopenmp",
            f"-DTILE_R={tr}",
            f"-DTILE_MIN={tm}",
            f"-I{ROOT / 'kernels'}",
            f"-I{HERE}",
        ],
        extra_ldflags=["-fopenmp"],
    )
    for tr, tm in configs
}
for rows in rows_list:
    xs = {k: torch.randn(rows, k) for k in {p.shape[1] // 20 * 32 for p in packed}}
    line = f"rows {rows:3d}:"
    for cfg, m in mods.items():
        times = []
        for _ in range(6):
            t0 = time.thread_time()
            for p in packed:
                m.lin(xs[p.shape[1] // 20 * 32], p)
            times.append(time.thread_time() - t0)
        line += f" {cfg} {1000 * statistics.median(times):.1f}"
    print(line, flush=True)
