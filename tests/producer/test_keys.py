"""Key names: no valid job id can name a key of another job, or any key that is not its own.

Every key ``Keys`` builds is derived here by introspection (a method taking ``job_id`` builds a
per-job key; properties and the other methods build the rest), so a key added later is
checked without touching this file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.keys import BANDS, JOB_ID_PATTERN, MAX_JOB_ID_CHARS, Keys, is_valid_job_id

KEYS = Keys("pn")
# Ids that extend another by what a key name appends or nests: the collisions of old layouts.
SUFFIXES = (":events", ":job", ":x", ":events:events", ".events", "@events", "-events", ":")
NAMES = ("w1", "order-77", "order-77:events", "job:order-77", "events:order-77", "default", "")
job_ids = st.from_regex(JOB_ID_PATTERN, fullmatch=True)


def _members() -> Iterable[tuple[str, object]]:
    return ((n, m) for n, m in inspect.getmembers(Keys) if not n.startswith("_"))


def _params(member: object) -> list[str] | None:
    """A method's parameters after ``self``; None for what is not a method."""
    if not inspect.isfunction(member):
        return None
    return list(inspect.signature(member).parameters)[1:]


def job_key_builders() -> list[Callable[[str], str]]:
    """Each method of ``Keys`` that builds a key of one job from its id."""
    return [getattr(KEYS, name) for name, member in _members() if _params(member) == ["job_id"]]


def job_keys(job_id: str) -> set[str]:
    return {build(job_id) for build in job_key_builders()}


def other_keys(names: Iterable[str]) -> set[str]:
    """Every key that belongs to no job: the properties, and the builders of other names, called
    with ``names`` (bands with each band)."""
    out: set[str] = set()
    names = tuple(names)
    for name, member in _members():
        if isinstance(member, property):
            value = getattr(KEYS, name)
            out.update(value if isinstance(value, tuple) else [value])
            continue
        params = _params(member)
        if params is None or params == ["job_id"] or name == "pattern":
            continue
        assert len(params) == 1, f"Keys.{name}: teach this test its arguments"
        args = BANDS if params == ["band"] else names
        out.update(getattr(KEYS, name)(arg) for arg in args)
    return out


def test_every_job_key_is_found() -> None:
    assert {KEYS.job("a"), KEYS.events("a")} <= job_keys("a")
    assert KEYS.jobs in other_keys(()) and KEYS.worker("w1") in other_keys(["w1"])


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_ids_differing_by_a_suffix_share_no_key(suffix: str) -> None:
    base = "order-77"
    longer = base + suffix
    if not is_valid_job_id(longer):
        pytest.skip(f"{longer!r} is not a valid id")
    ours, theirs = job_keys(base), job_keys(longer)
    assert len(ours) == len(job_key_builders()) == len(theirs)  # no two of one job's coincide
    assert not ours & theirs, (base, longer)
    assert not (ours | theirs) & other_keys([*NAMES, base, longer])


suffixes = st.sampled_from(SUFFIXES) | st.from_regex(r"[A-Za-z0-9._:@-]{1,12}", fullmatch=True)


@given(job_ids, job_ids, suffixes)
def test_any_two_ids_share_no_key(a: str, b: str, suffix: str) -> None:
    """Two ids, and an id with one extended by any valid suffix."""
    for other in (b, (a + suffix)[:MAX_JOB_ID_CHARS]):
        if other != a:
            assert not job_keys(a) & job_keys(other), (a, other)


@given(job_ids, st.lists(st.text(max_size=20), max_size=3))
def test_job_keys_are_no_other_key(job_id: str, names: list[str]) -> None:
    assert not job_keys(job_id) & other_keys([*NAMES, *names, job_id])


def test_id_length_is_bounded() -> None:
    assert is_valid_job_id("a" * MAX_JOB_ID_CHARS)
    assert not is_valid_job_id("a" * (MAX_JOB_ID_CHARS + 1))
