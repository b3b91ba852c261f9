"""The client side of ``load.py``, a process of its own as a web app is: submits each job of a
workload file at its arrival time whatever has finished (open loop), follows every live job's
stream with one XREAD loop, cancels the chosen jobs once they have their token count, and writes
per-job timings as JSON. Imports only the producer library (no torch), as a web app would.

    python ops/bench/load_client.py JOBS.json OUT.json --redis-url URL --prefix P

Times are seconds since the client's start (``start_unix`` in the output gives it on the wall
clock, so load.py can line its /metrics samples up with them). A token's time is when the read
that returned it came back: reads return within a millisecond of a publish while the loop is not
submitting, so the error is well under one CPU decode step (~200 ms).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from producer import InvalidJob, Overloaded, Producer
from producer.protocol import Event, StartedEvent, TokenEvent, is_terminal, parse_event

# While jobs are still to come, a read waits at most until the next arrival, and never longer
# than this: an open-loop submit is at most this late however quiet the streams are.
MAX_BLOCK_MS = 50


@dataclass
class JobRecord:
    job_id: str
    klass: str
    priority: int
    tenant: str
    prompt_tokens: int
    max_tokens: int
    cancel_after_tokens: int | None
    arrival_s: float  # when the workload says it arrives
    submit_s: float | None = None  # when the submit returned (None: never submitted)
    outcome: str = "pending"  # done, cancelled, error, expired, rejected, timeout
    queued_s: float | None = None  # submit -> taken by a worker, on the Redis server's clock
    token_times_s: list[float] = field(default_factory=list)  # one per token, in order
    cancel_sent_s: float | None = None
    cancel_reply: str | None = None
    end_s: float | None = None  # when the terminal event (or the refusal) was read
    error: str | None = None

    @classmethod
    def for_job(cls, j: Mapping[str, Any], outcome: str = "pending") -> JobRecord:
        """The record of workload job ``j`` (a `workload.WorkloadJob` as a dict), not yet run."""
        return cls(
            j["job_id"],
            j["klass"],
            j["priority"],
            j["tenant"],
            len(j["prompt_token_ids"]),
            j["max_tokens"],
            j["cancel_after_tokens"],
            j["arrival_s"],
            outcome=outcome,
        )


class LoadClient:
    """One thread: submits what is due, reads every live stream, cancels, repeats."""

    def __init__(self, producer: Producer, reader: redis.Redis, jobs: list[dict[str, Any]]):
        self.producer, self.reader = producer, reader
        self.jobs = sorted(jobs, key=lambda j: j["arrival_s"])
        self.records: dict[str, JobRecord] = {}
        self.live: dict[str, str] = {}  # stream key -> last entry id read
        self.by_key: dict[str, JobRecord] = {}
        self.start = time.perf_counter()
        self.next_job = 0
        self.reads = 0

    def now(self) -> float:
        return time.perf_counter() - self.start

    def submit_due(self) -> None:
        while (
            self.next_job < len(self.jobs) and self.jobs[self.next_job]["arrival_s"] <= self.now()
        ):
            self.submit(self.jobs[self.next_job])
            self.next_job += 1

    def submit(self, j: dict[str, Any]) -> None:
        n = j["max_tokens"]
        rec = JobRecord.for_job(j)
        self.records[rec.job_id] = rec
        try:
            self.producer.submit(
                job_id=rec.job_id,
                prompt_token_ids=j["prompt_token_ids"],
                max_tokens=n,
                min_tokens=n,  # forced length: every system does the same work
                ignore_eos=True,
                temperature=0.0,
                priority=rec.priority,
                tenant=rec.tenant,
            )
        except Overloaded as exc:
            rec.outcome, rec.error, rec.end_s = "rejected", str(exc), self.now()
            return
        except InvalidJob as exc:
            rec.outcome, rec.error, rec.end_s = "error", str(exc), self.now()
            return
        rec.submit_s = self.now()
        key = self.producer.keys.events(rec.job_id)
        self.live[key] = "0"
        self.by_key[key] = rec

    def block_ms(self) -> int:
        if self.next_job >= len(self.jobs):
            return 1000
        wait_s = self.jobs[self.next_job]["arrival_s"] - self.now()
        return max(1, min(MAX_BLOCK_MS, int(wait_s * 1000)))  # 0 would block forever

    def read(self) -> None:
        if not self.live:
            time.sleep(self.block_ms() / 1000)
            return
        reply: Any = self.reader.xread(cast(Any, self.live), count=1024, block=self.block_ms())
        self.reads += 1
        t = self.now()
        for key, entries in reply or []:
            rec = self.by_key[key]
            for entry_id, fields in entries:
                self.live[key] = entry_id
                self.apply(rec, parse_event(entry_id, fields), t)
                if rec.end_s is not None:
                    del self.live[key]
                    break

    def apply(self, rec: JobRecord, event: Event, t: float) -> None:
        if isinstance(event, StartedEvent):
            rec.queued_s = event.queued_s
        elif isinstance(event, TokenEvent):
            rec.token_times_s.extend([t] * len(event.token_ids))
            due = rec.cancel_after_tokens
            if due is not None and rec.cancel_sent_s is None and len(rec.token_times_s) >= due:
                rec.cancel_reply = self.producer.cancel(rec.job_id)
                rec.cancel_sent_s = self.now()
        elif is_terminal(event):
            rec.outcome, rec.end_s = event.type, t
            if event.type == "error":
                rec.error = f"{getattr(event, 'code', '')}: {getattr(event, 'message', '')}"

    def run(self, timeout_s: float) -> None:
        while (self.next_job < len(self.jobs) or self.live) and self.now() < timeout_s:
            self.submit_due()
            self.read()
        for rec in self.records.values():
            if rec.end_s is None:
                rec.outcome = "timeout"
        for j in self.jobs[self.next_job :]:  # never submitted: the run timed out first
            self.records[j["job_id"]] = JobRecord.for_job(j, outcome="timeout")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jobs", type=Path, help="a JSON list of workload.WorkloadJob fields")
    p.add_argument("out", type=Path)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up on what is left")
    args = p.parse_args(argv)
    jobs = json.loads(args.jobs.read_text())
    producer = Producer(args.redis_url, prefix=args.prefix)
    reader = redis.Redis.from_url(args.redis_url, decode_responses=True)
    start_unix = time.time()
    client = LoadClient(producer, reader, jobs)
    client.run(args.timeout_s)
    out = {
        "start_unix": start_unix,
        "wall_s": client.now(),
        "reads": client.reads,
        "jobs": [asdict(client.records[j["job_id"]]) for j in client.jobs],
    }
    args.out.write_text(json.dumps(out))
    producer.close()


if __name__ == "__main__":
    main()
