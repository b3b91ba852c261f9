"""The worker's TTFT split (``job_first_token``): each stretch from the times it was given."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.test_units import make_job, out
from worker.service.first_token_trace import FirstTokenTrace


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


class Metrics:
    def __init__(self) -> None:
        self.ttfts: list[tuple[str, float]] = []

    def first_token(self, *, band: str, ttft_s: float) -> None:
        self.ttfts.append((band, ttft_s))


def test_the_split_adds_up_to_the_ttft(monkeypatch: pytest.MonkeyPatch) -> None:
    log, metrics = Log(), Metrics()
    trace = FirstTokenTrace(log, metrics)  # type: ignore[arg-type]
    job = make_job(interval=1)  # submitted 100.0, claimed 100.5, Redis clock = this host's
    trace.stepped(0.2, 12)  # the step it waited for
    trace.admitted(job, step=7, now=100.75)
    trace.stepped(0.05, 3)
    assert len(trace) == 1
    monkeypatch.setattr("time.time", lambda: 101.0)  # the first token event is built at 101.0
    job.on_output(out([5], "a"))
    trace.first_token(job, step=9, step_started_at=100.9)  # two steps left it waiting
    assert len(trace) == 0
    ((event, fields),) = log.lines
    assert event == "job_first_token" and fields["job_id"] == "j" and fields["tenant"] == "t"
    assert fields["queued_s"] == pytest.approx(0.5)
    assert fields["inbox_s"] == pytest.approx(0.25)
    assert fields["to_step_s"] == pytest.approx(0.15)
    assert fields["step_s"] == pytest.approx(0.1)
    assert fields["steps"] == 2 and fields["ttft_s"] == pytest.approx(1.0)
    assert fields["after_step_s"] == 0.2 and fields["after_step_tokens"] == 12
    parts = ("queued_s", "inbox_s", "to_step_s", "step_s")
    assert sum(fields[name] for name in parts) == pytest.approx(fields["ttft_s"])
    assert metrics.ttfts == [("default", pytest.approx(1.0))]


def test_a_job_with_a_first_token_already_is_not_traced() -> None:
    log, metrics = Log(), Metrics()
    trace = FirstTokenTrace(log, metrics)  # type: ignore[arg-type]
    resumed = make_job()
    resumed.first_token_at = 100.2  # taken over: its first token came from a dead worker
    trace.admitted(resumed, step=0)
    assert len(trace) == 0


def test_forget_drops_a_job_that_ended_before_its_first_token() -> None:
    log = Log()
    trace = FirstTokenTrace(log)
    job = make_job()
    trace.admitted(job, step=0, now=100.6)
    trace.forget("j")
    job.first_token_at = 101.0
    trace.first_token(job, step=1, step_started_at=100.9)  # not admitted here: no line
    assert len(trace) == 0 and log.lines == []
