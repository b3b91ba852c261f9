"""Argument checks and launch flags shared by the Triton attention launchers.

The launchers stay thin: every check here is host-side metadata (shape, dtype, stride, device), so
none of them synchronises with the device.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
# BLOCK_D is the head size padded to a power of two; past 256 the K and V tiles of the attention
# kernels no longer fit shared memory at the tile sizes they use.
MAX_HEAD_SIZE = 256


def is_interpreted(kernel: object) -> bool:
    """True when ``kernel`` was decorated while ``TRITON_INTERPRET=1`` (runs on CPU tensors)."""
    return not isinstance(kernel, JITFunction)


def check_device(kernel: object, *tensors: torch.Tensor) -> None:
    """All tensors on one device, and that device is CUDA unless the kernel is interpreted."""
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device; got {device} and {t.device}")
    if device.type != "cuda" and not is_interpreted(kernel):
        raise ValueError(
            f"Triton kernels need CUDA tensors, got {device}; to run them on CPU set "
            "TRITON_INTERPRET=1 before kernels.triton_* is first imported"
        )


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both caches ``(num_blocks, num_kv_heads, block_size, head_size)``, contiguous, one dtype."""
    if k_cache.dim() != 4:
        raise ValueError(
            "k_cache must be (num_blocks, num_kv_heads, block_size, head_size), "
            f"got shape {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}"
        )
    if k_cache.dtype not in FLOAT_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"k_cache and v_cache must share one dtype of {FLOAT_DTYPES}; "
            f"got {k_cache.dtype} and {v_cache.dtype}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (the layout in kernels.reference)")
    if k_cache.shape[3] > MAX_HEAD_SIZE:
        raise ValueError(f"head_size {k_cache.shape[3]} > {MAX_HEAD_SIZE} is not supported")


def check_query(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    """``q`` ``(rows, num_q_heads, head_size)`` in the cache dtype, unit stride on ``head_size``."""
    if q.dim() != 3:
        raise ValueError(f"q must be (tokens, num_q_heads, head_size), got {tuple(q.shape)}")
    num_kv_heads, head_size = k_cache.shape[1], k_cache.shape[3]
    if q.shape[2] != head_size:
        raise ValueError(f"q head_size {q.shape[2]} != cache head_size {head_size}")
    if q.shape[1] % num_kv_heads:
        raise ValueError(
            f"num_q_heads {q.shape[1]} is not a multiple of num_kv_heads {num_kv_heads}"
        )
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} != cache dtype {k_cache.dtype}")
    if q.stride(2) != 1:
        raise ValueError(f"q must have unit stride on head_size, got strides {q.stride()}")


def check_index(t: torch.Tensor, name: str, length: int, ndim: int = 1) -> None:
    """An int32/int64 index tensor with ``length`` rows and unit stride on its last dim."""
    if t.dim() != ndim or t.shape[0] != length:
        raise ValueError(f"{name} must be {ndim}-D with {length} rows, got {tuple(t.shape)}")
    if t.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride on its last dim, got {t.stride()}")


def output_for(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` checked against ``q``, or a fresh ``torch.empty_like(q)``."""
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(
            f"out must match q: got {tuple(out.shape)} {out.dtype} {out.device}, "
            f"expected {tuple(q.shape)} {q.dtype} {q.device}"
        )
    if out.stride(2) != 1:
        raise ValueError(f"out must have unit stride on head_size, got strides {out.stride()}")
    return out


def dot_flags(dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """``(DOT_FP32, DOT_PRECISION)`` constexprs for the attention kernels' ``tl.dot`` calls.

    - fp32 inputs would default to TF32 on NVIDIA (10-bit mantissa, ~1e-3 relative error); "ieee"
      keeps fp32 attention at reference accuracy. fp32 is a test/debug dtype, so its speed matters
      little. For fp16/bf16 inputs the precision argument is ignored.
    - The Triton 3.9 interpreter stores bf16 as raw uint16 and its ``tl.dot`` multiplies those bit
      patterns as integers (relative error ~1e9 in a 16x16 check), so under the interpreter bf16
      operands are upcast to fp32 before each dot. Values are identical, only the dot is wider.
    """
    upcast = dtype == torch.bfloat16 and device.type != "cuda"
    return upcast, "ieee" if dtype == torch.float32 else "tf32"


def head_block(head_size: int) -> int:
    """The head dim padded to a power of two (80 and 96 -> 128), at least 16 for ``tl.dot``."""
    return max(16, triton.next_power_of_2(head_size))


def num_stages(block_d: int, dtype: torch.dtype) -> int:
    """Software-pipeline depth for 64-row K/V tiles of ``block_d`` elements.

    Two stages of K and V hold 4 x 64 x row bytes of shared memory: 64 KiB at 256-byte rows
    (16-bit x 128), but 128 KiB at 512-byte rows (fp32 x 128, 16-bit x 256), which with the Q tile
    and layout-conversion scratch nears or passes an A100's 164 KiB. Wide rows get one stage.
    """
    return 2 if block_d * dtype.itemsize <= 256 else 1


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors to fill; a small stand-in off CUDA (interpreter runs)."""
    if device.type != "cuda":
        return 4
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@triton.jit
def load_kv_tile(
    k_cache_ptr,
    v_cache_ptr,
    table,
    pos,
    n_mask,
    d_mask,
    offs_d,
    kv_head,
    stride_c_page,
    stride_c_tok,
    stride_c_head,
    PAGE_SIZE: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """K and V ``(N, D)`` of one KV head at positions ``pos``.

    A per-token page lookup, so a tile may span pages of any size (4..32 tokens tested). Shared by
    the decode and prefill kernels so both read the paged layout the same way.
    """
    page = tl.load(table + pos // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
    kv_offs = page * stride_c_page + (pos % PAGE_SIZE) * stride_c_tok + kv_head * stride_c_head
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_offs[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_offs[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    # Only tensors may leave a compiled helper: returning the cache's tl.dtype too ran under the
    # interpreter but failed to compile on CUDA (Triton 3.6, H200). Callers read the dtype off
    # the cache pointer instead.
    return k, v
