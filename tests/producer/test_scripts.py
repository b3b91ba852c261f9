"""The Lua scripts as files: generated from the Python declarations, agreeing with the Python
that computes the same (keys, bands, costs), and SUBMIT refusing calls that contradict their
payload. Against a real Redis."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer import lua_prelude, scripts
from producer.admission import estimate_cost_tokens
from producer.keys import BANDS, Keys, band_of
from producer.protocol import EVENT_TYPES, JobSpec
from producer.requests import submit_args, submit_keys
from producer.results import JobStatus
from producer.status import EntryField, JobState, StatusField
from tests.producer.fake_worker import FakeWorker


def body(text: str) -> str:
    return lua_prelude.split(text)[1]


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_the_shipped_files_hold_what_the_declarations_generate(name: str) -> None:
    assert scripts.shipped(f"{name}.lua") == scripts.load(name), (
        f"producer/lua/{name}.lua is stale: run "
        "python -c 'from producer.scripts import write_files; write_files()'"
    )


def test_the_scripts_spell_no_state_field_or_event_type_by_hand() -> None:
    declared = {*JobState, *StatusField, *EntryField, *EVENT_TYPES}
    for text in (scripts.SUBMIT, scripts.CANCEL, scripts.CLAIM, scripts.RECLAIM):
        code = "\n".join(line.split("--")[0] for line in body(text).splitlines())
        assert not [w for w in re.findall(r"'([a-z_]+)'", code) if w in declared]


def test_a_prelude_refuses_a_name_nobody_declared() -> None:
    with pytest.raises(ValueError, match=r"State\.RUNING is not declared"):
        lua_prelude.prelude("return State.RUNING", scripts.declarations("claim"))


def test_lua_literals_escape_what_lua_would_misread() -> None:
    assert lua_prelude.literal("it's") == "'it\\039s'"
    assert lua_prelude.literal("é") == "'\\195\\169'"
    assert lua_prelude.literal(-10) == "-10"


def evaluate(client: redis.Redis, *names: str, tail: str, args: list[Any]) -> Any:
    """Run generated definitions, then ``tail``, in Redis."""
    code = "\n".join(scripts.definitions()[n] for n in names)
    return client.eval(f"{code}\n{tail}", 0, *args)


def test_the_lua_band_of_is_keys_band_of(client: redis.Redis) -> None:
    tail = "local out = {} for p = -100, 100 do out[#out + 1] = band_of(p) end return out"
    assert evaluate(client, "band_of", tail=tail, args=[]) == [band_of(p) for p in range(-100, 101)]


def test_the_lua_key_names_are_keys_names(client: redis.Redis) -> None:
    keys = Keys("pre:fix")
    tail = (
        "return {job_key(ARGV[1], 'a:b'), band_load_key(ARGV[1], 'batch'),"
        " tenant_load_key(ARGV[1], 'acme'), limits_key(ARGV[1]), recent_key(ARGV[1]),"
        " band_stream(ARGV[1], 'interactive'), band_stream(ARGV[1], 'default')}"
    )
    names = ["job_key", "band_load_key", "tenant_load_key", "limits_key", "recent_key"]
    got = evaluate(client, *names, "band_stream", tail=tail, args=[keys.prefix])
    assert got == [
        keys.job("a:b"),
        keys.band_load("batch"),
        keys.tenant_load("acme"),
        keys.limits,
        keys.recent,
        keys.band("interactive"),
        keys.band("default"),
    ]


def lua_cost(client: redis.Redis, keys: Keys, spec: JobSpec) -> int:
    """What SUBMIT computes as the cost: asked with a wrong one, it says and writes nothing."""
    args = submit_args(spec)
    args[5] = "-1"
    with pytest.raises(redis.ResponseError) as refused:
        client.eval(scripts.SUBMIT, 6, *submit_keys(keys, spec), *args)
    found = re.search(
        r'ARGV\[6\] \(cost\) is "-1"; the payload makes it "([0-9]+)"', str(refused.value)
    )
    assert found, str(refused.value)
    return int(found.group(1))


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
specs = st.one_of(
    st.builds(lambda p: {"prompt": p}, text),
    st.builds(
        lambda cs: {"messages": [{"role": "user", "content": c} for c in cs]},
        st.lists(text, min_size=1, max_size=4),
    ),
    st.builds(lambda ids: {"prompt_token_ids": ids}, st.lists(st.integers(0, 9), max_size=9)),
)


# The fixtures are shared by the examples: each leaves Redis as it found it.
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    prompt=specs,
    max_tokens=st.integers(1, 5000),
    n=st.integers(1, 16),
    defaults=st.booleans(),
)
def test_submit_counts_the_cost_estimate_cost_tokens_counts(
    client: redis.Redis, keys: Keys, prompt: dict[str, Any], max_tokens: int, n: int, defaults: bool
) -> None:
    sampling = {} if defaults else {"sampling": {"max_tokens": max_tokens, "n": n}}
    spec = JobSpec.model_validate({**prompt, **sampling})
    assert lua_cost(client, keys, spec) == estimate_cost_tokens(spec)
    assert not client.exists(keys.job(spec.id))


def test_the_docs_messages_cost_example() -> None:
    spec = JobSpec.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            "sampling": {"max_tokens": 8, "n": 2},
        }
    )
    assert estimate_cost_tokens(spec) == 27


def call_submit(client: redis.Redis, keys: list[str], args: list[str]) -> Any:
    return client.eval(scripts.SUBMIT, len(keys), *keys, *args)


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ("args", (0, "other-id"), "ARGV[1] (job id)"),
        ("args", (2, "-3"), "ARGV[3] (priority)"),
        ("args", (3, "acme"), "ARGV[4] (tenant)"),
        ("args", (4, "batch"), "ARGV[5] (band)"),
        ("args", (5, "1"), "ARGV[6] (cost)"),
        ("keys", (1, "elsewhere:jobs"), "KEYS[2]"),
        ("keys", (2, "x:load:band:interactive"), "KEYS[3]"),
        ("keys", (3, "x:load:tenant:acme"), "KEYS[4]"),
        ("keys", (4, "x:limits"), "KEYS[5]"),
        ("keys", (5, "x:recent"), "KEYS[6]"),
    ],
)
def test_submit_refuses_arguments_the_payload_contradicts(
    client: redis.Redis, keys: Keys, where: str, value: tuple[int, str], named: str
) -> None:
    spec = JobSpec(id="j-1", prompt="Hi", priority=-5, tenant="t")
    call_keys, args = submit_keys(keys, spec), submit_args(spec)
    (call_keys if where == "keys" else args)[value[0]] = value[1]
    with pytest.raises(redis.ResponseError, match=re.escape(f"SUBMIT refused: {named} is")):
        call_submit(client, call_keys, args)
    assert not client.keys(keys.pattern())
    assert call_submit(client, submit_keys(keys, spec), submit_args(spec))[0] == 1


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ("not json", "the payload is not a JSON object"),
        ('"a string"', "the payload is not a JSON object"),
        ('{"prompt": "Hi"}', "the payload has no id"),
        ('{"id": "j-2", "prompt": 7}', "the payload's prompt is not a string"),
        ('{"id": "j-2", "prompt": "Hi", "priority": 1.5}', "priority is no integer"),
        ('{"id": "j-2", "messages": ["Hi"]}', "messages are not all objects"),
        ('{"id": "j-2", "prompt": "x", "sampling": {"n": "2"}}', "n is not a number"),
    ],
)
def test_submit_refuses_a_payload_it_cannot_read(
    client: redis.Redis, keys: Keys, payload: str, problem: str
) -> None:
    spec = JobSpec(id="j-2", prompt="Hi")
    args = submit_args(spec)
    args[1] = payload
    with pytest.raises(redis.ResponseError, match=re.escape(problem)):
        call_submit(client, submit_keys(keys, spec), args)
    assert not client.keys(keys.pattern())


def test_submit_takes_defaults_and_nulls_as_the_python_model_does(
    client: redis.Redis, keys: Keys
) -> None:
    payload = {"id": "j-3", "prompt": None, "messages": [{"role": "user", "content": "Hé"}]}
    spec = JobSpec.model_validate(payload)
    args = [
        spec.id,
        json.dumps(payload),
        "0",
        "default",
        "default",
        str(estimate_cost_tokens(spec)),
    ]
    assert call_submit(client, submit_keys(keys, spec), args)[0] == 1
    status = JobStatus.from_hash(spec.id, client.hgetall(keys.job(spec.id)))  # type: ignore[arg-type]
    assert (status.priority, status.tenant, status.band) == (0, "default", "default")
    assert status.cost_tokens == estimate_cost_tokens(spec) == 1 + 4 + 16


def test_claim_writes_the_started_event_python_built(
    client: redis.Redis, keys: Keys, worker: FakeWorker
) -> None:
    spec = JobSpec(id="j-4", prompt="Hi")
    call_submit(client, submit_keys(keys, spec), submit_args(spec))
    job = worker.take()
    assert job.outcome == "started"
    ((_, fields),) = client.xrange(keys.events(spec.id))  # type: ignore[misc]
    started = json.loads(fields["data"])
    assert started == {"type": "started", "worker": worker.name, "queued_s": started["queued_s"]}
    assert started["queued_s"] == pytest.approx(job.started_at - job.submitted_at, abs=1e-5)


def test_claim_to_start_needs_the_started_event(client: redis.Redis, keys: Keys) -> None:
    args = scripts.claim_args(
        keys, action=scripts.ClaimAction.START, worker="w", entry_id="1-0", ttl_s=60
    )
    with pytest.raises(redis.ResponseError, match="ARGV\\[10\\], the started event, is missing"):
        client.eval(scripts.CLAIM, 3, *scripts.claim_keys(keys, "j-5", keys.jobs), *args[:9])
    assert not client.keys(keys.pattern())


def test_every_status_field_a_reader_types_is_declared() -> None:
    assert set(JobStatus.model_fields) - {"job_id"} <= set(StatusField)


def test_every_band_has_a_floor_but_the_first() -> None:
    from producer.keys import BAND_FLOORS

    assert tuple(BAND_FLOORS) == BANDS[1:]
    assert list(BAND_FLOORS.values()) == sorted(BAND_FLOORS.values())
    assert [band_of(p) for p in (-1, 0, 9, 10)] == ["interactive", "default", "default", "batch"]
