"""The C++ CPU kernels run with the GIL released, as torch's own ops do.

Holding it kept the worker's intake and publisher threads waiting behind whole projections
(issue 22's trace: submit-to-claim p50 1.5 ms idle, 4.6-7.9 ms beside a batch). A thread that
keeps sampling the clock must therefore make progress while one long kernel call runs.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from kernels import cpu_ops
from kernels.quant_reference import quantize_int8


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Kernels on one of torch's threads, so the sampling thread has a core of its own; and a
    1 s switch interval, so a kernel that held the GIL would keep it across a loop of calls."""
    threads, interval_s = torch.get_num_threads(), sys.getswitchinterval()
    torch.set_num_threads(1)
    sys.setswitchinterval(1.0)
    yield
    sys.setswitchinterval(interval_s)
    torch.set_num_threads(threads)


def samples_inside(call: Callable[[], object], run_s: float = 0.2) -> tuple[int, int]:
    """Clock samples another Python thread took while ``call`` ran back to back for ``run_s``
    (each sample inside one call's own start and end), and the number of calls."""
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(time.perf_counter())
            time.sleep(0)  # yields the GIL each sample, so a kernel holding it would block here

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    time.sleep(0.05)  # the sampler is running
    calls: list[tuple[float, float]] = []
    until = time.perf_counter() + run_s
    while (start := time.perf_counter()) < until:
        call()
        calls.append((start, time.perf_counter()))
    stop.set()
    thread.join()
    return sum(any(a < t < b for a, b in calls) for t in samples), len(calls)


@pytest.mark.usefixtures("one_thread")
def test_a_linear_kernel_lets_other_threads_run() -> None:
    ops = cpu_ops.load()
    assert ops is not None, cpu_ops.unavailable_reason()
    x = torch.randn(4, 2048)
    weight = torch.randn(24576, 2048)  # 192 MiB of fp32 a call: about 9 ms
    inside, calls = samples_inside(lambda: ops.skinny_linear(x, weight))
    assert inside > 10, f"{inside} samples during {calls} kernel calls"


@pytest.mark.usefixtures("one_thread")
def test_a_quantized_kernel_lets_other_threads_run() -> None:
    ops = cpu_ops.load()
    assert ops is not None, cpu_ops.unavailable_reason()
    weight, scale = quantize_int8(torch.randn(49152, 2048))  # 96 MiB of int8 a call
    x = torch.randn(8, 2048)
    inside, calls = samples_inside(lambda: ops.int8_linear(x, weight, scale))
    assert inside > 10, f"{inside} samples during {calls} kernel calls"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("rows", [1, 16])  # the one-row-per-vector kernel, and the GEMM
def test_the_8_bit_activation_kernel_lets_other_threads_run(rows: int) -> None:
    ops = cpu_ops.load()
    assert ops is not None, cpu_ops.unavailable_reason()
    blocks = torch.zeros(49152, 64 * 20, dtype=torch.uint8)  # Q4_1, k = 2048: 60 MiB a call
    x = torch.randn(rows, 2048)
    inside, calls = samples_inside(lambda: ops.gguf_linear_q8(x, blocks, 3))
    assert inside > 10, f"{inside} samples during {calls} kernel calls"
