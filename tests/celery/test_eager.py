"""The bridge's task logic in Celery's eager mode, against a scripted producer: no broker, no
Redis, milliseconds. Retry policy, chain templates, errors that must not retry, the result."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain

from producer import Keys
from producer.celery import (
    MAX_RETRIES,
    RETRY_BACKOFF_MAX_S,
    RETRY_ON,
    TASK_NAME,
    GenerateFailed,
    overload_countdown,
    register,
    result_dict,
)
from producer.errors import Overloaded
from producer.protocol import (
    DoneEvent,
    ErrorEvent,
    Event,
    StartedEvent,
    Timings,
    TokenEvent,
    Usage,
)
from producer.results import JobResult


class ScriptedProducer:
    """Just enough of ``Producer`` for the task: ``submit`` fails ``failures`` times, then each
    job's events are a start, one token per word of its prompt's length, and ``ending``."""

    def __init__(self, failures: int = 0, ending: str = "done", overloads: int = 0) -> None:
        self.failures = failures
        self.overloads = overloads  # submits refused with Overloaded, after the failures
        self.ending = ending
        self.submits: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.keys = Keys("eager")
        self.redis = self  # stream_tokens asks redis.exists

    def exists(self, *keys: str) -> int:
        return 1

    def submit(self, prompt: str | None = None, **kwargs: Any) -> None:
        self.submits.append({"prompt": prompt, **kwargs})
        if len(self.submits) <= self.failures:
            raise redis.ConnectionError("Redis is away")
        if len(self.submits) <= self.failures + self.overloads:
            raise Overloaded("band:default", "jobs", 100, 100, 1.0)

    def events(
        self, job_id: str, from_event: str = "0", block_ms: int | None = None
    ) -> list[Event]:
        if from_event != "0":
            return []
        end: Event = DoneEvent(
            finish_reason="length",
            usage=Usage(prompt_tokens=2, completion_tokens=1, total_tokens=3),
            timings=Timings(queued_s=0.1, ttft_s=0.2, total_s=0.3),
        )
        if self.ending == "error":
            end = ErrorEvent(code="prompt_too_long", message="too long")
        events: list[Event] = [
            StartedEvent(worker="w", queued_s=0.1),
            TokenEvent(index=0, text=" blue", token_ids=(42,)),
            end,
        ]
        return [e.model_copy(update={"event_id": f"1-{i}"}) for i, e in enumerate(events)]

    def cancel(self, job_id: str) -> str:
        self.cancelled.append(job_id)
        return "cancelling"


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("pn-eager", set_as_current=False)
    # Not propagating: only then does an eager task run its retries (apply re-applies a Retry).
    app.conf.update(task_always_eager=True, task_eager_propagates=False)
    yield app
    app.close()


def registered(app: Celery, producer: ScriptedProducer, **options: Any) -> Any:
    return register(app, producer_factory=lambda: producer, **options)  # type: ignore[arg-type,return-value]


def test_the_task_has_its_name_and_a_backoff_retry_policy(app: Celery) -> None:
    task = registered(app, ScriptedProducer())
    assert task.name == TASK_NAME == "paternoster.generate"
    assert TASK_NAME in app.tasks
    assert task.autoretry_for == RETRY_ON
    assert redis.ConnectionError in RETRY_ON and redis.TimeoutError in RETRY_ON
    assert task.retry_backoff is True and task.retry_jitter is True
    assert task.max_retries == MAX_RETRIES
    assert task.acks_late is True  # safe: a redelivered task resubmits the same job id


def test_redis_away_retries_with_the_same_job_id_then_succeeds(app: Celery) -> None:
    producer = ScriptedProducer(failures=2)
    out = registered(app, producer).apply(kwargs={"prompt": "Sky", "max_tokens": 1}).get()
    assert out["text"] == " blue"
    assert len(producer.submits) == 3
    assert len({s["job_id"] for s in producer.submits}) == 1  # retries are one job, not three
    assert producer.cancelled == []


def test_retries_stop_after_max_retries(app: Celery) -> None:
    producer = ScriptedProducer(failures=100)
    task = registered(app, producer, max_retries=2)
    with pytest.raises(redis.ConnectionError):
        task.apply(kwargs={"prompt": "Sky"}).get()
    assert len(producer.submits) == 3  # the first try and two retries


def test_an_extra_retry_error_type_is_retried(app: Celery) -> None:
    class QueueFull(Exception):  # a caller's own transient error
        pass

    producer = ScriptedProducer()
    calls = iter([QueueFull("queue full"), None])
    submit = producer.submit

    def flaky_submit(prompt: str | None = None, **kwargs: Any) -> None:
        error = next(calls)
        if error is not None:
            raise error
        submit(prompt, **kwargs)

    producer.submit = flaky_submit  # type: ignore[method-assign]
    task = registered(app, producer, retry_on=(*RETRY_ON, QueueFull))
    assert task.apply(kwargs={"prompt": "Sky"}).get()["text"] == " blue"


def test_overloaded_is_retried_with_the_same_job_id_then_succeeds(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    countdowns: list[float] = []
    producer = ScriptedProducer(overloads=2)
    task = registered(app, producer)
    retry = task.retry

    def spy(*args: Any, **kwargs: Any) -> Any:
        countdowns.append(kwargs["countdown"])
        return retry(*args, **kwargs)

    monkeypatch.setattr(task, "retry", spy)
    assert task.apply(kwargs={"prompt": "Sky"}).get()["text"] == " blue"
    assert len(producer.submits) == 3 and len({s["job_id"] for s in producer.submits}) == 1
    assert 1.0 <= countdowns[0] <= 1.5 and 2.0 <= countdowns[1] <= 3.0  # retry_after_s, doubled


def test_overloaded_retries_are_bounded_then_the_task_fails_with_it(app: Celery) -> None:
    producer = ScriptedProducer(overloads=100)
    with pytest.raises(Overloaded) as info:
        registered(app, producer, max_retries=3).apply(kwargs={"prompt": "Sky"}).get()
    assert len(producer.submits) == 4  # the first try and three retries
    assert (info.value.scope, info.value.kind, info.value.retry_after_s) == (
        "band:default", "jobs", 1.0
    )  # fmt: skip


def test_overloaded_is_not_retried_when_asked_not_to(app: Celery) -> None:
    producer = ScriptedProducer(overloads=1)
    with pytest.raises(Overloaded):
        registered(app, producer, retry_overloaded=False).apply(kwargs={"prompt": "Sky"}).get()
    assert len(producer.submits) == 1


def test_overload_countdown_doubles_from_retry_after_with_a_cap_and_jitter() -> None:
    assert [overload_countdown(1.0, r, rand=lambda: 0.0) for r in range(8)] == [
        1, 2, 4, 8, 16, 32, 60, 60
    ]  # fmt: skip
    assert overload_countdown(2.5, 0, rand=lambda: 1.0) == 3.75  # up to half again at random
    assert overload_countdown(1.0, 30, rand=lambda: 0.0) == RETRY_BACKOFF_MAX_S


def test_overloaded_survives_the_result_backend() -> None:
    """Celery rebuilds an exception as ``type(*args)``: Overloaded keeps every attribute."""
    import pickle

    err = pickle.loads(pickle.dumps(Overloaded("tenant:acme", "tokens", 9, 10, 1.0)))
    assert (err.scope, err.kind, err.current, err.limit, err.retry_after_s) == (
        "tenant:acme", "tokens", 9, 10, 1.0
    )  # fmt: skip
    assert type(err)(*err.args).limit == 10


def test_a_failed_job_is_not_retried(app: Celery) -> None:
    producer = ScriptedProducer(ending="error")
    with pytest.raises(GenerateFailed, match="prompt_too_long") as info:
        registered(app, producer).apply(kwargs={"prompt": "Sky"}).get()
    assert (info.value.state, info.value.code) == ("error", "prompt_too_long")
    assert len(producer.submits) == 1


def test_a_chain_renders_the_previous_text_into_the_template(app: Celery) -> None:
    producer = ScriptedProducer()
    task = registered(app, producer)
    flow = chain(task.s(prompt="Sky", max_tokens=1), task.s(template="Why{text}?", max_tokens=2))
    flow.apply().get()
    assert [s["prompt"] for s in producer.submits] == ["Sky", "Why blue?"]
    assert producer.submits[1]["max_tokens"] == 2
    assert "template" not in producer.submits[1]


def test_an_explicit_job_id_is_used(app: Celery) -> None:
    producer = ScriptedProducer()
    out = registered(app, producer).apply(kwargs={"prompt": "Sky", "job_id": "mine-1"}).get()
    assert producer.submits[0]["job_id"] == "mine-1"
    assert out["job_id"] == "mine-1"


def test_result_dict_is_json_and_lists_choices_only_when_several() -> None:
    result = JobResult("j1")
    result.apply(TokenEvent(index=0, text="a", token_ids=(1,)))
    out = result_dict(result)
    assert json.loads(json.dumps(out)) == out
    assert "choices" not in out and out["usage"] is None
    result.apply(TokenEvent(choice=1, index=0, text="b", token_ids=(2,)))
    assert [c["text"] for c in result_dict(result)["choices"]] == ["a", "b"]


def test_importing_producer_does_not_import_celery() -> None:
    code = "import sys, producer; assert 'celery' not in sys.modules, 'celery imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
