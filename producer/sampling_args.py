"""The sampling flags of ``paternoster generate`` and ``submit``: ``SamplingSpec``'s fields, with
its defaults except where the command line deliberately differs (``CLI_SAMPLING_DEFAULTS``)."""

from __future__ import annotations

import argparse
from typing import Any

from producer.protocol import SamplingSpec

# The command line samples greedily and longer than the library (``SamplingSpec``: 16 tokens
# at temperature 1.0): a person typing a prompt wants a readable answer that a second run
# repeats. These are the only defaults the flags do not take from ``SamplingSpec``; the flags'
# --help and the README say so.
CLI_SAMPLING_DEFAULTS: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0}


def _default(name: str) -> Any:
    """The flag's default: the CLI's own where it deliberately differs, else SamplingSpec's."""
    if name in CLI_SAMPLING_DEFAULTS:
        return CLI_SAMPLING_DEFAULTS[name]
    return SamplingSpec.model_fields[name].default


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's sampling flags, shared by ``generate`` and ``submit``."""
    spec = SamplingSpec.model_fields
    g = parser.add_argument_group("sampling")
    g.add_argument(
        "--max-tokens",
        type=int,
        default=_default("max_tokens"),
        help="new tokens at most (default %(default)s here; SamplingSpec's, which "
        f"Producer.submit and the gateway's /v1/jobs use: {spec['max_tokens'].default})",
    )
    g.add_argument("--min-tokens", type=int, default=_default("min_tokens"))
    g.add_argument(
        "--temperature",
        type=float,
        default=_default("temperature"),
        help="0 is greedy (default %(default)s here; SamplingSpec's, which Producer.submit "
        f"and the gateway's /v1/jobs use: {spec['temperature'].default})",
    )
    g.add_argument("--top-k", type=int, default=_default("top_k"), help="0 disables")
    g.add_argument("--top-p", type=float, default=_default("top_p"))
    g.add_argument("--min-p", type=float, default=_default("min_p"))
    g.add_argument(
        "--seed",
        type=int,
        default=_default("seed"),
        help="per-request seed: same seed, same text",
    )
    g.add_argument("--ignore-eos", action="store_true", help="EOS does not stop generation")
    # append needs a list: [] is SamplingSpec's empty tuple.
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stop-token-id", action="append", type=int, default=[], dest="stop_token_ids")
    g.add_argument(
        "--logprobs", type=int, default=_default("logprobs"), help="top-N logprobs per token"
    )
    g.add_argument(
        "-n", "--n", type=int, default=_default("n"), help="independent choices per prompt"
    )


def sampling_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags as the keyword arguments of ``SamplingSpec`` / ``SamplingParams``."""
    return {
        "max_tokens": args.max_tokens,
        "min_tokens": args.min_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "seed": args.seed,
        "ignore_eos": args.ignore_eos,
        "stop": tuple(args.stop),
        "stop_token_ids": tuple(args.stop_token_ids),
        "logprobs": args.logprobs,
        "n": args.n,
    }
