"""The reference prefill attention (the torch backend's prefill, and the cpu backend's over a bf16
cache on AMX) against the same chunk under an explicit causal mask, and our C++ kernel (the cpu
backend's prefill elsewhere), at SmolLM2-135M's heads.

    python ops/bench/prefill_attention.py --threads 2
    python ops/bench/prefill_attention.py --chunks 512x512 1024x512 --dtypes float32

A chunk is ``CONTEXTxQUERIES``: a fresh prompt when the two are equal, else the queries are the
last positions of that context (a chunk after cached or earlier-computed tokens). Both paths
gather the chunk's K/V from a paged cache and run SDPA in the compute dtype; "masked" always
passes the explicit (queries x context) mask, as `kernels.reference.paged_prefill_attention`
did for every chunk before it gave fresh prompts SDPA's own causal mask. The outputs are
checked equal, bit for bit, then each path is timed (median of ``--repeats`` rounds), one after
the other in one process. In float32 the kernel (`kernels/cpu_prefill_attention.cpp`) is timed
too, after its largest per-token relative error against the reference is recorded.
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


def chunk_case(ctx: int, q_len: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A one-sequence paged cache of ``ctx`` tokens, ``q_len`` queries and their start offsets."""
    from paged_cases import make_paged_kv, query_start_loc

    gen = torch.Generator().manual_seed(ctx * 7 + q_len)
    kv = make_paged_kv([ctx], KV_HEADS, HEAD, BLOCK, torch.float32, gen)
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


def measure(
    ctx: int, q_len: int, dtype: torch.dtype, repeats: int, arch: str | None = None
) -> dict[str, float]:
    from paged_cases import rel_err

    kv, q, starts = chunk_case(ctx, q_len)

    def ours() -> torch.Tensor:
        return reference.paged_prefill_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, HEAD**-0.5, dtype
        )

    def before() -> torch.Tensor:
        return masked(kv, q, ctx, dtype)

    if not torch.equal(ours(), before()):
        raise SystemExit(f"{ctx}x{q_len} {dtype}: the two paths differ")
    timed: dict[str, Callable[[], object]] = {"reference_ms": ours, "masked_ms": before}
    ops = cpu_ops.load(arch) if dtype == torch.float32 else None
    errors: dict[str, float] = {}
    if ops is not None:
        out = torch.empty_like(q)

        def kernel() -> torch.Tensor:
            args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, starts, HEAD**-0.5)
            ops.paged_prefill_attention(out, q, *args)
            return out

        errors["kernel_rel_err"] = rel_err(kernel(), ours())
        timed["kernel_ms"] = kernel
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
            for name in args.dtypes:
                r = measure(ctx, q_len, DTYPES[name], args.repeats, args.arch)
                report["chunks"][f"{chunk}/{name}"] = r
                kernel = (
                    f", kernel {r['kernel_ms']:8.3f} ms (rel err {r['kernel_rel_err']:.1e})"
                    if "kernel_ms" in r
                    else ""
                )
                print(
                    f"{chunk:>10s} {name:8s}: reference {r['reference_ms']:8.3f} ms,"
                    f" masked {r['masked_ms']:8.3f} ms, masked / reference"
                    f" {r['masked_over_reference']:.2f}{kernel}"
                )
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
