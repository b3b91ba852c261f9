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

from gateway.cli import add_gateway_command
from gateway.webhooks.cli import add_webhooks_command
from producer.cli import add_producer_commands
from producer.sampling_args import add_sampling_arguments, sampling_fields
from worker.engine.config import EngineConfig
from worker.service.config import WorkerConfig

# `paternoster worker`'s status after a device fault (sysexits' EX_SOFTWARE): any non-zero
# status restarts it under compose's `restart: unless-stopped` or systemd's `on-failure`.
DEVICE_FAULT_EXIT = 70


def sampling_params(args: argparse.Namespace) -> Any:
    from worker.engine.sampling_params import SamplingParams

    return SamplingParams(**sampling_fields(args))


def cmd_generate(args: argparse.Namespace) -> int:
    from worker.engine.llm_engine import LLMEngine

    params = sampling_params(args)
    engine = LLMEngine(EngineConfig.from_args(args))
    prompts: list[Any] = (
        [[{"role": "user", "content": p}] for p in args.prompts] if args.chat else args.prompts
    )
    start = time.perf_counter()
    if len(prompts) == 1 and not args.json and params.n == 1:
        return _stream_one(engine, prompts[0], params, start)
    completions = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    total = 0
    for prompt, completion in zip(args.prompts, completions, strict=True):
        for c in completion.choices or (completion,):  # n > 1: one record per choice
            total += len(c.token_ids)
            if args.json:
                print(json.dumps(_generate_record(prompt, c, args.logprobs), ensure_ascii=False))
            else:
                choice = f" choice {c.index}" if params.n > 1 else ""
                print(f"--- {prompt!r}{choice} [{c.finish_reason}]\n{c.text}\n")
    print(f"{total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tok/s)", file=sys.stderr)
    return 0


def _generate_record(prompt: str, c: Any, logprobs: int | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "prompt": prompt,
        "choice": c.index,
        "text": c.text,
        "token_ids": list(c.token_ids),
        "finish_reason": c.finish_reason,
        "num_prompt_tokens": c.num_prompt_tokens,
        "num_output_tokens": len(c.token_ids),
        "num_cached_tokens": c.num_cached_tokens,
    }
    if logprobs is not None:
        record["logprobs"] = [
            {
                "token_id": lp.token_id,
                "logprob": lp.logprob,
                "rank": lp.rank,
                "top": [list(t) for t in lp.top],
            }
            for lp in c.logprobs
        ]
    return record


def _stream_one(engine: Any, prompt: Any, params: Any, start: float) -> int:
    engine.add_prompt("cli-0", prompt, params)
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


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """``paternoster worker``'s flags: the ``WorkerConfig`` ones (declared with it), then the
    connection, logging and metrics ones, which fill no config."""
    g = WorkerConfig.add_arguments(parser)
    g.add_argument("--redis-url", default=None, help="default: REDIS_URL, else an embedded Redis")
    g.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="JSON log lines on stderr at this level and above (default info: one per job event)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics and /health on this port (default: off)",
    )
    g.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address /metrics and /health listen on (default loopback; 0.0.0.0 for a "
        "scraper in another container)",
    )


def cmd_worker(args: argparse.Namespace) -> int:
    import signal

    from producer.connection import resolve_redis_url
    from worker import envs
    from worker.engine.llm_engine import LLMEngine
    from worker.service.build import build_worker
    from worker.service.logs import configure_logging

    configure_logging(args.log_level)
    url, embedded = resolve_redis_url(args.redis_url)
    config = WorkerConfig.from_args(args)
    metrics = None
    if args.metrics_port is not None:
        from worker.service.metrics import WorkerMetrics

        metrics = WorkerMetrics(config.name)
        server = metrics.serve(port=args.metrics_port, host=args.metrics_host)
        print(f"metrics: http://{args.metrics_host}:{server.port}/metrics", file=sys.stderr)
    engine = LLMEngine(EngineConfig.from_args(args))
    if config.chaos and (delay_s := envs.chaos_step_delay_s()):
        _slow_down(engine, delay_s)
    worker = build_worker(engine, url, config, metrics)
    if embedded is not None:
        print(f"embedded Redis: REDIS_URL={url}", file=sys.stderr)

    def on_signal(signum: int, _frame: Any) -> None:
        if worker.stop_event.is_set():  # a second signal: stop now
            raise SystemExit(128 + signum)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run()
    # Non-zero after a device fault (its jobs handed back): a supervisor restarts the process.
    return DEVICE_FAULT_EXIT if worker.device_fault is not None else 0


def _slow_down(engine: Any, delay_s: float) -> None:
    """Chaos runs only: every engine step takes ``delay_s`` longer, so a tiny model decodes
    slowly enough for a test to kill the worker mid-job."""
    step = engine.step

    def slow_step() -> Any:
        time.sleep(delay_s)
        return step()

    engine.step = slow_step


def cmd_demo(args: argparse.Namespace) -> int:
    from producer.connection import resolve_redis_url
    from worker.engine.llm_engine import LLMEngine
    from worker.service.demo import run_demo
    from worker.service.logs import configure_logging

    configure_logging("warning")  # the demo's own output is the point; job logs would bury it
    url, embedded = resolve_redis_url(args.redis_url)
    where = "an embedded redis-server" if embedded is not None else "REDIS_URL's"  # no secrets
    print(f"demo: using {where}; loading the model...", file=sys.stderr, flush=True)
    try:
        return run_demo(LLMEngine(EngineConfig.from_args(args)), url)
    finally:
        if embedded is not None:
            embedded.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paternoster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate offline: all prompts in one continuous batch")
    gen.add_argument("prompts", nargs="+", metavar="PROMPT")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt, in order")
    add_sampling_arguments(gen)
    EngineConfig.add_arguments(gen)
    gen.set_defaults(func=cmd_generate)
    work = sub.add_parser("worker", help="serve jobs from Redis until SIGTERM / SIGINT")
    add_worker_arguments(work)
    EngineConfig.add_arguments(work)
    work.set_defaults(func=cmd_worker)
    demo = sub.add_parser("demo", help="a worker and mixed jobs in one process, streamed live")
    demo.add_argument("--redis-url", default=None, help="default: REDIS_URL, else embedded")
    EngineConfig.add_arguments(demo)
    demo.set_defaults(func=cmd_demo)
    add_producer_commands(sub)
    add_gateway_command(sub)
    add_webhooks_command(sub)
    # Listed for --help only: main() hands `bench` and every flag after it to load.py's parser.
    bench = sub.add_parser("bench", add_help=False, help="open-loop load benchmark of a worker")
    bench.add_argument("argv", nargs=argparse.REMAINDER)
    bench.set_defaults(func=lambda a: cmd_bench(a.argv))
    return parser


def cmd_bench(argv: Sequence[str]) -> int:
    """``ops.bench.load``'s main, in a source checkout only. ``ops/`` holds the checkout's
    tools and is not installed, so the checkout's root joins ``sys.path`` and ``ops.bench.load``
    is imported as the package module it is."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "ops" / "bench" / "load.py").is_file():
        print(f"paternoster bench: error: needs a source checkout ({root})", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = importlib.import_module("ops.bench.load")
    try:
        module.main(list(argv))
    except (ValueError, FileNotFoundError) as err:  # a bad mix file, model path or flag value
        print(f"paternoster bench: error: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # load.py parses its own flags (argparse would refuse them here)
        return cmd_bench(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as err:
        # Bad input (a sampling value, a model path, a too-long prompt): one clear line, exit 2.
        print(f"paternoster {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
