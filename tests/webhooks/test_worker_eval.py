"""The worker's end-of-job MULTI runs the WEBHOOK script only for a job whose spec has a
webhook asking for its terminal event; such a job still gets exactly one delivery."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from producer import Producer
from producer.keys import Keys
from producer.protocol import JobSpec
from tests.service.conftest import running_worker, tiny_engine
from tests.webhooks.conftest import SECRET, Receiver, deliver_until, serving
from worker.engine.engine_request import EngineRequest
from worker.engine.sampling_params import SamplingParams
from worker.service.jobs import ActiveJob, AdmittedJob
from worker.service.publisher import Command


def _ended(terminal_webhook: bool) -> list[str]:
    request = EngineRequest("j", (1, 2, 3), SamplingParams(), tenant="t")
    admitted = AdmittedJob(request, "1-0", "p:jobs", 100.0, 100.5, 0.0,
                           terminal_webhook=terminal_webhook)  # fmt: skip
    job = ActiveJob(admitted, Keys("p"), stream_interval=4, result_ttl_s=60)
    return [c.name for c in job.fail("internal", "boom")]


def test_end_commands_carry_the_eval_only_for_a_terminal_webhook() -> None:
    assert _ended(True) == ["XADD", "HSET", "EVAL", "EXPIRE", "EXPIRE", "XACK", "XDEL"]
    assert _ended(False) == ["XADD", "HSET", "EXPIRE", "EXPIRE", "XACK", "XDEL"]


def _spec(prompt: str, webhook: dict[str, Any] | None) -> JobSpec:
    sampling = {"max_tokens": 3, "temperature": 0.0}
    return JobSpec.model_validate({"prompt": prompt, "sampling": sampling, "webhook": webhook})


def _eval_keys(commands: Sequence[Command]) -> list[str]:
    """The status hash (KEYS[1]) of each EVAL: the job whose webhook it enqueues."""
    return [str(c.args[2]) for c in commands if c.name == "EVAL"]


@pytest.mark.slow
def test_a_worker_evals_only_for_the_job_with_a_webhook(
    tiny_model_dir: Path,
    redis_url: str,
    key_prefix: str,
    client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = Keys(key_prefix)
    receiver = Receiver()
    sent: list[Command] = []
    with serving(receiver) as url:
        hooked = _spec("with a webhook", {"url": url, "secret": SECRET})
        plain = _spec("without one", None)
        started_only = _spec("started only", {"url": url, "secret": SECRET, "events": ["started"]})
        with running_worker(tiny_engine(tiny_model_dir), redis_url, key_prefix) as worker:
            publish = worker.publisher.publish

            def recording(commands: Sequence[Command]) -> None:
                sent.extend(commands)
                publish(commands)

            monkeypatch.setattr(worker.publisher, "publish", recording)
            with Producer(redis_url, prefix=key_prefix) as producer:
                handles = [producer.submit_spec(s) for s in (hooked, plain, started_only)]
                for handle in handles:
                    handle.result(timeout_s=60)
        expected = {hooked.id: 1, started_only.id: 1}  # the started one comes from CLAIM

        def done() -> bool:
            return receiver.by_job() == expected and client.xlen(keys.webhooks) == 0

        asyncio.run(deliver_until(redis_url, key_prefix, done, timeout_s=20))
    assert _eval_keys(sent) == [keys.job(hooked.id)]
    assert receiver.by_job() == expected and receiver.bad == 0
    types = {body["data"]["job_id"]: body["type"] for body in receiver.verified.values()}
    assert types == {hooked.id: "job.done", started_only.id: "job.started"}
    assert client.xlen(keys.webhook_dead) == 0
