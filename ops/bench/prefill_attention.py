"""The reference prefill attention (the torch backend's prefill, and the cpu backend's over a bf16
cache on AMX before `kernels/cpu_prefill_amx.cpp`) against the same chunk under an explicit
causal mask, and our C++ kernels (the cpu backend's prefill), at SmolLM2-135M's heads.

    python ops/bench/prefill_attention.py --threads 2
    python ops/bench/prefill_attention.py --chunks 512x512 1024x512 --dtypes float32

A chunk is ``CONTEXTxQUERIES``: a fresh prompt when the two are equal, else the queries are the
last positions of that context (a chunk after cached or earlier-computed tokens). Both paths
gather the chunk's K/V from a paged cache and run SDPA in the compute dtype; "masked" always
passes the explicit (queries x context) mask, as `kernels.reference.paged_prefill_attention`
did for every chunk before it gave fresh prompts SDPA's own causal mask. The outputs are
checked equal, bit for bit, then each path is timed (median of ``--repeats`` rounds), one after
the other in one process. Our kernels are timed too, each after its largest per-token relative
error against float32 SDPA over the same cache is recorded (`KERNELS`): in float32
`cpu_prefill_attention.cpp` (AVX-512 builds); in bfloat16 `cpu_prefill_bf16.cpp` (AMX tiles or
AVX-512 BF16 dot products) and the float32 kernel over the same bf16 cache. bfloat16 runs over a
bf16 cache, as the cpu backend's do (before 2026-12-06's AMX kernel, a float32 cache converted).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "kernels"))

import torch
import torch.nn.functional as F

from kernels import cpu_ops, reference
from ops.bench.common import median_seconds, write_report
from worker.engine.kv_pool import DTYPES

Q_HEADS, KV_HEADS, HEAD, BLOCK = 9, 3, 64, 16
# Our kernels for each compute dtype, by the name their times go under: (binding, extra args).
# float32: float32 arithmetic (AVX-512). bfloat16, over a bf16 cache: bf16 products as the cpu
# backend calls them (AMX tiles where the CPU has them, else AVX-512 BF16 dot products), the dot
# products alone, and the float32 kernel widening the cache (AMD's path before 2026-12-06).
KERNELS: dict[torch.dtype, dict[str, tuple[str, tuple[bool, ...]]]] = {
    torch.float32: {"kernel": ("paged_prefill_attention", ())},
    torch.bfloat16: {
        "kernel": ("paged_prefill_attention_bf16", (True,)),
        "dots": ("paged_prefill_attention_bf16", (False,)),
        "widened": ("paged_prefill_attention", ()),
    },
}


def chunk_case(
    ctx: int, q_len: int, cache_dtype: torch.dtype
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A one-sequence paged cache of ``ctx`` tokens, ``q_len`` queries and their start offsets."""
    from paged_cases import make_paged_kv, query_start_loc

    gen = torch.Generator().manual_seed(ctx * 7 + q_len)
    kv = make_paged_kv([ctx], KV_HEADS, HEAD, BLOCK, cache_dtype, gen)
    q = torch.randn(q_len, Q_HEADS, HEAD, generator=gen)
    return kv, q, query_start_loc([q_len])


def masked(kv: Any, q: torch.Tensor, ctx: int, dtype: torch.dtype) -> torch.Tensor:
    """The chunk with the explicit mask: the reference's path for every chunk before."""
    q_len = q.shape[0]
    k = reference.gather_kv(kv.k_cache, kv.block_tables, ctx)[:, :, :ctx]
    v = reference.gather_kv(kv.v_cache, kv.block_tables, ctx)[:, :, :ctx]
    allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - q_len, ctx)[:, None]
    out = F.scaled_dot_product_attention(
        q.to(dtype).transpose(0, 1)[None],
        k.to(dtype),
        v.to(dtype),
        attn_mask=allowed,
        scale=HEAD**-0.5,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).to(q.dtype)


def ours_kernel(
    binding: Callable[..., bool], q: torch.Tensor, args: tuple[Any, ...]
) -> Callable[[], torch.Tensor] | None:
    """A call of one of our kernels into one output buffer; None where it declines."""
    out = torch.empty_like(q)
    if not binding(out, q, *args):
        return None

    def kernel() -> torch.Tensor:
        binding(out, q, *args)
        return out

    return kernel


def measure(
    ctx: int, q_len: int, dtype: torch.dtype, repeats: int, arch: str | None = None
) -> dict[str, float]:
    from paged_cases import rel_err

    # bf16 runs over a bf16 cache, as the cpu backend's bf16 path does; others over float32.
    cache_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    kv, q, starts = chunk_case(ctx, q_len, cache_dtype)

    def ours() -> torch.Tensor:
        return reference.paged_prefill_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, HEAD**-0.5, dtype
        )

    def before() -> torch.Tensor:
        return masked(kv, q, ctx, dtype)

    if not torch.equal(ours(), before()):
        raise SystemExit(f"{ctx}x{q_len} {dtype}: the two paths differ")
    timed: dict[str, Callable[[], object]] = {"reference_ms": ours, "masked_ms": before}
    ops = cpu_ops.load(arch) if dtype in KERNELS else None
    errors: dict[str, float] = {}
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, HEAD**-0.5)
    exact = reference.paged_prefill_attention(q, *args)  # float32 over the same cache
    for name, (binding, extra) in KERNELS.get(dtype, {}).items():
        kernel = ours_kernel(getattr(ops, binding), q, (*args, *extra)) if ops else None
        if kernel is not None:  # None: it declined (no such instructions in this build)
            errors[f"{name}_rel_err"] = rel_err(kernel(), exact)
            timed[f"{name}_ms"] = kernel
    result = {key: median_seconds(fn, repeats) * 1e3 for key, fn in timed.items()}
    result["masked_over_reference"] = result["masked_ms"] / result["reference_ms"]
    if "kernel_ms" in result:
        result["reference_over_kernel"] = result["reference_ms"] / result["kernel_ms"]
    return {**result, **errors}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=9, help="timed calls per path (median)")
    p.add_argument(
        "--chunks",
        nargs="+",
        default=["512x512", "1024x1024", "1024x512", "1536x512", "1914x378", "128x128"],
    )
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    p.add_argument("--arch", help="-march of the kernel's build, e.g. haswell (default: native)")
    p.add_argument("--out", type=Path, help="write the report as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report: dict[str, Any] = {"threads": args.threads, "arch": args.arch, "chunks": {}}
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        for chunk in args.chunks:
            ctx, q_len = map(int, chunk.split("x"))
            for dtype_name in args.dtypes:
                r = measure(ctx, q_len, DTYPES[dtype_name], args.repeats, args.arch)
                report["chunks"][f"{chunk}/{dtype_name}"] = r
                kernel = "".join(
                    f", {name} {r[f'{name}_ms']:8.3f} ms (rel err {r[f'{name}_rel_err']:.1e})"
                    for name in KERNELS.get(DTYPES[dtype_name], {})
                    if f"{name}_ms" in r
                )
                print(
                    f"{chunk:>10s} {dtype_name:8s}: reference {r['reference_ms']:8.3f} ms,"
                    f" masked {r['masked_ms']:8.3f} ms, masked / reference"
                    f" {r['masked_over_reference']:.2f}{kernel}"
                )
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
