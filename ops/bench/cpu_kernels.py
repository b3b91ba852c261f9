"""Our C++ CPU kernels against the torch path each replaces, at SmolLM2-135M's shapes.

    python ops/bench/cpu_kernels.py                       # decode (32 rows) and prefill (512)
    python ops/bench/cpu_kernels.py --tokens 8 --contexts 2000 --out results/cpu_kernels.json

For each kernel the script checks it against torch's result, then times both (median of
``--repeats`` rounds) in one process, one after the other:

- ``decode_attention``: `CpuAttentionBackend.decode` against `TorchAttentionBackend.decode`
  (gather + batched matmuls), ``--tokens`` sequences of each ``--contexts`` length, over
  ``--layers`` distinct caches so that K/V stream from DRAM as in a real step; reported with
  the K/V bytes it reads per second, for each ``--cache-dtypes`` (float32, bfloat16: the
  engine's ``--kv-cache-dtype``; queries are float32 either way).
- ``write_kv``, ``rotary``, ``silu_and_mul``, ``add_rms_norm``: per call, ``--tokens`` rows.

Speed lives here, not in tests: these machines are noisy, so read the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
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
from worker.attention import AttentionMetadata, KVCache
from worker.attention.cpu_backend import CpuAttentionBackend
from worker.attention.torch_backend import TorchAttentionBackend
from worker.engine.kv_pool import DTYPES
from worker.models.layers import rotate

# SmolLM2-135M: 9 query heads over 3 KV heads of 64, hidden 576, MLP 1536, 16-token blocks.
Q_HEADS, KV_HEADS, HEAD, HIDDEN, MLP, BLOCK = 9, 3, 64, 576, 1536, 16


def median_us(fn: Callable[[], object], repeats: int, calls: int) -> float:
    def batch() -> None:  # ``calls`` back to back: one call is too short for the clock
        for _ in range(calls):
            fn()

    return median_seconds(batch, repeats) / calls * 1e6


def pair(
    ours: Callable[[], object], torch_path: Callable[[], object], args: Any
) -> dict[str, float]:
    ours_us = median_us(ours, args.repeats, args.calls)
    torch_us = median_us(torch_path, args.repeats, args.calls)
    return {"ours_us": ours_us, "torch_us": torch_us, "speedup": torch_us / ours_us}


def decode_attention(
    ops: Any, tokens: int, context: int, dtype: torch.dtype, args: Any
) -> dict[str, float]:
    from paged_cases import make_paged_kv

    gen = torch.Generator().manual_seed(context)
    layers = [
        make_paged_kv([context] * tokens, KV_HEADS, HEAD, BLOCK, dtype, gen)
        for _ in range(args.layers)
    ]
    q = torch.randn(tokens, Q_HEADS, HEAD, generator=gen)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        block_tables=layers[0].block_tables,
        seq_lens=layers[0].seq_lens,
        query_start_loc=torch.arange(tokens + 1, dtype=torch.int32),
        num_decodes=tokens,
        max_seq_len=context,
        max_query_len=1,
        seq_lens_host=(context,) * tokens,
    )
    ours_backend, torch_backend = CpuAttentionBackend(ops), TorchAttentionBackend()
    out_ours, out_torch = torch.empty_like(q), torch.empty_like(q)

    # Each layer has its own blocks; the metadata is built once, outside the timed rounds.
    steps = [(kv, dataclasses.replace(meta, block_tables=kv.block_tables)) for kv in layers]

    def run(backend: Any, out: torch.Tensor) -> Callable[[], None]:
        def step() -> None:
            for kv, meta_l in steps:
                backend.decode(q, KVCache(kv.k_cache, kv.v_cache), meta_l, HEAD**-0.5, out)

        return step

    run(ours_backend, out_ours)()
    run(torch_backend, out_torch)()
    torch.testing.assert_close(out_ours, out_torch, rtol=1e-4, atol=1e-4)
    result = pair(run(ours_backend, out_ours), run(torch_backend, out_torch), args)
    for key in ("ours_us", "torch_us"):
        result[key] /= args.layers
    kv_bytes = tokens * context * KV_HEADS * HEAD * dtype.itemsize * 2
    result["ours_kv_gb_s"] = kv_bytes / (result["ours_us"] * 1e-6) / 1e9
    return result


def layer_ops(ops: Any, tokens: int, args: Any) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(tokens)
    results = {}
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD, generator=gen)
    qk = qkv[:, : (Q_HEADS + KV_HEADS) * HEAD].view(tokens, -1, HEAD)
    freqs = torch.rand(tokens, HEAD // 2, generator=gen) * 100
    cos_sin = (freqs.cos()[:, None, :], freqs.sin()[:, None, :])
    expected = rotate(qk, cos_sin)
    scratch = qk.clone()
    ops.rotary_(scratch, *cos_sin)
    torch.testing.assert_close(scratch, expected, rtol=1e-5, atol=1e-5)
    results["rotary"] = pair(lambda: ops.rotary_(qk, *cos_sin), lambda: rotate(qk, cos_sin), args)

    gate_up = torch.randn(tokens, 2 * MLP, generator=gen)
    gate, up = gate_up.split(MLP, dim=-1)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), F.silu(gate) * up)
    results["silu_and_mul"] = pair(
        lambda: ops.silu_and_mul(gate_up), lambda: F.silu(gate) * up, args
    )

    x, residual = torch.randn(2, tokens, HIDDEN, generator=gen)
    weight = torch.randn(HIDDEN, generator=gen)
    results["add_rms_norm"] = pair(
        lambda: ops.add_rms_norm_(x, residual, weight, 1e-5),
        lambda: F.rms_norm(x + residual, (HIDDEN,), weight, 1e-5),
        args,
    )

    num_blocks = -(-tokens // BLOCK) * 4
    caches = [torch.zeros(num_blocks, KV_HEADS, BLOCK, HEAD) for _ in range(4)]
    slots = torch.randperm(num_blocks * BLOCK, generator=gen)[:tokens]
    key = qkv[:, Q_HEADS * HEAD : (Q_HEADS + KV_HEADS) * HEAD].view(tokens, KV_HEADS, HEAD)
    value = qkv[:, (Q_HEADS + KV_HEADS) * HEAD :].view(tokens, KV_HEADS, HEAD)
    ops.write_kv(key, value, caches[0], caches[1], slots)
    reference.write_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    results["write_kv"] = pair(
        lambda: ops.write_kv(key, value, caches[0], caches[1], slots),
        lambda: reference.write_kv(key, value, caches[2], caches[3], slots),
        args,
    )
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[32, 512], help="rows per call")
    p.add_argument("--contexts", type=int, nargs="+", default=[500], help="decode context lengths")
    p.add_argument("--layers", type=int, default=6, help="distinct KV caches per decode round")
    p.add_argument(
        "--cache-dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=list(DTYPES),
        help="decode attention's K/V cache dtypes",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="calls per timed round")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    ops = cpu_ops.load()
    if ops is None:
        raise SystemExit(f"our CPU kernels did not build: {cpu_ops.unavailable_reason()}")
    report: dict[str, Any] = {"threads": args.threads, "decode_attention": {}, "layer_ops": {}}
    with torch.inference_mode():
        for tokens in args.tokens:
            for context, name in itertools.product(args.contexts, args.cache_dtypes):
                r = decode_attention(ops, tokens, context, DTYPES[name], args)
                report["decode_attention"][f"{tokens}x{context}/{name}"] = r
                print(
                    f"decode_attention {tokens:4d} seqs x {context:5d} {name:8s}:"
                    f" ours {r['ours_us']:8.1f}"
                    f" us/layer ({r['ours_kv_gb_s']:.1f} GB/s K/V), torch {r['torch_us']:8.1f},"
                    f" torch / ours {r['speedup']:.2f}"
                )
            for name, r in layer_ops(ops, tokens, args).items():
                report["layer_ops"][f"{name}@{tokens}"] = r
                print(
                    f"{name:16s} {tokens:4d} rows: ours {r['ours_us']:8.1f} us, torch"
                    f" {r['torch_us']:8.1f} us, torch / ours {r['speedup']:.2f}"
                )
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
