"""Admission limits in the SUBMIT script, against a real Redis: refusals enqueue nothing, the load
counters go back to zero whichever way a job leaves ``queued``, and concurrent producers never
take a scope past its limit."""

from __future__ import annotations

import threading

import pytest
import redis

from producer import JobSpec, Keys, Producer
from producer.admission import (
    RETRY_AFTER_S,
    Cap,
    Limits,
    band_scope,
    clear_limits,
    estimate_cost_tokens,
    read_limits,
    read_load,
    set_limits,
    tenant_scope,
    write_limits,
)
from producer.errors import InvalidJob, Overloaded, PaternosterError
from producer.keys import BANDS
from producer.protocol import PRIORITY_ALIASES, parse_priority
from producer.requests import build_spec
from tests.producer.fake_worker import FakeWorker

# "abcdefgh" is 8 UTF-8 bytes: 2 estimated prompt tokens, plus max_tokens 8: 10 per job.
PROMPT, MAX_TOKENS, COST = "abcdefgh", 8, 10


def loads(
    client: redis.Redis, keys: Keys, band: str = "default", tenant: str = "default"
) -> tuple[Cap, Cap]:
    return read_load(client, keys.band_load(band)), read_load(client, keys.tenant_load(tenant))


def test_estimate_cost_tokens() -> None:
    assert estimate_cost_tokens(build_spec(PROMPT, max_tokens=MAX_TOKENS)) == COST
    assert estimate_cost_tokens(build_spec("abcdefghi", max_tokens=1, n=3)) == 3 + 3
    assert estimate_cost_tokens(build_spec(prompt_token_ids=[1, 2, 3], max_tokens=2)) == 5
    assert estimate_cost_tokens(build_spec("é" * 4, max_tokens=1)) == 2 + 1  # 8 bytes
    chat = build_spec(messages=[{"role": "user", "content": "abcd"}] * 2, max_tokens=1)
    assert estimate_cost_tokens(chat) == 2 + 2 * 4 + 1


def test_limits_round_trip_through_the_hash(client: redis.Redis, keys: Keys) -> None:
    limits = Limits(
        bands={"interactive": Cap(100, 50_000), "batch": Cap(tokens=10)},
        tenant_default=Cap(jobs=20),
        tenants={"acme": Cap(5, 500), "a:b": Cap(jobs=0)},
    )
    write_limits(client, keys, limits)
    assert client.hgetall(keys.limits) == {
        "band:interactive:jobs": "100",
        "band:interactive:tokens": "50000",
        "band:batch:tokens": "10",
        "tenant:*:jobs": "20",
        "tenant:acme:jobs": "5",
        "tenant:acme:tokens": "500",
        "tenant:a:b:jobs": "0",
    }
    assert read_limits(client, keys) == limits
    set_limits(client, keys, tenant_scope("acme"), Cap(tokens=600))
    set_limits(client, keys, band_scope("default"), Cap(jobs=3))
    got = read_limits(client, keys)
    assert got.tenants["acme"] == Cap(5, 600) and got.bands["default"] == Cap(jobs=3)
    clear_limits(client, keys, band_scope("interactive"))
    assert "interactive" not in read_limits(client, keys).bands
    clear_limits(client, keys)
    assert read_limits(client, keys) == Limits() and not client.exists(keys.limits)
    with pytest.raises(ValueError, match="unknown band"):
        band_scope("urgent")


def test_priority_aliases_choose_the_band_stream(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    assert PRIORITY_ALIASES == {"interactive": -10, "default": 0, "batch": 10}
    assert [parse_priority(p) for p in ("interactive", "Batch", "-3", 7)] == [-10, 10, -3, 7]
    for band in BANDS:
        producer.submit("x", job_id=f"j-{band}", priority=band)
        [(_, fields)] = client.xrange(keys.band(band))
        assert fields["id"] == f"j-{band}"
        status = producer.status(f"j-{band}")
        assert (status.band, status.priority) == (band, PRIORITY_ALIASES[band])
    assert producer.submit("x", priority=9).status().band == "default"
    assert producer.submit("x", priority=-1).status().band == "interactive"
    with pytest.raises(InvalidJob, match=r"unknown priority 'urgent'.*interactive, default, batch"):
        producer.submit("x", priority="urgent")
    with pytest.raises(InvalidJob, match="priority"):
        producer.submit("x", priority=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidJob, match="priority"):
        producer.submit("x", priority=101)


@pytest.mark.parametrize(
    ("limit_field", "scope", "kind", "current", "limit"),
    [
        ("band:default:jobs", "band:default", "jobs", 2, 2),
        ("band:default:tokens", "band:default", "tokens", 2 * COST, 2 * COST + COST - 1),
        ("tenant:*:jobs", "tenant:acme", "jobs", 2, 2),
        ("tenant:*:tokens", "tenant:acme", "tokens", 2 * COST, 2 * COST),
        ("tenant:acme:jobs", "tenant:acme", "jobs", 2, 2),
        ("tenant:acme:tokens", "tenant:acme", "tokens", 2 * COST, 3 * COST - 1),
    ],
)
def test_each_limit_refuses_and_enqueues_nothing(
    producer: Producer,
    client: redis.Redis,
    keys: Keys,
    limit_field: str,
    scope: str,
    kind: str,
    current: int,
    limit: int,
) -> None:
    client.hset(keys.limits, limit_field, limit)
    for i in range(2):
        producer.submit(PROMPT, max_tokens=MAX_TOKENS, tenant="acme", job_id=f"ok-{i}")
    with pytest.raises(Overloaded) as info:
        producer.submit(PROMPT, max_tokens=MAX_TOKENS, tenant="acme", job_id="refused")
    err = info.value
    assert isinstance(err, PaternosterError)
    assert (err.scope, err.kind, err.current, err.limit) == (scope, kind, current, limit)
    assert err.retry_after_s == RETRY_AFTER_S
    assert scope in str(err) and f"limit {limit}" in str(err)
    assert not client.exists(keys.job("refused"))
    assert client.xlen(keys.jobs) == 2
    assert client.lrange(keys.recent, 0, -1) == ["ok-1", "ok-0"]
    assert loads(client, keys, tenant="acme") == (Cap(2, 2 * COST), Cap(2, 2 * COST))
    # Another tenant, or another band, is not limited by it.
    other = {"tenant": "other"} if scope.startswith("tenant") else {"priority": "batch"}
    assert producer.submit(PROMPT, max_tokens=MAX_TOKENS, **other).created  # type: ignore[arg-type]


def test_a_tenant_limit_of_its_own_replaces_the_default(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    write_limits(client, keys, Limits(tenant_default=Cap(jobs=1), tenants={"big": Cap(jobs=3)}))
    for _ in range(3):
        producer.submit("x", tenant="big")
    producer.submit("x", tenant="small")
    with pytest.raises(Overloaded, match="tenant:small"):
        producer.submit("x", tenant="small")
    with pytest.raises(Overloaded, match="tenant:big"):
        producer.submit("x", tenant="big")


def test_a_job_larger_than_a_tokens_limit_is_admitted_into_an_empty_queue(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    client.hset(keys.limits, mapping={"band:default:tokens": 5, "band:batch:jobs": 0})
    assert producer.submit("x", max_tokens=100).created  # else it could never be admitted
    with pytest.raises(Overloaded, match="tokens"):
        producer.submit("x", max_tokens=1)
    with pytest.raises(Overloaded, match="band:batch has 0 jobs queued, limit 0"):
        producer.submit("x", priority="batch")  # a jobs limit of 0 closes the band


def test_resubmitting_an_id_does_not_count_twice(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    client.hset(keys.limits, "band:default:jobs", 1)
    assert producer.submit(PROMPT, max_tokens=MAX_TOKENS, job_id="same").created
    again = producer.submit(PROMPT, max_tokens=MAX_TOKENS, job_id="same")  # full, but it exists
    assert not again.created
    assert loads(client, keys) == (Cap(1, COST), Cap(1, COST))
    assert client.lrange(keys.recent, 0, -1) == ["same"]


def test_the_recent_list_keeps_the_newest_100(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    for i in range(105):
        producer.submit("x", job_id=f"r{i}")
    recent = client.lrange(keys.recent, 0, -1)
    assert len(recent) == 100 and recent[0] == "r104" and recent[-1] == "r5"


def test_counters_return_to_zero_whichever_way_a_job_leaves_queued(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    for name in ("start", "reject", "expire", "cancel"):
        deadline = 1.0 if name == "expire" else None
        producer.submit(PROMPT, max_tokens=MAX_TOKENS, job_id=name, tenant="t", deadline=deadline)
    assert loads(client, keys, tenant="t") == (Cap(4, 4 * COST), Cap(4, 4 * COST))
    assert producer.cancel("cancel") == "cancelled"
    assert loads(client, keys, tenant="t") == (Cap(3, 3 * COST), Cap(3, 3 * COST))
    assert worker.take().outcome == "started"
    got = worker.read()
    assert (
        got is not None
        and worker.reject(got[0], "reject", "invalid_prompt", "x").outcome == "rejected"
    )
    assert worker.take().outcome == "expired"
    assert loads(client, keys, tenant="t") == (Cap(0, 0), Cap(0, 0))
    # The cancelled job's entry is skipped without giving anything back twice; so is a second
    # cancel, and a cancel of the running job.
    assert worker.take().outcome == "cancelled"
    assert producer.cancel("cancel") == "cancelled"
    assert producer.cancel("start") == "cancelling"
    assert loads(client, keys, tenant="t") == (Cap(0, 0), Cap(0, 0))


def test_a_bare_xadd_job_has_no_load_to_give_back(
    producer: Producer, client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    client.xadd(
        keys.jobs, {"id": "raw", "payload": JobSpec(id="raw", prompt="x").model_dump_json()}
    )
    assert worker.take().outcome == "started"
    assert not client.exists(keys.band_load("default"), keys.tenant_load("default"))


def test_claim_derives_the_load_keys_from_the_prefix(keys: Keys) -> None:
    from producer import scripts

    assert (
        "prefix .. ':load:band:'" in scripts.CLAIM and "prefix .. ':load:tenant:'" in scripts.CLAIM
    )
    assert keys.band_load("batch") == keys.prefix + ":load:band:" + "batch"
    assert keys.tenant_load("acme") == keys.prefix + ":load:tenant:" + "acme"


@pytest.mark.parametrize("kind", ["jobs", "tokens"])
def test_concurrent_producers_never_overshoot(
    redis_url: str, key_prefix: str, client: redis.Redis, keys: Keys, kind: str
) -> None:
    limit = 100 if kind == "jobs" else 100 * COST
    client.hset(keys.limits, f"band:interactive:{kind}", limit)
    accepted, refused = [], []
    lock = threading.Lock()

    def submitter(t: int) -> None:
        with Producer(redis_url, prefix=key_prefix) as p:
            for i in range(40):
                try:
                    p.submit(
                        PROMPT, max_tokens=MAX_TOKENS, priority="interactive", job_id=f"c{t}-{i}"
                    )
                    outcome = accepted
                except Overloaded:
                    outcome = refused
                with lock:
                    outcome.append(f"c{t}-{i}")

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(accepted), len(refused)) == (100, 220)
    assert client.xlen(keys.band("interactive")) == 100
    assert read_load(client, keys.band_load("interactive")) == Cap(100, 100 * COST)
    assert sum(client.exists(keys.job(j)) for j in refused) == 0
