"""Zeroed host tensors on transparent huge pages, for the paged KV cache on the CPU.

Decode attention reads each sequence's blocks where they lie: one head's slice of a block is
4 KB (16 tokens x 64 values in fp32), and consecutive blocks of a sequence are anywhere in a
2 GiB pool. On 4 KB pages every slice is a page of its own, so nearly every one costs a TLB
miss and a page walk before its first line arrives. Linux backs memory with 2 MB pages only
where asked (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` on our machines), and
torch's allocator does not ask. Our kernel over the same blocks, 30 layers'
caches in SmolLM2's shape, 4 KB pages / huge pages, in one process, alternated (AMX Xeon;
`python ops/bench/kv_pages.py --threads 2`): 14 sequences x 400 tokens 18.6 / 15.9 ms, 8 x 1,000
27.3 / 22.7, 40 x 300 41.4 / 35.5; at 1 thread 6.6-6.8 / 7.6-8.1 GB/s of K/V
(ops/bench/results/huge-pages-1206/). Larger blocks (32-128 tokens) did not help on either.
"""

from __future__ import annotations

import logging
import mmap
from math import prod

import torch

log = logging.getLogger(__name__)


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor whose memory the kernel may back with huge pages.

    An anonymous mapping advised ``MADV_HUGEPAGE`` before any page of it is touched, then
    written once, so every page is resident from the start, as ``torch.zeros``' were (it
    writes its zeros): a pool that cannot fit fails here, and no step pays a page fault. The
    cost moves to start-up: 2 GiB took 1.0-3.3 s on 2 MB pages on our AMX Xeon (a VM, where
    a first touch is slow), against 0.4-0.5 s for ``torch.zeros``. The tensor keeps the
    mapping alive. Where the platform cannot advise (not Linux, or THP compiled out), plain
    ``torch.zeros``."""
    nbytes = prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes == 0 or advice is None:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(advice)
    except OSError as e:  # EINVAL where the kernel has no THP
        log.info("huge pages unavailable for the KV cache (%s); 4 KB pages", e)
        region.close()
        return torch.zeros(shape, dtype=dtype)
    tensor = torch.frombuffer(region, dtype=dtype).view(shape)
    # The mapping reads as zeros already; writing them faults every page in now, as 2 MB pages.
    return tensor.zero_()
