"""Host cost per decode step of the whole worker: the engine, the service loop and the publisher.

    REDIS_URL=redis://127.0.0.1:6379/0 python ops/bench/worker_host.py --batches 64 256 \
        --steps 30 --out ops/bench/results/worker_host.json

`host_overhead.py` times `LLMEngine.step` alone. A worker does more for every token: the model
loop turns each output into Redis commands (`JobWorker._on_outputs`: a token event, progress,
the end of a job) and its publisher thread packs and sends them, one pipelined transaction a
step. The publisher runs in the same process, so on a GPU its Python holds the same GIL the
loop needs to schedule and launch the next step: per step, the device waits for the sum.

Here a `JobWorker` (`build_worker`, as ``paternoster worker`` builds it) serves ``B`` jobs on
the random ``host-overhead`` model of `host_overhead.py` (hidden 64, 16 layers, the real 49k
vocabulary: the layers' arithmetic is negligible), submitted all at once by a client process
(`job_client.py`) that follows every result stream. Only steps in which all ``B`` jobs decode
are kept, after ``--warmup`` of them. Per step, in CPU ms of the thread each part runs on:

- ``engine host``: the loop thread's `LLMEngine.step` less its forward and sampling (the
  engine's own scheduling, input preparation and output processing, as `host_overhead.py`);
- ``service loop``: the rest of `JobWorker.step` on that thread (outputs to commands, reports);
- ``publisher``: the publisher thread's CPU time over the step (it sends the step before);
- ``worker host``: the sum of the three, what one GIL serialises.

Redis's own CPU per step (``INFO cpu``, over each batch's whole run) is reported beside them;
it runs on this machine here, on its own elsewhere.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from ops.bench.common import environment, write_report
from ops.bench.engine import normal_token_ids
from ops.bench.host_overhead import decode_batch_engine
from ops.bench.job_plane import serve_jobs
from ops.bench.random_model import write_random_model
from ops.bench.step_timer import StepTimer, instrumented
from producer.connection import resolve_redis_url
from worker.models.loader import resolve_model_dir
from worker.service.build import build_worker
from worker.service.config import WorkerConfig
from worker.service.worker import JobWorker

PARTS = ("engine_host", "service_loop", "publisher", "worker_host", "forward", "sample")


def thread_clock(ident: int | None) -> Callable[[], float]:
    """CPU seconds of the thread ``ident`` (a `threading.Thread.ident`), read from any thread."""
    if ident is None:
        raise RuntimeError("the thread has not started")
    clock_id = time.pthread_getcpuclockid(ident)
    return lambda: time.clock_gettime(clock_id)


def redis_cpu_s(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class WorkerSteps:
    """Per-step CPU times of a running `JobWorker`, by wrapping its step from outside."""

    def __init__(self, worker: JobWorker, batch: int, warmup: int, steps: int) -> None:
        self.worker, self.batch, self.warmup, self.wanted = worker, batch, warmup, steps
        self.timer = StepTimer(time.thread_time)  # the engine's phases on the loop thread
        self.kept: list[dict[str, float]] = []
        self._steady = 0
        self._engine_s = 0.0
        self._publisher: Callable[[], float] | None = None

    def install(self) -> None:
        worker, engine_step = self.worker, self.worker.engine.step

        def timed_engine_step() -> Any:
            start = time.thread_time()
            try:
                return engine_step()
            finally:
                self._engine_s = time.thread_time() - start

        worker.engine.step = timed_engine_step  # type: ignore[method-assign]
        step = worker.step

        def timed_step() -> None:
            if self._publisher is None:
                self._publisher = thread_clock(worker.publisher.ident)
            self._engine_s = 0.0
            loop0, pub0 = time.thread_time(), self._publisher()
            step()
            loop_s, pub_s = time.thread_time() - loop0, self._publisher() - pub0
            self._record(loop_s, pub_s)

        worker.step = timed_step  # type: ignore[method-assign]

    def _record(self, loop_s: float, publisher_s: float) -> None:
        engine = self.worker.engine
        batch = self.batch
        all_decode = len(engine.scheduler.running) == batch == engine.last_num_batched_tokens
        self._steady = self._steady + 1 if all_decode and self._engine_s else 0
        keep = self._steady > self.warmup and len(self.kept) < self.wanted
        self.timer.end_step(self._engine_s, keep=keep)
        if not keep:
            return
        phases = self.timer.steps[-1]
        engine_host = self._engine_s - phases["forward"] - phases.get("sample", 0.0)
        service = loop_s - self._engine_s
        self.kept.append(
            {
                "engine_host": engine_host,
                "service_loop": service,
                "publisher": publisher_s,
                "worker_host": engine_host + service + publisher_s,
                "forward": phases["forward"],
                "sample": phases.get("sample", 0.0),
            }
        )


def measure(args: argparse.Namespace, model_dir: Path, batch: int, url: str) -> dict[str, Any]:
    engine, max_tokens = decode_batch_engine(
        model_dir, batch, args.prompt_len, args.warmup + args.steps + 8, args.threads
    )
    rng = random.Random(args.seed)
    vocab = normal_token_ids(engine.tokenizer, engine.model_config.vocab_size)
    jobs = [
        {
            "id": f"r{i}",
            "prompt_ids": rng.choices(vocab, k=args.prompt_len),
            "output_len": max_tokens,
        }
        for i in range(batch)
    ]
    prefix = f"pn-host-{uuid.uuid4().hex[:8]}"
    # Every job at once: the slots kept for the interactive band (capacity // 8 by default)
    # would hold an eighth of these back.
    config = WorkerConfig(prefix=prefix, max_jobs=batch + 8, urgent_reserve=1)
    worker = build_worker(engine, url, config)
    probe = WorkerSteps(worker, batch, args.warmup, args.steps)
    probe.install()
    reader = redis.Redis.from_url(url, decode_responses=True)
    redis_before = redis_cpu_s(reader)
    with instrumented(engine, probe.timer, per_row=False):
        serve_jobs(worker, url, jobs)
    redis_s = redis_cpu_s(reader) - redis_before
    if len(probe.kept) < args.steps:
        raise RuntimeError(f"{len(probe.kept)} all-decode steps kept of {args.steps}")
    ms = {k: 1e3 * statistics.median(s[k] for s in probe.kept) for k in PARTS}
    return {
        "batch": batch,
        "steps": len(probe.kept),
        "worker_steps": worker.num_steps,
        "median_ms": ms,
        "redis_cpu_ms_per_step": 1e3 * redis_s / max(1, worker.num_steps),
        "worker_host_us_per_row": 1e3 * ms["worker_host"] / batch,
    }


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    labels = {
        "engine_host": "engine host (LLMEngine.step - forward - sampling)",
        "service_loop": "service loop (JobWorker.step - LLMEngine.step)",
        "publisher": "publisher thread",
        "worker_host": "**worker host (the three, one GIL)**",
        "forward": "forward (layers + logits)",
        "sample": "sampling",
    }
    lines = ["| CPU ms per all-decode step | " + " | ".join(f"B={r['batch']}" for r in runs) + " |"]
    lines.append("| --- |" + " ---: |" * len(runs))
    for key, label in labels.items():
        lines.append(
            f"| {label} | " + " | ".join(f"{r['median_ms'][key]:.2f}" for r in runs) + " |"
        )
    lines.append(
        "| worker host per row (us) | "
        + " | ".join(f"{r['worker_host_us_per_row']:.1f}" for r in runs)
        + " |"
    )
    lines.append(
        "| Redis server CPU per step (whole run) | "
        + " | ".join(f"{r['redis_cpu_ms_per_step']:.2f}" for r in runs)
        + " |"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--steps", type=int, default=30, help="timed all-decode steps per batch")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redis-url", help="default: REDIS_URL, else an embedded Redis")
    p.add_argument("--shape", default="host-overhead", help="random_model.py shape")
    p.add_argument("--tokenizer", type=Path, help="default: SmolLM2-135M's (bundled)")
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    url, embedded = resolve_redis_url(args.redis_url)
    tokenizer = args.tokenizer or resolve_model_dir(None)
    try:
        with tempfile.TemporaryDirectory(prefix="worker-host-") as tmp:
            model_dir = write_random_model(args.shape, tokenizer, Path(tmp), torch.float32, "cpu")
            runs = [measure(args, model_dir, b, url) for b in args.batches]
    finally:
        if embedded is not None:
            embedded.close()
    report = {
        "config": {k: str(v) for k, v in vars(args).items() if k != "out"},
        "environment": environment(args.threads),
        "batches": runs,
        "markdown": markdown(runs),
    }
    print(report["markdown"])
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
