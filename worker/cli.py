"""``paternoster``: the one command line of the project, one subcommand per job.

Subcommands import torch lazily, so ``paternoster --help`` stays fast and the producer-side
subcommands added later work in an install without the worker extra.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=64, help="new tokens at most (default 64)")
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default here)")
    g.add_argument("--top-k", type=int, default=0, help="0 disables")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None, help="per-request seed: same seed, same text")
    g.add_argument("--ignore-eos", action="store_true", help="EOS does not stop generation")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stop-token-id", action="append", type=int, default=[], dest="stop_token_ids")
    g.add_argument("--logprobs", type=int, default=None, help="top-N logprobs per token")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="HF directory or .gguf (default: bundled SmolLM2)")
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from memory)")
    g.add_argument("--kv-cache-bytes", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")


def engine_config(args: argparse.Namespace) -> Any:
    from worker import envs
    from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig

    return EngineConfig(
        model=args.model or envs.default_model(),
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        num_threads=args.threads,
        cache=CacheConfig(
            block_size=args.block_size, num_blocks=args.num_blocks, memory_bytes=args.kv_cache_bytes
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
        ),
    )


def sampling_params(args: argparse.Namespace) -> Any:
    from worker.engine.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        stop=tuple(args.stop),
        stop_token_ids=tuple(args.stop_token_ids),
        logprobs=args.logprobs,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from worker.engine.llm_engine import LLMEngine

    params = sampling_params(args)
    engine = LLMEngine(engine_config(args))
    prompts: list[Any] = (
        [[{"role": "user", "content": p}] for p in args.prompts] if args.chat else args.prompts
    )
    start = time.perf_counter()
    if len(prompts) == 1 and not args.json:
        return _stream_one(engine, prompts[0], params, start)
    completions = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for prompt, c in zip(args.prompts, completions, strict=True):
        if args.json:
            record: dict[str, Any] = {
                "prompt": prompt,
                "text": c.text,
                "token_ids": list(c.token_ids),
                "finish_reason": c.finish_reason,
                "num_prompt_tokens": c.num_prompt_tokens,
                "num_output_tokens": len(c.token_ids),
            }
            if args.logprobs is not None:
                record["logprobs"] = [
                    {
                        "token_id": lp.token_id,
                        "logprob": lp.logprob,
                        "rank": lp.rank,
                        "top": [list(t) for t in lp.top],
                    }
                    for lp in c.logprobs
                ]
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(f"--- {prompt!r} [{c.finish_reason}]\n{c.text}\n")
    total = sum(len(c.token_ids) for c in completions)
    print(f"{total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tok/s)", file=sys.stderr)
    return 0


def _stream_one(engine: Any, prompt: Any, params: Any, start: float) -> int:
    engine.add_request("cli-0", prompt, params)
    num_tokens = 0
    reason = None
    while engine.has_unfinished():
        for out in engine.step():
            sys.stdout.write(out.text_delta)
            sys.stdout.flush()
            num_tokens += len(out.new_token_ids)
            reason = out.finish_reason if out.finished else reason
    elapsed = time.perf_counter() - start
    print()
    print(f"[{reason}] {num_tokens} tokens in {elapsed:.2f} s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paternoster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate offline: all prompts in one continuous batch")
    gen.add_argument("prompts", nargs="+", metavar="PROMPT")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt, in order")
    add_sampling_arguments(gen)
    add_engine_arguments(gen)
    gen.set_defaults(func=cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as err:
        # Bad input (a sampling value, a model path, a too-long prompt): one clear line, exit 2.
        print(f"paternoster {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
