"""Compile every Triton kernel for a CUDA GPU on a machine without one.

    python -m kernels.compile_check            # sm_90 (Hopper), every cache dtype
    python -m kernels.compile_check --arch 80
    python -m kernels.compile_check --quant    # kernels/triton_quant.py's instead

The interpreter runs a kernel's Python and accepts code the compiler rejects: `load_kv_tile`
once returned a ``tl.dtype`` beside its tensors, which passed every interpreted test and failed
to compile on the first H200 run. This module runs each launcher on small CPU inputs with the
launch replaced: the arguments it would pass are turned into a Triton signature and compiled
ahead of time to PTX and a cubin for the target (Triton ships its own ptxas). Nothing runs.

It must run in a process where ``TRITON_INTERPRET`` is unset (the compiler needs real
``JITFunction``s), hence a module with a ``main`` that tests start as a subprocess.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

TRITON_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.int8: "i8",
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Keyword arguments of a launch that are compiler options, not kernel parameters.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


class CompileOnly:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **constexprs)`` compiles
    instead of launching, and records what it built."""

    def __init__(self, kernel: Any, target: Any, built: list[str]) -> None:
        self.kernel, self.target, self.built = kernel, target, built

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self.compile

    def compile(self, *args: Any, **kwargs: Any) -> None:
        import triton
        from triton.compiler import ASTSource

        options = {k: kwargs.pop(k) for k in LAUNCH_OPTIONS if k in kwargs}
        constexprs = kwargs
        names = list(self.kernel.arg_names)
        signature: dict[str, str] = {}
        for name, value in zip(names, args, strict=False):
            signature[name] = signature_type(value)
        for name in names[len(args) :]:
            signature[name] = "constexpr"
        source = ASTSource(fn=self.kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=self.target, options=options)
        if "cubin" not in compiled.asm:
            raise RuntimeError(f"{self.kernel.__name__}: no cubin for {self.target}")
        self.built.append(f"{self.kernel.__name__} {describe(signature, constexprs)}")


def signature_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def describe(signature: dict[str, str], constexprs: dict[str, Any]) -> str:
    pointers = [t for t in signature.values() if t.startswith("*")]
    dtype = signature.get("k_cache_ptr") or pointers[0]  # the cache's, else the first pointer's
    keys = ("HEAD_SIZE", "PAGE_SIZE", "GROUP", "DOT_PRECISION", "WIDTH", "HAS_RESIDUAL", "HALF")
    return f"{dtype} " + " ".join(f"{k}={constexprs[k]}" for k in keys if k in constexprs)


def compile_all(arch: int, dtypes: Sequence[torch.dtype] = tuple(DTYPES.values())) -> list[str]:
    """Every kernel, through its own launcher, for each cache dtype; returns what was built."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter's kernels cannot compile")
    from triton.backends.compiler import GPUTarget

    import kernels.triton_decode as decode
    import kernels.triton_kv_write as kv_write
    import kernels.triton_layer_ops as layer_ops
    import kernels.triton_prefill as prefill
    import kernels.triton_rotary as rotary

    target = GPUTarget("cuda", arch, 32)
    built: list[str] = []
    module: Any
    for module, name in (
        (decode, "_paged_decode_kernel"),
        (decode, "_merge_splits_kernel"),
        (prefill, "_paged_prefill_kernel"),
        (kv_write, "_write_kv_kernel"),
        (layer_ops, "_rms_norm_kernel"),
        (rotary, "_rotary_kernel"),
        (layer_ops, "_silu_and_mul_kernel"),
    ):
        setattr(module, name, CompileOnly(getattr(module, name), target, built))
        # CPU tensors stand in for CUDA ones: no device check, and the CUDA path's dot flags
        # (off CUDA, bf16 is widened to fp32 for the interpreter's sake).
        module.check_device = lambda kernel, *tensors: None
        if hasattr(module, "dot_flags"):
            module.dot_flags = functools.partial(cuda_dot_flags, module.dot_flags)
    for dtype in dtypes:
        launch_all(dtype, decode, prefill, kv_write)
        launch_layer_ops(dtype, layer_ops)
    return built


def compile_quant(arch: int, dtypes: Sequence[torch.dtype] = tuple(DTYPES.values())) -> list[str]:
    """The 8-bit-weight GEMM (kernels/triton_quant.py) through its launcher, per activation
    dtype and code format (int8, e4m3), at one row of each `TILES` class, with a bias at the
    largest."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter's kernels cannot compile")
    from triton.backends.compiler import GPUTarget

    import kernels.triton_quant

    quant: Any = kernels.triton_quant
    built: list[str] = []
    kernel = quant._w8_linear_kernel
    quant._w8_linear_kernel = CompileOnly(kernel, GPUTarget("cuda", arch, 32), built)
    quant.check_device = lambda kernel, *tensors: None
    quant.dot_flags = functools.partial(cuda_dot_flags, quant.dot_flags)
    # Llama-3.2-1B's MLP up projection (2048 -> 8192), 8-bit codes and per-channel scales.
    scale, bias = torch.ones(8192), torch.zeros(8192)
    rows = [limit for limit, _ in quant.TILES[:-1]] + [quant.WEIGHT_ONLY_MAX_ROWS]
    for code in quant.CODE_DTYPES:
        q = torch.zeros(8192, 2048, dtype=code)
        for dtype in dtypes:
            for m in rows:
                x = torch.zeros(m, 2048, dtype=dtype)
                quant.w8_linear(x, q, scale, bias if m == rows[-1] else None)
    return built


def cuda_dot_flags(
    dot_flags: Callable[[torch.dtype, torch.device], tuple[bool, str]],
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[bool, str]:
    return dot_flags(dtype, torch.device("cuda"))


def launch_all(dtype: torch.dtype, decode: Any, prefill: Any, kv_write: Any) -> None:
    # Llama-3-8B's attention (32 q heads on 8 KV heads, head size 128) in 16-token blocks.
    num_seqs, hq, hkv, d, block = 2, 32, 8, 128, 16
    k_cache = torch.zeros(8, hkv, block, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.zeros(num_seqs, 16, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), 200, dtype=torch.int32)
    q = torch.zeros(num_seqs, hq, d, dtype=dtype)
    out = torch.zeros_like(q)
    # Direct output, and partial outputs plus the merge kernel: a grid for 512 tokens (any
    # bound is valid) holds two splits of the 256-token floor.
    for splits in (1, 2):
        decode.paged_decode_attention(
            q, k_cache, v_cache, tables, seq_lens, 0.1, 512, out=out, num_splits=splits
        )
    q_prefill = torch.zeros(2 * 20, hq, d, dtype=dtype)
    starts = torch.tensor([0, 20, 40], dtype=torch.int32)
    prefill.paged_prefill_attention(
        q_prefill, k_cache, v_cache, tables, seq_lens, starts, 0.1, 20, out=q_prefill.clone()
    )
    kv = torch.zeros(3, hkv, d, dtype=torch.float32)  # an fp32 projection into any cache dtype
    kv_write.write_kv(kv, kv, k_cache, v_cache, torch.tensor([0, 5, 17]))


def launch_layer_ops(dtype: torch.dtype, layer_ops: Any) -> None:
    # Llama-3-8B's layer (hidden 4096, 32 q on 8 KV heads of 128, intermediate 14336), a
    # Qwen3-style q norm over strided heads of a fused QKV row (many rows per program), and
    # SmolLM2's rotary (9 q on 3 KV heads of 64: head counts that are not powers of two).
    tokens, hidden, hq, hkv, d = 3, 4096, 32, 8, 128
    x, residual = torch.zeros(tokens, hidden, dtype=dtype), torch.zeros(tokens, hidden, dtype=dtype)
    layer_ops.add_rms_norm_(x, residual, torch.ones(hidden, dtype=dtype), 1e-5)
    layer_ops.rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5)
    qkv = torch.zeros(tokens, (hq + 2 * hkv) * d, dtype=dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    layer_ops.rms_norm(q, torch.ones(d, dtype=dtype), 1e-6)
    cos = torch.zeros(tokens, 1, d // 2)
    layer_ops.rotary_(q, k, cos, cos)
    small = torch.zeros(tokens, 15, 64, dtype=dtype)
    layer_ops.rotary_(small[:, :9], small[:, 9:12], cos[..., :32], cos[..., :32])
    layer_ops.silu_and_mul(torch.zeros(tokens, 2 * 14336, dtype=dtype))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability: 90 = H100/H200")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma list of bf16, fp16, fp32")
    p.add_argument("--quant", action="store_true", help="the quantized-linear kernels instead")
    args = p.parse_args(argv)
    compile_kernels = compile_quant if args.quant else compile_all
    built = compile_kernels(args.arch, [DTYPES[d] for d in args.dtypes.split(",")])
    for line in built:
        print(line)
    print(f"{len(built)} kernels compiled for sm_{args.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
