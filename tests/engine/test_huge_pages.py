"""The KV pool's host memory: zeroed, alive as long as its tensor, advised for huge pages."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path
from typing import Any

import pytest
import torch

from worker.attention.torch_backend import TorchAttentionBackend
from worker.engine import huge_pages
from worker.engine.config import CacheConfig
from worker.engine.kv_pool import make_kv_caches
from worker.models.loader import load_model

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line.strip() else ""
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_zeros_are_zero_writable_and_outlive_their_mapping_object(dtype: torch.dtype) -> None:
    t = huge_pages.zeros((5, 3, 16, 64), dtype)
    assert t.shape == (5, 3, 16, 64) and t.dtype == dtype and t.is_contiguous()
    assert not t.any()
    gc.collect()  # only the tensor refers to the mapping now
    t[4, 2, 15] = 1.5
    assert float(t.sum()) == 1.5 * 64


@pytest.mark.skipif(not THP.exists(), reason="no transparent huge pages in this kernel")
def test_kv_caches_on_the_cpu_are_advised_for_huge_pages(tiny_model_dir: Path) -> None:
    model: Any = load_model(tiny_model_dir, torch.float32, torch.device("cpu"))
    backend = TorchAttentionBackend()
    caches = make_kv_caches(CacheConfig(num_blocks=64), model, torch.device("cpu"), backend)
    assert len(caches) == model.config.num_layers
    for cache in caches:
        for t in cache:
            assert "hg" in _vm_flags(t.data_ptr())  # MADV_HUGEPAGE on the tensor's mapping
            assert not t.any()
    assert caches[0].k_cache.data_ptr() != caches[0].v_cache.data_ptr()


def test_without_madvise_it_falls_back_to_torch_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refusing:
        """An anonymous mapping whose madvise fails, as on a kernel without THP."""

        closed = False

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def madvise(self, advice: int) -> None:
            raise OSError(22, "Invalid argument")

        def close(self) -> None:
            Refusing.closed = True

    monkeypatch.setattr(mmap, "mmap", Refusing)
    t = huge_pages.zeros((2, 3), torch.float32)
    assert Refusing.closed and torch.equal(t, torch.zeros(2, 3))
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    assert torch.equal(huge_pages.zeros((4,), torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16))
