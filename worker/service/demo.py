"""``paternoster demo``: a worker and a handful of mixed jobs, their tokens shown as they stream.

Everything runs in this process (the worker on a thread) against ``REDIS_URL`` or an embedded
Redis, under a fresh key prefix that is deleted at the end.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, TextIO

from producer import JobState, Producer
from producer.protocol import TokenEvent, is_terminal
from producer.results import JobResult

_LONG_TEXT = (
    "A paternoster is a passenger lift made of a chain of open compartments that move slowly "
    "in a loop up and down inside a building, without stopping. Passengers step on or off at "
    "any floor they like. The name comes from the resemblance to rosary beads, used to count "
    "prayers. Paternosters were popular in the first half of the twentieth century because they "
    "could carry more passengers than ordinary lifts. "
)


@dataclass
class DemoJob:
    name: str
    kwargs: dict[str, Any]
    result: JobResult = field(default_factory=lambda: JobResult(""))
    done: threading.Event = field(default_factory=threading.Event)


def demo_jobs() -> list[DemoJob]:
    """Chat questions, one long prompt, one long generation: the traffic a worker mixes."""

    def chat(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}]

    greedy = {"temperature": 0.0}
    return [
        DemoJob(
            "chat-capital",
            {"messages": chat("What is the capital of France?"), "max_tokens": 32, **greedy},
        ),
        DemoJob(
            "chat-colors",
            {"messages": chat("Name the three primary colors."), "max_tokens": 48, **greedy},
        ),
        DemoJob(
            "chat-haiku",
            {
                "messages": chat("Write a haiku about a lift that never stops."),
                "max_tokens": 48,
                "temperature": 0.7,
                "seed": 7,
            },
        ),
        DemoJob(
            "long-prompt",
            {
                # 426 tokens: a long prefill, with room for 32 more in a 512-token context
                # (the test model's; jobs that cannot fit are refused, not cut).
                "prompt": _LONG_TEXT * 5 + "\nIn one sentence, a paternoster is",
                "max_tokens": 32,
                **greedy,
            },
        ),
        DemoJob(
            "long-generation",
            {
                "messages": chat("Tell me a long story about a robot."),
                "max_tokens": 200,
                "ignore_eos": True,
                **greedy,
            },
        ),
    ]


def follow(producer: Producer, job: DemoJob, on_event: Any) -> None:
    for event in producer.stream(job.result.job_id, timeout_s=600):
        job.result.apply(event)
        on_event(job, event)
        if is_terminal(event):
            break
    job.done.set()


class Display:
    """A live block of one line per job on a terminal; one line per event otherwise."""

    def __init__(self, jobs: list[DemoJob], out: TextIO) -> None:
        self.jobs = jobs
        self.out = out
        self.live = out.isatty()
        self._lock = threading.Lock()
        self._drawn = False

    def on_event(self, job: DemoJob, event: Any) -> None:
        with self._lock:
            if self.live:
                self._redraw()
            elif isinstance(event, TokenEvent):
                self.out.write(f"[{job.name}] +{event.text!r}\n")
            else:
                self.out.write(f"[{job.name}] {event.type}\n")
            self.out.flush()

    def _redraw(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        if self._drawn:
            self.out.write(f"\x1b[{len(self.jobs)}F")
        for job in self.jobs:
            text = job.result.text.replace("\n", " ")
            head = f"{job.name:>16} [{job.result.state.value:>9}] "
            room = max(10, width - len(head) - 1)
            self.out.write("\x1b[2K" + head + text[-room:] + "\n")
        self._drawn = True


def timings_table(jobs: list[DemoJob]) -> str:
    rows = [
        f"{'job':>16} {'state':>9} {'prompt':>6} {'output':>6} {'queued':>8} {'ttft':>8} "
        f"{'total':>8} {'tok/s':>7}"
    ]
    for job in jobs:
        r = job.result
        usage, t = r.usage, r.timings
        out = usage.completion_tokens if usage else len(r.token_ids)
        prompt = usage.prompt_tokens if usage else 0
        if t is None:
            rows.append(f"{job.name:>16} {r.state.value:>9} {prompt:>6} {out:>6}")
            continue
        ttft = f"{t.ttft_s:.2f}s" if t.ttft_s is not None else "-"
        decode = t.total_s - (t.ttft_s or t.total_s)
        rate = f"{(out - 1) / decode:.1f}" if decode > 0 and out > 1 else "-"
        rows.append(
            f"{job.name:>16} {r.state.value:>9} {prompt:>6} {out:>6} {t.queued_s:>7.3f}s "
            f"{ttft:>8} {t.total_s:>7.2f}s {rate:>7}"
        )
    return "\n".join(rows)


def run_demo(engine: Any, redis_url: str, out: TextIO = sys.stdout) -> int:
    """Start a worker thread on ``engine``, run the demo jobs through Redis, print timings."""
    from worker.service.build import build_worker
    from worker.service.config import WorkerConfig

    prefix = f"paternoster-demo-{uuid.uuid4().hex[:8]}"
    worker = build_worker(engine, redis_url, WorkerConfig(prefix=prefix))
    producer = Producer(redis_url, prefix=prefix)
    jobs = demo_jobs()
    display = Display(jobs, out)
    errors: list[BaseException] = []

    def drive() -> None:  # the web app's part: submit, follow every stream, then stop the worker
        try:
            for job in jobs:
                job.result = JobResult(producer.submit(**job.kwargs).job_id)
            followers = [
                threading.Thread(target=follow, args=(producer, j, display.on_event), daemon=True)
                for j in jobs
            ]
            for f in followers:
                f.start()
            for f in followers:
                f.join()
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)
        finally:
            worker.stop()

    start = time.perf_counter()
    driver = threading.Thread(target=drive, name="paternoster-demo-clients", daemon=True)
    driver.start()
    try:
        # The model loop runs here, on the thread that built the engine: stepping it on another
        # thread would start a second OpenMP team, which made CPU steps ~30% slower.
        worker.run()
        driver.join()
    finally:
        for key in producer.redis.scan_iter(producer.keys.pattern()):
            producer.redis.delete(key)
        producer.close()
    if errors:
        raise errors[0]
    return _report(jobs, time.perf_counter() - start, redis_url, out)


def _report(jobs: list[DemoJob], elapsed: float, redis_url: str, out: TextIO) -> int:
    """Each job's text, the timings table and the totals; 0 when every job ended ``done``."""
    out.write("\n")
    for job in jobs:
        out.write(f"--- {job.name} [{job.result.finish_reason or job.result.state.value}]\n")
        out.write(job.result.text.strip() + "\n")
    out.write("\n" + timings_table(jobs) + "\n")
    total = sum(len(j.result.token_ids) for j in jobs)
    out.write(
        f"{len(jobs)} jobs, {total} tokens in {elapsed:.1f} s "
        f"({total / elapsed:.1f} tok/s) through Redis at {redis_url}\n"
    )
    return 0 if all(j.result.state is JobState.DONE for j in jobs) else 1
