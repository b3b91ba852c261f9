"""Per-pair host_ms and phases of the alternated runs (ab.sh): python summarise.py TAG."""

import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).parent
tag = sys.argv[1]
rows: dict[str, dict[int, list[dict]]] = {"before": {}, "after": {}}
for side in rows:
    for f in sorted(here.glob(f"{tag}_{side}_*.json")):
        for b in json.loads(f.read_text())["batches"]:
            rows[side].setdefault(b["batch"], []).append(b)
for batch in sorted(rows["before"]):
    pairs = list(zip(rows["before"][batch], rows["after"].get(batch, []), strict=False))
    print(f"B={batch}")
    for k, (b, a) in enumerate(pairs, 1):
        phases = " ".join(
            f"{p} {b['median_ms'][p]:.2f}->{a['median_ms'][p]:.2f}"
            for p in ("schedule", "prepare", "update", "other")
            if b["median_ms"].get(p)
        )
        ratio = a["host_ms"] / b["host_ms"] if b["host_ms"] else float("nan")
        print(f"  pair {k}: host {b['host_ms']:.3f} -> {a['host_ms']:.3f} ({ratio:.2f}) {phases}")
    med_b = statistics.median(b["host_ms"] for b, _ in pairs)
    med_a = statistics.median(a["host_ms"] for _, a in pairs)
    print(f"  median host {med_b:.3f} -> {med_a:.3f}; min {min(b['host_ms'] for b, _ in pairs):.3f}"
          f" -> {min(a['host_ms'] for _, a in pairs):.3f}")
