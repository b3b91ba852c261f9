"""Decode attention bandwidth against the device's copy ceiling and against torch SDPA.

    python ops/bench/kernels.py --out results/decode.json     # CUDA: the full grid, bf16
    python ops/bench/kernels.py --tiny                        # CPU: Triton interpreter, fp32

For each (batch, context) the script checks the Triton decode kernel against `kernels.reference`,
then times (median) the kernel, SDPA on K/V already gathered into padded contiguous
``(B, H, L, D)`` tensors, and gather + SDPA. On CUDA the kernel and SDPA are timed again as
CUDA-graph replays, which leave out the host's launch time (``graph us``). Bandwidth counts the
bytes a decode must move: K and V of every context token once per KV head, plus q and out. The
ceiling is a device-to-device copy of a large buffer (bytes read + written over time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# This file is itself named kernels.py: put the repository first so `import kernels` finds the
# package, not this script's directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import write_report
from ops.bench.decode_timing import graph_ms, median_ms, rel_err, time_sdpa
from ops.bench.step_floor import copy_gbps

# Llama-3-8B attention: 32 query heads sharing 8 KV heads, head size 128, 16-token cache blocks.
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
BATCHES = (1, 8, 32, 128, 256)
CONTEXTS = (128, 1024, 4096, 16384, 32768)
TINY_BATCHES, TINY_CONTEXTS = (1, 3), (17, 300)  # 300: two splits at batch 1
COPY_BYTES = 1 << 30  # 1 GiB each way: far past the 50 MiB L2, so the copy streams from HBM
TINY_COPY_BYTES = 16 << 20
# The fp32 reference gathers K/V in fp32 (2x a bf16 cache): check only this many sequences.
CHECKED_SEQS = 4
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def fits(batch: int, ctx: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Cache + gathered copy + the gather's transient copy, with 20% headroom."""
    if device.type != "cuda":
        return True
    kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_SIZE * dtype.itemsize
    free, _ = torch.cuda.mem_get_info(device)
    return 3 * kv_bytes < 0.8 * free


DecodeArgs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, int]


def paged_inputs(batch: int, ctx: int, dtype: torch.dtype, device: torch.device) -> DecodeArgs:
    """``paged_decode_attention``'s arguments: random q and K/V, every sequence ``ctx`` long."""
    blocks_per_seq = -(-ctx // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_SIZE)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    # Pages scattered over the cache, as after a while of serving.
    perm = torch.randperm(num_blocks, device=device)
    block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_SIZE, dtype=dtype, device=device)
    return q, k_cache, v_cache, block_tables, seq_lens, HEAD_SIZE**-0.5, ctx


def reference_error(args: DecodeArgs, out: torch.Tensor) -> float:
    """Relative error of ``out`` against `kernels.reference` on the first ``CHECKED_SEQS``
    sequences; raises past the dtype's tolerance."""
    from kernels.reference import paged_decode_attention as ref_decode

    q, k_cache, v_cache, block_tables, seq_lens, scale, ctx = args
    n = min(q.shape[0], CHECKED_SEQS)
    ref = ref_decode(q[:n], k_cache, v_cache, block_tables[:n], seq_lens[:n], scale, ctx)
    err = rel_err(out[:n], ref)
    if not err < TOLERANCE[q.dtype]:
        raise AssertionError(f"batch {q.shape[0]} ctx {ctx}: rel err {err:.2e} vs reference")
    return err


def graph_columns(triton_graph_ms: float | None, sdpa_graph_ms: float | None) -> dict[str, float]:
    """The CUDA-graph replay columns; empty off CUDA."""
    if triton_graph_ms is None or sdpa_graph_ms is None:
        return {}
    return {
        "triton_graph_us": triton_graph_ms * 1e3,
        "sdpa_graph_us": sdpa_graph_ms * 1e3,
        "graph_speedup_vs_sdpa": sdpa_graph_ms / triton_graph_ms,
    }


def run_config(
    batch: int,
    ctx: int,
    dtype: torch.dtype,
    device: torch.device,
    ceiling_gbps: float,
    split: Split | None = None,
) -> dict[str, Any]:
    """One (batch, context) case; ``split`` as `parse_split` gives it (default: the kernel's
    own choice from the context, and SDPA beside it), else the kernel alone."""
    from kernels.triton_common import num_sms
    from kernels.triton_decode import (
        MIN_SPLIT_TOKENS,
        choose_num_splits,
        paged_decode_attention,
        split_plan,
    )

    cuda = device.type == "cuda"
    args = paged_inputs(batch, ctx, dtype, device)
    q, k_cache, v_cache, block_tables = args[:4]
    grid_len, forced, min_split = split or (ctx, None, MIN_SPLIT_TOKENS)
    out = torch.empty_like(q)

    def decode() -> torch.Tensor:
        return paged_decode_attention(
            *args[:6], grid_len, out=out, num_splits=forced, min_split_len=min_split
        )

    decode()
    err = reference_error(args, out)
    num_splits = forced or choose_num_splits(batch, NUM_KV_HEADS, grid_len, num_sms(device))
    triton_ms = median_ms(decode, cuda)
    triton_graph_ms = graph_ms(decode) if cuda else None
    nbytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_SIZE * dtype.itemsize + 2 * q.nbytes
    gbps = nbytes / triton_ms / 1e6
    result = {
        "batch": batch,
        "context": ctx,
        "num_splits": split_plan(grid_len, num_splits, min_split)[0],
        "grid_max_len": grid_len,
        "min_split_len": min_split,
        "bytes": nbytes,
        "triton_us": triton_ms * 1e3,
        "triton_gbps": gbps,
        "pct_of_copy": 100 * gbps / ceiling_gbps,
        "rel_err_vs_reference": err,
    }
    if triton_graph_ms is not None:
        result["triton_graph_us"] = triton_graph_ms * 1e3
    if split is not None:
        return result
    sdpa_err, sdpa_ms, gather_sdpa_ms, sdpa_graph_ms = time_sdpa(
        q, k_cache, v_cache, block_tables, ctx, out
    )
    return {
        **result,
        "sdpa_us": sdpa_ms * 1e3,
        "gather_sdpa_us": gather_sdpa_ms * 1e3,
        "speedup_vs_sdpa": sdpa_ms / triton_ms,
        "speedup_vs_gather_sdpa": gather_sdpa_ms / triton_ms,
        "rel_err_vs_sdpa": sdpa_err,
        **graph_columns(triton_graph_ms, sdpa_graph_ms),
    }


# A split variant: (the grid's max_seq_len, a forced split count or None, min_split_len).
Split = tuple[int, int | None, int]


def parse_split(text: str, grid_max_len: int) -> Split:
    """``auto:MIN`` (the kernel's split count, splits of at least MIN tokens) or ``N:MIN``."""
    count, _, min_split = text.partition(":")
    return grid_max_len, None if count == "auto" else int(count), int(min_split)


def print_table(results: dict[str, Any]) -> None:
    print(
        f"{results['device']}  {results['dtype']}  copy ceiling {results['copy_gbps']:.0f} GB/s  "
        f"(Hq {NUM_Q_HEADS}, Hkv {NUM_KV_HEADS}, D {HEAD_SIZE}, block {BLOCK_SIZE})"
    )
    head = (
        f"{'batch':>5} {'ctx':>6} {'split':>5} {'triton us':>10} {'GB/s':>7} {'%copy':>6} "
        f"{'sdpa us':>9} {'g+sdpa us':>10} {'x sdpa':>7} {'x g+sdpa':>8} {'rel err':>8} "
        f"{'graph us':>9} {'sdpa gr us':>10} {'x sdpa gr':>9}"
    )
    print(head)
    for r in results["configs"]:
        if r.get("skipped"):
            print(f"{r['batch']:>5} {r['context']:>6}  skipped: {r['skipped']}")
            continue
        if "sdpa_us" not in r:  # a split variant: the kernel alone (a graph's replay on CUDA)
            graph = f"graph {r['triton_graph_us']:.1f} us, " if "triton_graph_us" in r else ""
            print(
                f"{r['batch']:>5} {r['context']:>6} {r['num_splits']:>5} {r['triton_us']:>10.1f} "
                f"{r['triton_gbps']:>7.0f} {r['pct_of_copy']:>6.1f}  {graph}grid for "
                f"{r['grid_max_len']}, splits of >= {r['min_split_len']}"
            )
            continue
        print(
            f"{r['batch']:>5} {r['context']:>6} {r['num_splits']:>5} {r['triton_us']:>10.1f} "
            f"{r['triton_gbps']:>7.0f} {r['pct_of_copy']:>6.1f} {r['sdpa_us']:>9.1f} "
            f"{r['gather_sdpa_us']:>10.1f} {r['speedup_vs_sdpa']:>7.2f} "
            f"{r['speedup_vs_gather_sdpa']:>8.2f} {r['rel_err_vs_reference']:>8.1e} "
            + (
                f"{r['triton_graph_us']:>9.1f} {r['sdpa_graph_us']:>10.1f} "
                f"{r['graph_speedup_vs_sdpa']:>9.2f}"
                if "triton_graph_us" in r
                else f"{'-':>9} {'-':>10} {'-':>9}"
            )
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--tiny", action="store_true", help="tiny grid; on CPU via the interpreter")
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), help="default: bf16 on CUDA, fp32 on CPU"
    )
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    parser.add_argument("--batches", type=ints, help="e.g. 1,8,32 (default: the grid's)")
    parser.add_argument("--contexts", type=ints, help="e.g. 512,1024 (default: the grid's)")
    parser.add_argument(
        "--splits",
        help="split variants instead of the SDPA comparison, comma-separated, each auto:MIN "
        "or N:MIN (N splits, none under MIN tokens), e.g. 1:256,auto:128,auto:256",
    )
    parser.add_argument(
        "--grid-max-len",
        type=int,
        help="the max_seq_len the variants size their grid from (a CUDA graph passes "
        "max_model_len, e.g. 131072); default: the context",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        raise SystemExit("the full grid needs a CUDA device; use --tiny on CPU")
    if not cuda:
        # Must precede the first import of kernels.triton_* (the decorators read it).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = DTYPES[args.dtype] if args.dtype else torch.bfloat16 if cuda else torch.float32
    batches, contexts = (TINY_BATCHES, TINY_CONTEXTS) if args.tiny else (BATCHES, CONTEXTS)
    batches, contexts = args.batches or batches, args.contexts or contexts
    torch.manual_seed(0)
    ceiling = copy_gbps(device.type, TINY_COPY_BYTES if args.tiny else COPY_BYTES)
    configs = []
    for batch in batches:
        for ctx in contexts:
            if not fits(batch, ctx, dtype, device):
                configs.append({"batch": batch, "context": ctx, "skipped": "does not fit memory"})
                continue
            variants = args.splits.split(",") if args.splits else [None]
            for v in variants:
                split = parse_split(v, args.grid_max_len or ctx) if v else None
                configs.append(run_config(batch, ctx, dtype, device, ceiling, split))
                print(json.dumps(configs[-1]), flush=True)  # a killed run keeps what it measured
            if cuda:
                torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter)"
    results = {"device": name, "dtype": str(dtype), "copy_gbps": ceiling, "configs": configs}
    print_table(results)
    write_report(results, args.out)
    return results


if __name__ == "__main__":
    main()
