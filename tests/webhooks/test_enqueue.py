"""Each script that ends (or starts) a job enqueues its webhook delivery in the same step."""

from __future__ import annotations

from typing import Any

from producer import Producer, scripts
from producer.keys import Keys
from producer.protocol import ErrorEvent, JobSpec, event_fields
from producer.webhook_lua import Hook, webhook_args, webhook_keys
from tests.webhooks.conftest import SECRET

URL = "http://127.0.0.1:9/hook"


def _submit(redis_url: str, prefix: str, events: list[str] | None) -> str:
    hook = None if events is None else {"url": URL, "secret": SECRET, "events": events}
    spec = JobSpec.model_validate({"prompt": "x", "webhook": hook})
    with Producer(redis_url, prefix=prefix) as p:
        p.submit_spec(spec)
    return spec.id


def _taken(client: Any, keys: Keys) -> str:
    """The default band's entry, read by worker w1 as a worker reads it."""
    client.xgroup_create(keys.jobs, keys.group, id="0", mkstream=True)
    ((_stream, ((entry_id, _fields),)),) = client.xreadgroup(keys.group, "w1", {keys.jobs: ">"})
    return str(entry_id)


def _queued(client: Any, keys: Keys) -> list[tuple[str, str]]:
    return [(f["id"], f["event"]) for _eid, f in client.xrange(keys.webhooks)]


def test_claim_enqueues_started_and_reclaim_the_dead_letter_end(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    keys = Keys(key_prefix)
    job_id = _submit(redis_url, key_prefix, ["terminal", "started"])
    entry_id = _taken(client, keys)
    claim = client.register_script(scripts.CLAIM)
    args = scripts.claim_args(
        keys, action=scripts.ClaimAction.START, worker="w1", entry_id=entry_id, ttl_s=60
    )
    assert claim(keys=scripts.claim_keys(keys, job_id, keys.jobs), args=args)[0] == "started"
    assert _queued(client, keys) == [(job_id, "started")]
    ((_, fields),) = client.xrange(keys.webhooks)
    assert fields["submitted_at"] == client.hget(keys.job(job_id), "submitted_at")
    error = event_fields(ErrorEvent(code="dead_letter", message="gave up"))["data"]
    reclaim = client.register_script(scripts.RECLAIM)
    reclaim_keys = [keys.job(job_id), keys.events(job_id), keys.jobs, keys.dead_letter]
    reply = reclaim(
        keys=reclaim_keys,
        args=["w2", "w1", 1, 60, error, keys.group, entry_id, job_id, "{}"],
    )
    assert reply[0] == "dead_letter"
    assert _queued(client, keys) == [(job_id, "started"), (job_id, "terminal")]


def test_a_rejected_job_enqueues_its_end_and_started_only_when_asked(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    keys = Keys(key_prefix)
    job_id = _submit(redis_url, key_prefix, None)  # no webhook: nothing, ever
    entry_id = _taken(client, keys)
    job_id2 = _submit(redis_url, key_prefix, ["terminal"])
    ((_s, ((entry2, _f),)),) = client.xreadgroup(keys.group, "w1", {keys.jobs: ">"})
    claim = client.register_script(scripts.CLAIM)
    for jid, eid in ((job_id, entry_id), (job_id2, entry2)):
        args = scripts.claim_args(
            keys,
            action=scripts.ClaimAction.START,
            worker="w1",
            entry_id=eid,
            ttl_s=60,
        )
        claim(keys=scripts.claim_keys(keys, jid, keys.jobs), args=args)
    assert _queued(client, keys) == []  # started was not asked for
    webhook = client.register_script(scripts.WEBHOOK)
    for jid in (job_id, job_id2):
        webhook(keys=webhook_keys(keys, jid), args=webhook_args(keys, Hook.TERMINAL))
    assert _queued(client, keys) == [(job_id2, "terminal")]


def test_a_webhook_asking_only_for_started_gets_no_end(
    redis_url: str, key_prefix: str, client: Any
) -> None:
    keys = Keys(key_prefix)
    job_id = _submit(redis_url, key_prefix, ["started"])
    with Producer(redis_url, prefix=key_prefix) as p:
        assert p.cancel(job_id) == "cancelled"
    assert _queued(client, keys) == []
    assert "secret" in client.hget(keys.job(job_id), "webhook")  # kept for the deliverer only
    with Producer(redis_url, prefix=key_prefix) as p:
        assert "webhook" not in p.status(job_id).model_dump()
