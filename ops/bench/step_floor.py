"""What a step costs at the least, and how much of it the device spent idle: the measuring half
of ``ops/bench/gpu_steps.py``, kept apart so it is checked without an engine.

- ``copy_gbps``: bytes read + written per second by a large device-to-device copy (the ceiling
  ``ops/bench/kernels.py`` holds its decode kernel against too); 1 GiB on CUDA streams from
  HBM, past the 50 MiB L2.
- ``step_bytes``: a decode step's byte floor (weights, K/V read and written).
- ``profile_idle``: the share of a profiled window in which no device work ran.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import median_seconds
from ops.bench.engine_workload import non_embedding_params
from worker.models.config import ModelConfig

WINDOW = "gpu_steps.window"  # the record_function annotation around the profiled steps
# Chrome-trace categories of device work: CUDA's kernels and copies; on the CPU, torch ops.
DEVICE_CATEGORIES = {"cuda": ("kernel", "gpu_memcpy", "gpu_memset"), "cpu": ("cpu_op",)}
TOP_EVENTS = 6


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_gbps(device: str, nbytes: int, reps: int = 5) -> float:
    """Bytes read + written per second by ``dst.copy_(src)``, median of ``reps`` after one."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), reps, lambda: synchronize(device))
    return 2 * nbytes / seconds / 1e9


def step_bytes(mc: ModelConfig, itemsize: int, batch: int, context: float) -> dict[str, float]:
    """What one decode step of ``batch`` rows at mean ``context`` must move, in bytes."""
    weights = (non_embedding_params(mc) + mc.vocab_size * mc.hidden_size) * itemsize
    per_token = mc.kv_bytes_per_token * itemsize  # K and V of every layer, one token
    kv_read = batch * (context + 1) * per_token  # its past and the token it appends
    kv_write = batch * per_token
    return {
        "weights": float(weights),
        "kv_read": kv_read,
        "kv_write": float(kv_write),
        "total": weights + kv_read + kv_write,
    }


def busy_us(intervals: Sequence[tuple[float, float]], window: tuple[float, float]) -> float:
    """Length of the union of ``intervals`` clipped to ``window`` (overlaps counted once)."""
    lo, hi = window
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    total, end = 0.0, lo
    for s, e in clipped:
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def idle_from_trace(trace: dict[str, Any], device: str, wall_us: float) -> dict[str, Any]:
    """Idle share of a chrome trace from torch.profiler: its ``WINDOW`` annotation where the
    trace has one (CPU activity recorded), else ``wall_us``, measured around the same steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    windows = [e for e in events if e.get("name") == WINDOW and e.get("cat") == "user_annotation"]
    work = [e for e in events if e.get("cat") in DEVICE_CATEGORIES[device]]
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in work]
    if windows:
        start = float(windows[0]["ts"])
        window = (start, start + float(windows[0]["dur"]))
    else:  # every span came from the steps: the profile started and ended synchronised
        first = min((s for s, _ in spans), default=0.0)
        window = (first, first + max(wall_us, max((e for _, e in spans), default=0.0) - first))
    busy = busy_us(spans, window)
    length = window[1] - window[0]
    by_name: dict[str, float] = {}
    for e in work:
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + float(e["dur"])
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP_EVENTS]
    return {
        "window_ms": length / 1e3,
        "busy_ms": busy / 1e3,
        "idle_share": 1 - busy / length if spans and length > 0 else None,
        "device_events": len(spans),
        # Where the busy time went (on the CPU nested ops count in their parents too).
        "top_events_ms": {name[:80]: us / 1e3 for name, us in top},
    }


def profile_idle(step: Callable[[], None], num_steps: int, device: str) -> dict[str, Any]:
    """Run ``num_steps`` steps under torch.profiler; the device's idle share over them.

    On CUDA only the GPU's activity is recorded: tracing every CPU op as well would slow the
    host, which is what the share measures, and the window is then the wall clock."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        synchronize(device)
        start = time.perf_counter()
        with record_function(WINDOW):
            for _ in range(num_steps):
                step()
            synchronize(device)
        wall_us = (time.perf_counter() - start) * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return {**idle_from_trace(trace, device, wall_us), "profiled_steps": num_steps}
