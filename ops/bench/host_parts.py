"""Two per-token host parts on their own: the detokenizer's cost a token, and the sampler's cost
a step for rows that sample (issue 19's seventh pass, BENCHMARKS.md).

    python ops/bench/host_parts.py detokenize [--tokens 4000] [--repeats 7]
    python ops/bench/host_parts.py sampler [--rows 64 256] [--repeats 7]
    python ops/bench/host_parts.py batch --requests 64 --max-tokens 64 --temperature 0.7

``detokenize`` streams ``--tokens`` tokens of this repository's README through
`IncrementalDetokenizer` one at a time, with and without two stop strings, on the byte table
(`byte_tokens`) and on the windowed path (the same tokenizer with its table withheld): CPU us a
token, median of ``--repeats``. ``sampler`` times `Sampler` on ``(rows, 49152)`` random logits
(x 3) at temperature 1.0, 0.7 seeded and 0.7 with top-p 0.9: wall ms a call, median of the
repeats after the first. ``batch`` runs the bundled SmolLM2 (its default quantization) on
``--requests`` requests of 32 random prompt tokens with ``ignore_eos`` in one continuous batch:
output tok/s and the sampler's share of the wall time. Compare trees by running this same
script with ``PYTHONPATH`` set to each (alternated: the machine is shared).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import median_seconds
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.sampler import Sampler, SamplingRequest
from worker.engine.sampling_params import SamplingParams
from worker.engine.token_decoder import decoder_for

README = Path(__file__).resolve().parents[2] / "README.md"
VOCAB = 49152


def detokenize(args: argparse.Namespace, tokenizer: Any) -> dict[str, float]:
    ids = tokenizer.encode(README.read_text()[:40_000], add_special_tokens=False)[: args.tokens]
    decoder = decoder_for(tokenizer, True)
    table = decoder.token_bytes

    def per_token_us(stops: tuple[str, ...]) -> float:
        detok = IncrementalDetokenizer(tokenizer, ids[:5], SamplingParams(stop=stops))
        start = time.thread_time_ns()
        for token_id in ids:
            detok.add_tokens((token_id,))
        detok.finish()
        assert detok.text == tokenizer.decode(ids) or stops
        return (time.thread_time_ns() - start) / len(ids) / 1e3

    runs: dict[str, list[float]] = {}
    try:
        for _ in range(args.repeats):
            for path, tokens in (("bytes", table), ("window", None)):
                if path == "bytes" and tokens is None:
                    continue  # a tokenizer without a byte table: the window only
                decoder.token_bytes = tokens
                for stops in ((), ("zzzq", "\n\n\n\n")):
                    key = f"{path}{'_stops' if stops else ''}_us_per_token"
                    runs.setdefault(key, []).append(per_token_us(stops))
    finally:
        decoder.token_bytes = table
    return {key: round(statistics.median(v), 3) for key, v in runs.items()}


def sampler(args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    cases = {
        "t1.0": {"temperature": 1.0},
        "t0.7_seeded": {"temperature": 0.7, "seed": 3},
        "t0.7_top_p_0.9": {"temperature": 0.7, "top_p": 0.9},
    }
    for rows in args.rows:
        logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
        sample = Sampler(eos_token_ids=[2])
        for name, fields in cases.items():
            params = SamplingParams(**fields)  # type: ignore[arg-type]
            requests = [SamplingRequest(params, 5, None) for _ in range(rows)]
            call = functools.partial(sample, logits, requests)
            # The first of ``--repeats`` calls warms the allocator; the median is of the rest.
            seconds = median_seconds(call, max(1, args.repeats - 1))
            out[f"{name}_{rows}_rows_ms"] = round(1e3 * seconds, 2)
    return out


def batch(args: argparse.Namespace) -> dict[str, float]:
    from ops.bench.engine import normal_token_ids
    from worker.engine import sampler as sampler_module
    from worker.engine.config import EngineConfig, SchedulerConfig
    from worker.engine.llm_engine import LLMEngine

    config = EngineConfig(
        model=args.model,
        num_threads=args.threads,
        scheduler=SchedulerConfig(max_num_seqs=args.requests),
    )
    engine = LLMEngine(config)
    spent = [0.0]
    original = sampler_module.Sampler.sample_ids

    def timed(
        self: Sampler, logits: torch.Tensor, requests: Sequence[SamplingRequest]
    ) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return original(self, logits, requests)
        finally:
            spent[0] += time.perf_counter() - start

    rng = random.Random(0)
    vocab = normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True
    )
    for i in range(args.requests):
        engine.add_prompt(f"r{i}", params=params, prompt_token_ids=rng.choices(vocab, k=32))
    sampler_module.Sampler.sample_ids = timed  # type: ignore[method-assign]
    try:
        start, tokens = time.perf_counter(), 0
        while engine.has_unfinished():
            tokens += sum(len(o.new_token_ids) for o in engine.step())
        wall_s = time.perf_counter() - start
    finally:
        sampler_module.Sampler.sample_ids = original  # type: ignore[method-assign]
    return {
        "output_tokens": tokens,
        "wall_s": round(wall_s, 2),
        "output_tok_per_s": round(tokens / wall_s, 1),
        "sampler_share": round(spent[0] / wall_s, 3),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("detokenize", "sampler", "batch"))
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--model", default=None, help="batch: an HF dir; default the bundled SmolLM2"
    )
    parser.add_argument("--tokenizer", default=None, help="dir with a tokenizer; default SmolLM2's")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.part == "detokenize":
        from worker.models.loader import load_tokenizer, resolve_model_dir

        result = detokenize(args, load_tokenizer(Path(args.tokenizer or resolve_model_dir(None))))
    else:
        result = sampler(args) if args.part == "sampler" else batch(args)
    report = {"part": args.part, "config": vars(args), **result}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
