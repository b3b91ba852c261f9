"""The sampling flags of ``paternoster generate`` and ``submit``: ``SamplingSpec``'s fields, with
its defaults except where the command line deliberately differs (``CLI_SAMPLING_DEFAULTS``), and
the structure flags (``--json-schema FILE | --regex R | --choice A --choice B | --grammar FILE``)
that become its ``structure`` constraint (``producer.structured``)."""

from __future__ import annotations

import argparse
from typing import Any

from producer.protocol import SamplingSpec
from producer.structured import read_grammar_file, read_schema_file, structure_of

# The command line samples greedily and longer than the library (``SamplingSpec``: 16 tokens
# at temperature 1.0): a person typing a prompt wants a readable answer that a second run
# repeats. These are the only defaults the flags do not take from ``SamplingSpec``; the flags'
# --help and the README say so.
CLI_SAMPLING_DEFAULTS: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0}
# SamplingSpec's float fields the command line passes as they are, each flag its name
# (``--presence-penalty``); their ranges are the spec's, checked when the job is built.
_FLOAT_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty")


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
    for name in _FLOAT_FIELDS:
        g.add_argument(f"--{name.replace('_', '-')}", type=float, default=_default(name))
    g.add_argument(
        "--logit-bias",
        action="append",
        type=_bias,
        default=[],
        metavar="ID=BIAS",
        help="add BIAS (-100..100) to token ID's logit (repeatable)",
    )
    _add_structure_arguments(parser)


def _add_structure_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("structure (at most one: the output must match it)")
    one = g.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="FILE", help="JSON that validates against FILE")
    one.add_argument("--regex", metavar="R", help="text that matches R in full")
    one.add_argument(
        "--choice", action="append", metavar="TEXT", help="exactly one of the choices (repeat)"
    )
    one.add_argument("--grammar", metavar="FILE", help="a sentence of FILE's EBNF grammar")


def _bias(text: str) -> tuple[int, float]:
    token, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS, e.g. 50256=-100, not {text}") from None


def structure_field(args: argparse.Namespace) -> dict[str, Any] | None:
    """The structure flags as ``SamplingSpec.structure`` (files read here: InvalidJob when one
    cannot be read)."""
    schema = None if args.json_schema is None else read_schema_file(args.json_schema)
    grammar = None if args.grammar is None else read_grammar_file(args.grammar)
    return structure_of(json_schema=schema, regex=args.regex, choice=args.choice, grammar=grammar)


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
        **{name: getattr(args, name) for name in _FLOAT_FIELDS},
        "logit_bias": dict(args.logit_bias) or None,
        "structure": structure_field(args),
    }
