"""The open-loop client of ``serve_load.py``: a workload's jobs against a peer's HTTP server.

Each job goes out at its arrival time (seconds since the client's start) on a thread of its own,
whatever earlier jobs are doing, as one streamed greedy request of exactly ``max_tokens`` tokens
given as token ids. Records are ``load_client.JobRecord``s, so ``load_report`` reads them as it
reads ours. How each server is asked and how its tokens are counted (``DIALECTS``):

- ``vllm``: ``POST /v1/completions``, ``prompt`` a list of ids, ``max_tokens = min_tokens``,
  ``ignore_eos``, ``return_token_ids``: every SSE chunk's ``choices[0].token_ids`` holds the ids
  it adds (a chunk's text can lag its tokens, so text is not counted); ``[DONE]`` ends it.
- ``llama.cpp``: ``POST /completion`` (native; its ``/v1/completions`` stream has text only),
  ``n_predict``, ``ignore_eos``, ``return_tokens``: every event's ``tokens`` holds the new ids;
  the event with ``"stop": true`` ends it.

A token's time is when the line carrying it was read. A cancel closes the connection once the job
has ``cancel_after_tokens`` tokens (both servers abort a request whose client is gone): there is
no reply to wait for, so ``end_s = cancel_sent_s``, ``cancel_reply = "closed"``, and no later
token is ever read. ``queued_s`` stays None: neither server says when a request was scheduled.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.append(str(Path(__file__).resolve().parents[1]))  # ops/bench: load_client

from load_client import JobRecord

MODEL_NAME = "paternoster-peer"  # serve_load.py serves vLLM under this name; llama.cpp ignores it


@dataclass(frozen=True)
class Dialect:
    path: str
    body: Callable[[Sequence[int], int], dict[str, Any]]
    tokens: Callable[[Mapping[str, Any]], int]  # tokens an event adds
    finished: Callable[[Mapping[str, Any]], bool]  # the event that ends a complete stream


def _vllm_body(prompt: Sequence[int], n: int) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": list(prompt),
        "max_tokens": n,
        "min_tokens": n,  # forced length, as ours: every system does the same work
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
    }


def _llama_body(prompt: Sequence[int], n: int) -> dict[str, Any]:
    return {
        "prompt": list(prompt),
        "n_predict": n,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": False,  # random prompts share nothing; ours caches no prefixes here
        "stream": True,
        "return_tokens": True,
    }


DIALECTS = {
    "vllm": Dialect(
        "/v1/completions",
        _vllm_body,
        lambda e: sum(len(c.get("token_ids") or []) for c in e.get("choices") or []),
        lambda e: any(c.get("finish_reason") for c in e.get("choices") or []),
    ),
    "llama.cpp": Dialect(
        "/completion",
        _llama_body,
        lambda e: len(e.get("tokens") or []),
        lambda e: bool(e.get("stop")),
    ),
}


class ServeClient:
    """Submits every job at its arrival time on its own thread; ``run`` returns the records."""

    def __init__(self, base_url: str, dialect: str, jobs: Sequence[Mapping[str, Any]]):
        self.dialect = DIALECTS[dialect]
        self.jobs = sorted(jobs, key=lambda j: j["arrival_s"])
        self.records = {j["job_id"]: JobRecord.for_job(j) for j in self.jobs}
        # One pooled connection per live job: a job never waits for another's connection.
        limits = httpx.Limits(max_connections=len(self.jobs) + 1, max_keepalive_connections=8)
        self.http = httpx.Client(base_url=base_url, limits=limits)
        self.start = time.perf_counter()
        self.deadline_s = float("inf")

    def now(self) -> float:
        return time.perf_counter() - self.start

    def run(self, timeout_s: float = 3600.0) -> list[JobRecord]:
        self.start = time.perf_counter()
        self.deadline_s = timeout_s
        threads = []
        for j in self.jobs:
            if j["arrival_s"] >= timeout_s:
                break  # never submitted: stays pending, marked timeout below
            if (wait_s := j["arrival_s"] - self.now()) > 0:
                time.sleep(wait_s)
            t = threading.Thread(target=self.follow, args=(j,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout=max(0.0, timeout_s - self.now()) + 1.0)
        for rec in self.records.values():
            if rec.end_s is None:
                rec.outcome = "timeout"
        self.http.close()
        return [self.records[j["job_id"]] for j in self.jobs]

    def follow(self, j: Mapping[str, Any]) -> None:
        rec = self.records[j["job_id"]]
        body = self.dialect.body(j["prompt_token_ids"], rec.max_tokens)
        # Reads wait at most until the run's deadline: a stalled stream times out with it.
        read_s = max(1.0, self.deadline_s - self.now())
        timeout = httpx.Timeout(10.0, read=read_s)
        rec.submit_s = self.now()  # TTFT counts from the moment the request goes out
        try:
            with self.http.stream("POST", self.dialect.path, json=body, timeout=timeout) as resp:
                if resp.status_code != 200:
                    resp.read()
                    self.fail(rec, "error", f"HTTP {resp.status_code}: {resp.text[:500]}")
                    return
                self.read_stream(rec, resp)
        except httpx.TimeoutException as exc:
            self.fail(rec, "timeout", repr(exc))
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
            self.fail(rec, "error", repr(exc))

    def read_stream(self, rec: JobRecord, resp: httpx.Response) -> None:
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data.strip() == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                self.fail(rec, "error", str(event["error"])[:500])
                return
            t = self.now()
            rec.token_times_s.extend([t] * self.dialect.tokens(event))
            due = rec.cancel_after_tokens
            if due is not None and len(rec.token_times_s) >= due:
                resp.close()  # unread body: httpx drops the connection, the server aborts
                rec.cancel_sent_s = rec.end_s = self.now()
                rec.outcome, rec.cancel_reply = "cancelled", "closed"
                return
            if t >= self.deadline_s:  # a stream still going at the deadline: give up on it
                resp.close()
                self.fail(rec, "timeout", f"still streaming after {self.deadline_s} s")
                return
            if self.dialect.finished(event):
                rec.end_s = t  # the terminal event, as load_client; what follows is bookkeeping
        # Read to the end of the body (usage, [DONE]) so the connection can be reused.
        if rec.end_s is None:
            self.fail(rec, "error", "the stream ended without a finished event")
        else:
            rec.outcome = "done"

    def fail(self, rec: JobRecord, outcome: str, error: str) -> None:
        rec.outcome, rec.error = outcome, error
        # A timed-out job has no end, as in load_client: it must not stretch the run's duration.
        rec.end_s = None if outcome == "timeout" else self.now()
