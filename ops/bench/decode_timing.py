"""How kernels.py times decode attention: medians of CUDA's ``do_bench`` (or one host-timed call
on the CPU, where times only prove the script runs), CUDA-graph replays that leave out the
host's launch time, and torch SDPA on K/V gathered from the paged cache as the baseline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ops.bench.common import median_seconds


def median_ms(fn: Callable[[], Any], cuda: bool, cpu_reps: int = 1) -> float:
    """Median time of ``fn`` in ms; on CUDA via ``do_bench``, which flushes L2 between runs.

    CPU times (the interpreter) only prove the script runs, so one timed call is enough there.
    """
    if cuda:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return median_seconds(fn, cpu_reps) * 1e3


def graph_ms(fn: Callable[[], Any]) -> float:
    """Median time of ``fn`` replayed from a CUDA graph: the GPU's time without the host's.

    A small decode moves too few bytes to hide a launch from Python (a Triton launch costs more
    host time than SDPA's C++ dispatch), so events around a plain call can time the host.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up (compile, allocate) outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, cuda=True)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def gathered_bhld(cache: torch.Tensor, block_tables: torch.Tensor, ctx: int) -> torch.Tensor:
    """The padded contiguous ``(B, H, L, D)`` layout SDPA wants, gathered from the paged cache."""
    from kernels.reference import gather_kv

    return gather_kv(cache, block_tables, ctx)[:, :, :ctx].contiguous()


def time_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    ctx: int,
    triton_out: torch.Tensor,
) -> tuple[float, float, float, float | None]:
    """``(rel err vs triton_out, SDPA ms, gather + SDPA ms, SDPA ms from a CUDA graph)``; all
    sequences are ``ctx`` long."""
    cuda = q.is_cuda
    q_4d = q[:, :, None]  # (B, Hq, 1, D)
    scale = q.shape[-1] ** -0.5

    def sdpa(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q_4d, k, v, scale=scale, enable_gqa=True)

    def gather_sdpa() -> torch.Tensor:
        k = gathered_bhld(k_cache, block_tables, ctx)
        return sdpa(k, gathered_bhld(v_cache, block_tables, ctx))

    k, v = gathered_bhld(k_cache, block_tables, ctx), gathered_bhld(v_cache, block_tables, ctx)
    err = rel_err(triton_out, sdpa(k, v)[:, :, 0])
    sdpa_ms = median_ms(functools.partial(sdpa, k, v), cuda)
    sdpa_graph_ms = graph_ms(functools.partial(sdpa, k, v)) if cuda else None
    del k, v  # the gathered copies; gather_sdpa makes its own
    return err, sdpa_ms, median_ms(gather_sdpa, cuda), sdpa_graph_ms
