"""CUDA graphs of the decoder for decode-only steps, one per padded batch size.

On an H200 a decode step of Llama-3.2-1B's shape took 16.7 ms at batch 64 where reading the
weights once takes 0.5 ms (BENCHMARKS.md): the GPU waited for the host to launch each layer's
kernels. A graph replays all of a step's launches in one call. Graphs are captured at the sizes
of `graph_batch_sizes`; a decode step pads to the next one (`DeviceInputs`), and steps with
prefill chunks run eagerly: their shapes vary with every chunk.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import Any

import structlog
import torch

log = structlog.get_logger("paternoster.engine")

# The size steps of vLLM, SGLang and nano-vllm: 1, 2, 4, 8, then every 8. A step pads to the next
# size, so at most 7 padding rows (of >= 16): their weights are read anyway, their arithmetic is
# what a padded row costs.
SMALL_SIZES = (1, 2, 4, 8)
SIZE_STEP = 8
MAX_SIZE = 512


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Sizes to capture: 1, 2, 4, 8, then every 8 up to ``min(2 x max_num_seqs, 512)``, cut
    after the first that holds ``max_num_seqs`` rows. The others would never run: a decode step
    has at most max_num_seqs rows (vLLM's 2x room is for speculative tokens, which we lack),
    and each costs capture time and graph memory."""
    top = min(2 * max_num_seqs, MAX_SIZE)
    sizes = [s for s in SMALL_SIZES if s <= top] + list(range(16, top + 1, SIZE_STEP))
    fits = bisect.bisect_left(sizes, max_num_seqs)
    return tuple(sizes[: fits + 1])


def size_for(sizes: tuple[int, ...], num_seqs: int) -> int | None:
    """The smallest of ``sizes`` (ascending) holding ``num_seqs`` rows; None if none does."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


Forward = Callable[[int], torch.Tensor]  # size -> hidden states (size, hidden) of the decoder


class DecodeGraphs:
    """Captured decode steps by batch size, in one memory pool; replay returns hidden states."""

    def __init__(self, sizes: tuple[int, ...], device: torch.device) -> None:
        self.sizes = tuple(sorted(sizes))
        self.device = device
        self.generation: int | None = None  # of the input buffers the graphs read
        self._pool: Any = None  # one memory pool for all sizes (torch.cuda.graph_pool_handle)
        self._replays: dict[int, Callable[[], torch.Tensor]] = {}

    def ready(self, generation: int) -> bool:
        """Captured, and over the input buffers of ``generation`` (not since reallocated)."""
        return bool(self._replays) and self.generation == generation

    def capture(self, forward: Forward, setup: Callable[[int], None], generation: int) -> None:
        """Capture ``forward(size)`` at every size, after ``setup(size)`` fills its inputs."""
        self._replays.clear()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        # Largest first: the smaller graphs then fit in the memory the largest took from the
        # shared pool instead of growing it. Each graph's intermediates are dead once it returns,
        # so graphs of one pool may share memory: only one replays at a time.
        for size in reversed(self.sizes):
            setup(size)
            self._replays[size] = self._capture_one(size, forward)
        used_mib = 0.0
        if cuda:
            torch.cuda.synchronize(self.device)
            used_mib = (free_before - torch.cuda.mem_get_info(self.device)[0]) / 2**20
        self.generation = generation
        log.info(
            "cuda_graphs_captured",
            sizes=len(self.sizes),
            largest=self.sizes[-1],
            seconds=round(time.perf_counter() - start, 2),
            memory_mib=round(used_mib, 1),
        )

    def _capture_one(self, size: int, forward: Forward) -> Callable[[], torch.Tensor]:
        """Warm up, capture; the replay. Overridden by the CPU tests to run ``forward`` again
        over the same buffers and frozen metadata, which is what a replay does."""
        # Outside the graph first: Triton compiles its kernels, cuBLAS picks its own.
        forward(size)
        torch.cuda.synchronize(self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = forward(size)

        def replay() -> torch.Tensor:
            graph.replay()
            return out  # overwritten by the next replay of any size: use it before that

        return replay

    def replay(self, size: int) -> torch.Tensor:
        """The hidden states ``(size, hidden)`` of the step staged at ``size``."""
        return self._replays[size]()
