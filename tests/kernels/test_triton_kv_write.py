"""`kernels.triton_kv_write.write_kv` against `kernels.reference.write_kv`."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DEVICE, DTYPES, dtype_id, on_device

from kernels import reference
from kernels.triton_common import is_interpreted
from kernels.triton_kv_write import _write_kv_kernel, write_kv


def test_interpreter_is_active() -> None:
    # conftest.py must win the race against the first import of the kernels; on a GPU
    # (PATERNOSTER_TEST_DEVICE=cuda) they must run compiled instead.
    assert is_interpreted(_write_kv_kernel) == (DEVICE.type == "cpu")


def _poisoned_caches(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(on_device(torch.full(shape, float("nan"), dtype=dtype)) for _ in range(2))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(("num_kv_heads", "head_size", "block_size"), [(2, 64, 4), (3, 80, 16)])
def test_write_kv_matches_reference(
    dtype: torch.dtype, num_kv_heads: int, head_size: int, block_size: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    num_blocks, num_tokens = 7, 19
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    # Scattered, unique slots; the rest of the (NaN) cache must stay untouched.
    slots = on_device(torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens])
    key = on_device(torch.randn(num_tokens, num_kv_heads, head_size, generator=gen).to(dtype))
    value = on_device(torch.randn(num_tokens, num_kv_heads, head_size, generator=gen).to(dtype))
    k_ref, v_ref = _poisoned_caches(shape, dtype)
    k_out, v_out = _poisoned_caches(shape, dtype)
    reference.write_kv(key, value, k_ref, v_ref, slots)
    write_kv(key, value, k_out, v_out, slots)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_out, v_ref, rtol=0, atol=0, equal_nan=True)


def test_write_kv_strided_views_and_cast() -> None:
    # K and V as slices of one fused fp32 projection, written into a bf16 cache.
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_kv_heads, head_size, block_size = 5, 2, 96, 8
    fused = on_device(torch.randn(num_tokens, 4 * num_kv_heads, head_size, generator=gen))
    key, value = fused[:, 1 : 1 + num_kv_heads], fused[:, 5 : 5 + num_kv_heads]
    assert not key.is_contiguous()
    shape = (3, num_kv_heads, block_size, head_size)
    slots = on_device(torch.tensor([23, 0, 9, 8, 17]))
    k_ref, v_ref = _poisoned_caches(shape, torch.bfloat16)
    k_out, v_out = _poisoned_caches(shape, torch.bfloat16)
    reference.write_kv(key, value, k_ref, v_ref, slots)
    write_kv(key, value, k_out, v_out, slots)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_out, v_ref, rtol=0, atol=0, equal_nan=True)


def test_write_kv_skips_negative_slots() -> None:
    k_cache, v_cache = on_device(torch.zeros(2, 1, 4, 64)), on_device(torch.zeros(2, 1, 4, 64))
    key = on_device(torch.ones(3, 1, 64))
    write_kv(key, 2 * key, k_cache, v_cache, on_device(torch.tensor([5, -1, 2])))
    assert k_cache.view(8, 64).sum(1).tolist() == [0, 0, 64, 0, 0, 64, 0, 0]
    assert v_cache.view(8, 64).sum(1).tolist() == [0, 0, 128, 0, 0, 128, 0, 0]


def test_write_kv_no_tokens() -> None:
    cache = on_device(torch.zeros(2, 1, 4, 64))
    empty = on_device(torch.zeros(0, 1, 64))
    write_kv(empty, empty, cache, cache.clone(), on_device(torch.zeros(0, dtype=torch.int64)))
    assert not cache.any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": torch.zeros(3, 2, 32)}, r"key must be \(num_tokens, 2, 64\)"),
        ({"value": torch.zeros(4, 2, 64)}, "value has 4 tokens, key has 3"),
        ({"k_cache": torch.zeros(2, 4, 2, 64).transpose(0, 1)}, "must be contiguous"),
        ({"v_cache": torch.zeros(4, 2, 2, 64, dtype=torch.float16)}, "share one dtype"),
        ({"slot_mapping": torch.zeros(3)}, "slot_mapping must be int32 or int64"),
        ({"slot_mapping": torch.zeros(4, dtype=torch.int64)}, "slot_mapping must be 1-D with 3"),
        ({"key": torch.zeros(3, 64, 2).transpose(1, 2)}, "unit stride on head_size"),
    ],
)
def test_write_kv_rejects_bad_arguments(change: dict[str, torch.Tensor], message: str) -> None:
    args = {
        "key": torch.zeros(3, 2, 64),
        "value": torch.zeros(3, 2, 64),
        "k_cache": torch.zeros(4, 2, 2, 64),
        "v_cache": torch.zeros(4, 2, 2, 64),
        "slot_mapping": torch.zeros(3, dtype=torch.int64),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        write_kv(**args)


def test_write_kv_needs_cuda_or_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernels.triton_common.is_interpreted", lambda kernel: False)
    cache = torch.zeros(2, 1, 4, 64)
    key = torch.zeros(1, 1, 64)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        write_kv(key, key, cache, cache.clone(), torch.zeros(1, dtype=torch.int64))
