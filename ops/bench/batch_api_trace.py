"""``batch_api.py --trace``: where each probe's time to first token went, stretch by stretch.

Joined per probe (all on this host's clock; the Redis server runs here too):

- ``gateway_in``: the client's send to the job's ``submitted_at`` (the gateway's XADD);
- ``queued``, ``inbox``, ``to_step``, ``step``: the worker's ``job_first_token`` log line
  (``worker/service/first_token_trace.py``: claim, engine admission, the first-token step);
  ``after_step`` (and its tokens, in the slowest probes' lists): the step the loop ran last
  before it took the job in, the one a job that arrived mid-step waited for;
- ``publish``: the first token built to its event's XADD (the event's stream id, in ms);
- ``gateway_out``: that XADD to the client's first text chunk (OpenAI probe only).

The native probe's TTFT (``timings.ttft_s``) is ``queued`` to ``step``; the OpenAI probe's is the
client's, every stretch. The report gives each stretch's p50 / p99 per phase and kind, and the
stretches of the slowest probes, which is where a p99 comes from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from ops.bench.batch_api_probes import Probes, summary
from producer.keys import Keys
from producer.protocol import TokenEvent, parse_event

WORKER_STRETCHES = ("queued", "inbox", "to_step", "step")
SLOWEST = 5  # probes listed per phase and kind


def first_token_lines(log_dir: Path) -> dict[str, dict[str, Any]]:
    """Each job's ``job_first_token`` record from the workers' logs (``w*.log``), by job id."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(log_dir.glob("w*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"job_first_token"' in line:
                record = json.loads(line)
                found[record["job_id"]] = record
    return found


def first_event_s(client: redis.Redis, keys: Keys, job_id: str) -> float | None:
    """When the job's first token event was written (its stream id's milliseconds)."""
    entries: Any = client.xrange(keys.events(job_id), count=4)
    for event_id, fields in entries:
        if isinstance(parse_event(event_id, fields), TokenEvent):
            return int(event_id.partition("-")[0]) / 1000
    return None


def probe_split(
    sent_at: float,
    first_at: float | None,
    record: dict[str, Any],
    submitted_at: float,
    published_at: float | None,
) -> dict[str, float]:
    """One probe's stretches in ms (those its data has)."""
    ms = {name: 1000 * float(record[f"{name}_s"]) for name in WORKER_STRETCHES}
    ms["gateway_in"] = 1000 * (submitted_at - sent_at)
    token_at = submitted_at + float(record["ttft_s"])
    if published_at is not None:
        ms["publish"] = 1000 * (published_at - token_at)
        if first_at is not None:
            ms["gateway_out"] = 1000 * (first_at - published_at)
    ms["ttft"] = 1000 * (first_at - sent_at if first_at is not None else record["ttft_s"])
    ms["after_step"] = 1000 * float(record.get("after_step_s", 0.0))
    ms["steps"] = float(record["steps"])
    ms["after_step_tokens"] = float(record.get("after_step_tokens", 0))
    return ms


def trace_report(probes: Probes, url: str, prefix: str, log_dir: Path) -> dict[str, Any]:
    """Per phase and probe kind: each stretch's summary, and the slowest probes' stretches."""
    lines = first_token_lines(log_dir)
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(prefix)
    groups: dict[tuple[str, str], list[dict[str, float]]] = {}
    missing = 0
    for phase, kind, job_id, sent_at, first_at in probes.sent_jobs:
        record = lines.get(job_id)
        submitted: Any = client.hget(keys.job(job_id), "submitted_at")
        if record is None or submitted is None:
            missing += 1
            continue
        published_at = first_event_s(client, keys, job_id)
        split = probe_split(sent_at, first_at, record, float(submitted), published_at)
        groups.setdefault((phase, kind), []).append(split)
    report: dict[str, Any] = {"probes_without_trace": missing}
    for (phase, kind), splits in groups.items():
        report.setdefault(phase, {})[kind] = {
            "stretches": {name: summary(values) for name, values in _columns(splits)},
            "first_token_after_more_steps": sum(split["steps"] > 0 for split in splits),
            "slowest": sorted(splits, key=lambda s: -s["ttft"])[:SLOWEST],
        }
    return report


def _columns(splits: list[dict[str, float]]) -> Iterable[tuple[str, list[float]]]:
    counts = ("steps", "after_step_tokens")
    names = dict.fromkeys(name for split in splits for name in split if name not in counts)
    for name in names:
        values = [split[name] / 1000 for split in splits if name in split]  # summary takes s
        yield name, values
