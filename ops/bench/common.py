"""What every bench shares: the thread each system runs on, the machine it ran on, the matmul
ceiling its FLOP rates are held against, and how its report is written.

Import it as ``ops.bench.common`` with the repository first on ``sys.path`` (every bench puts it
there), never as a bare ``common`` from this folder: one module, whichever bench loads it.
Nothing here imports ``worker``, so a bench that must set up the environment first (kernels.py:
``TRITON_INTERPRET`` before any Triton import) can import it at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch

MATMUL_N = 2048  # the CPU's ceiling; engine_report.py uses 8192 on a GPU
DEFAULT_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}  # weights and KV, unless --dtype says
T = TypeVar("T")


def in_worker_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread, as HF continuous batching runs its loop, so every system
    gets the same OpenMP behaviour. libgomp spins 300k rounds at a barrier, but only 1k once it
    manages more threads than CPUs (as soon as a second thread has a team). With other
    processes on the 2 cores, full spinning made main-thread systems 10-20x slower (a toy MLP
    loop: 12.4 s on the main thread, 1.6 s on a second thread, 1.5 s with OMP_WAIT_POLICY=passive)
    while HF's own thread was unaffected."""
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            errors.append(e)

    thread = threading.Thread(target=target, name="bench-system")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def environment(threads: int, device: str = "cpu") -> dict[str, Any]:
    import transformers

    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "systems_run_on": "a fresh thread each (see in_worker_thread)",
    }


# The clocks a bench's ``--clock`` names: wall time, or the CPU time of the calling thread (other
# processes stay out of it; with more than one torch thread it counts only its own share).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def median_seconds(
    fn: Callable[[], object],
    reps: int,
    sync: Callable[[], object] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median time by ``clock`` (wall time by default) of ``reps`` calls of ``fn`` after one
    untimed warm-up call; ``sync`` waits for the device after each (CUDA work is asynchronous:
    without it the clock stops at the launch)."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        sync()
        times.append(clock() - start)
    return statistics.median(times)


def matmul_gflops(
    n: int = MATMUL_N, reps: int = 5, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> float:
    """``n^3`` matmul, median of ``reps`` after one warm-up: the device's practical ceiling."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return 2 * n**3 / median_seconds(lambda: torch.matmul(a, b), reps, sync) / 1e9


def args_record(args: argparse.Namespace, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The parsed flags as a report records them: paths as strings, ``skip`` left out."""
    left_out = set(skip)
    return {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in left_out
    }


def write_report(report: dict[str, Any], out: Path | None, **dumps: Any) -> None:
    """``report`` as indented JSON at ``out`` (its folder made), when a path was given;
    ``dumps`` goes to ``json.dumps`` (e.g. ``default=str``)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, **dumps))
