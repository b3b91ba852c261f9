"""``paternoster``: the one command line of the project, one subcommand per job.

Subcommands import torch lazily, so ``paternoster --help`` stays fast and the producer-side
subcommands added later work in an install without the worker extra.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from gateway.cli import add_gateway_command
from producer.cli import add_producer_commands, add_sampling_arguments, sampling_fields


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="HF directory or .gguf (default: bundled SmolLM2)")
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument(
        "--attention-backend", default="auto", choices=["auto", "torch", "cpu", "triton"]
    )
    g.add_argument(
        "--linear-backend",
        default="auto",
        choices=["auto", "torch", "onednn"],
        help="CPU projections: auto packs weights for oneDNN where the dtype allows and runs "
        "steps of up to 8 rows through our C++ kernel (a second copy of the weights); onednn: "
        "oneDNN alone",
    )
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from memory)")
    g.add_argument("--kv-cache-bytes", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    g = parser.add_argument_group("priority and fairness")
    g.add_argument(
        "--no-priority-preemption",
        action="store_true",
        help="urgent jobs wait for a free slot instead of preempting less urgent ones",
    )
    g.add_argument("--max-priority-preemptions", type=int, default=3, help="per job, then immune")
    g.add_argument(
        "--tenant-weight",
        action="append",
        default=[],
        metavar="TENANT=WEIGHT",
        help="fair-share weight of a tenant (default 1); repeat for several",
    )
    g.add_argument("--max-running-per-tenant", type=int, default=None)


def engine_config(args: argparse.Namespace) -> Any:
    from worker import envs
    from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig

    return EngineConfig(
        model=args.model or envs.default_model(),
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        linear_backend=args.linear_backend,
        num_threads=args.threads,
        cache=CacheConfig(
            block_size=args.block_size, num_blocks=args.num_blocks, memory_bytes=args.kv_cache_bytes
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            preempt_for_priority=not args.no_priority_preemption,
            max_priority_preemptions=args.max_priority_preemptions,
            tenant_weights=_tenant_weights(args.tenant_weight),
            max_running_per_tenant=args.max_running_per_tenant,
        ),
    )


def _tenant_weights(items: list[str]) -> dict[str, float]:
    weights = {}
    for item in items:
        tenant, sep, weight = item.partition("=")
        if not sep or not tenant:
            raise ValueError(f"--tenant-weight takes TENANT=WEIGHT, got {item!r}")
        weights[tenant] = float(weight)
    return weights


def sampling_params(args: argparse.Namespace) -> Any:
    from worker.engine.sampling_params import SamplingParams

    return SamplingParams(**sampling_fields(args))


def cmd_generate(args: argparse.Namespace) -> int:
    from worker.engine.llm_engine import LLMEngine

    params = sampling_params(args)
    engine = LLMEngine(engine_config(args))
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


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("job service")
    g.add_argument("--redis-url", default=None, help="default: REDIS_URL, else an embedded Redis")
    g.add_argument(
        "--prefix", default=None, help="key prefix (default: PATERNOSTER_PREFIX or paternoster)"
    )
    g.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="JSON log lines on stderr at this level and above (default info: one per job event)",
    )


def cmd_worker(args: argparse.Namespace) -> int:
    import signal

    from producer.connection import key_prefix_from_env, resolve_redis_url
    from worker.engine.llm_engine import LLMEngine
    from worker.service.config import WorkerConfig, default_worker_name
    from worker.service.logs import configure_logging
    from worker.service.worker import JobWorker

    configure_logging(args.log_level)
    url, embedded = resolve_redis_url(args.redis_url)
    config = WorkerConfig(
        name=args.name or default_worker_name(),
        prefix=args.prefix or key_prefix_from_env(),
        max_jobs=args.max_jobs,
        stream_interval=args.stream_interval,
        result_ttl_s=args.result_ttl_s,
        isolate_tenant_caches=args.isolate_tenant_caches,
        urgent_reserve=args.urgent_reserve,
        max_deliveries=args.max_deliveries,
        grace_s=args.grace_s,
        chaos=os.environ.get("PATERNOSTER_CHAOS") == "1",
    )
    metrics = None
    if args.metrics_port is not None:
        from worker.service.metrics import WorkerMetrics

        metrics = WorkerMetrics(config.name)
        server = metrics.serve(port=args.metrics_port, host=args.metrics_host)
        print(f"metrics: http://{args.metrics_host}:{server.port}/metrics", file=sys.stderr)
    engine = LLMEngine(engine_config(args))
    if config.chaos and (delay_s := float(os.environ.get("PATERNOSTER_CHAOS_STEP_DELAY_S", 0))):
        _slow_down(engine, delay_s)
    worker = JobWorker(engine, url, config, metrics)
    if embedded is not None:
        print(f"embedded Redis: REDIS_URL={url}", file=sys.stderr)

    def on_signal(signum: int, _frame: Any) -> None:
        if worker.stop_event.is_set():  # a second signal: stop now
            raise SystemExit(128 + signum)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run()
    return 0


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
        return run_demo(LLMEngine(engine_config(args)), url)
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
    add_engine_arguments(gen)
    gen.set_defaults(func=cmd_generate)
    work = sub.add_parser("worker", help="serve jobs from Redis until SIGTERM / SIGINT")
    work.add_argument("--name", default=None, help="consumer name (default: host-pid)")
    work.add_argument("--max-jobs", type=int, default=None, help="jobs held at once")
    work.add_argument("--stream-interval", type=int, default=1, help="tokens per token event")
    work.add_argument("--result-ttl-s", type=int, default=24 * 3600)
    work.add_argument(
        "--share-tenant-caches",
        dest="isolate_tenant_caches",
        action="store_false",
        help="let tenants share cached prompt blocks (default: each tenant's are its own, so "
        "no tenant can hit or time another's prompts)",
    )
    work.add_argument(
        "--urgent-reserve",
        type=int,
        default=None,
        help="job slots only interactive jobs may take (default: an eighth, at least 1)",
    )
    work.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds for running jobs to finish before the rest are handed back",
    )
    work.add_argument(
        "--max-deliveries",
        type=int,
        default=3,
        help="starts of a job (its worker dying each time) before it goes to the dead letters",
    )
    work.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics and /health on this port (default: off)",
    )
    work.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address /metrics and /health listen on (default loopback; 0.0.0.0 for a "
        "scraper in another container)",
    )
    add_service_arguments(work)
    add_engine_arguments(work)
    work.set_defaults(func=cmd_worker)
    demo = sub.add_parser("demo", help="a worker and mixed jobs in one process, streamed live")
    demo.add_argument("--redis-url", default=None, help="default: REDIS_URL, else embedded")
    add_engine_arguments(demo)
    demo.set_defaults(func=cmd_demo)
    add_producer_commands(sub)
    add_gateway_command(sub)
    # Listed for --help only: main() hands `bench` and every flag after it to load.py's parser.
    bench = sub.add_parser("bench", add_help=False, help="open-loop load benchmark of a worker")
    bench.add_argument("argv", nargs=argparse.REMAINDER)
    bench.set_defaults(func=lambda a: cmd_bench(a.argv))
    return parser


def cmd_bench(argv: Sequence[str]) -> int:
    """``ops/bench/load.py``'s main: in a source checkout only (ops/ is not installed)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "ops" / "bench" / "load.py"
    spec = importlib.util.spec_from_file_location("paternoster_bench_load", path)
    if not path.exists() or spec is None or spec.loader is None:
        print(f"paternoster bench: error: needs a source checkout ({path})", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
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
