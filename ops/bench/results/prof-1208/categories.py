"""perf's flat profile (perf report --no-children --sort dso,sym --stdio) summed by kind of work.

    perf record -F 499 -o perf.data -- .venv/bin/python ops/bench/engine.py --systems ours \
        --num-requests 64 --scale 1 --threads 2
    perf report -i perf.data --no-children --sort dso,sym --stdio | grep % > perf_flat_full.txt
    python ops/bench/results/prof-1208/categories.py perf_flat_full.txt
"""
import collections
import re
import sys

KINDS = (
    ("projections (k-major GGUF kernels)", lambda dso, sym: "kmajor" in sym or "linear_groups" in sym),
    ("decode attention (attend_one)", lambda dso, sym: "attend_one" in sym),
    ("prefill attention", lambda dso, sym: "attend_tile" in sym or "build_panels" in sym),
    ("other paternoster kernels", lambda dso, sym: "paternoster" in dso),
    ("linux kernel", lambda dso, sym: "kernel" in dso),
    ("python", lambda dso, sym: "python" in dso),
    ("torch (incl. the matmul probe)", lambda dso, sym: "torch" in dso),
    ("libgomp", lambda dso, sym: "gomp" in dso),
)
totals: collections.Counter[str] = collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)", line)
    if not m:
        continue
    share, dso, sym = float(m.group(1)), m.group(2), m.group(3)
    kind = next((name for name, hit in KINDS if hit(dso, sym)), "other")
    totals[kind] += share
for kind, share in totals.most_common():
    print(f"{share:6.2f}%  {kind}")
