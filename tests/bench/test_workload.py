"""The load generator's workload (``ops/bench/workload.py``) and the paged-vs-contiguous KV
accounting (``ops/bench/kv_memory.py``): pure functions, milliseconds, no model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_script as load

wl = load("workload")
kv = load("kv_memory")


def test_same_seed_same_jobs_other_seed_differs() -> None:
    mix = wl.load_mix(wl.DEFAULT_MIX)
    a = wl.generate(mix, rate_per_s=2.0, num_jobs=50, seed=7)
    assert a == wl.generate(mix, rate_per_s=2.0, num_jobs=50, seed=7)
    assert a != wl.generate(mix, rate_per_s=2.0, num_jobs=50, seed=8)
    # The same jobs at another rate: only the arrivals move.
    b = wl.generate(mix, rate_per_s=0.5, num_jobs=50, seed=7)
    assert [dataclasses.replace(j, arrival_s=0.0) for j in a] == [
        dataclasses.replace(j, arrival_s=0.0) for j in b
    ]
    assert b[-1].arrival_s > a[-1].arrival_s


def test_shares_lengths_priorities_and_cancels_follow_the_mix() -> None:
    mix = wl.load_mix(wl.DEFAULT_MIX)
    jobs = wl.generate(mix, rate_per_s=5.0, num_jobs=4000, seed=1, scale=0.1)
    total_weight = sum(c.weight for c in mix.classes)
    for c in mix.classes:
        mine = [j for j in jobs if j.klass == c.name]
        # 4000 draws: one standard deviation of a 0.6 share is 0.8 points; allow ~4.
        assert abs(len(mine) / len(jobs) - c.weight / total_weight) < 0.03
        p_lo, p_hi = wl.scaled_range(c.prompt_len, 0.1)
        o_lo, o_hi = wl.scaled_range(c.output_len, 0.1)
        assert all(p_lo <= len(j.prompt_token_ids) <= p_hi for j in mine)
        assert all(o_lo <= j.max_tokens <= o_hi for j in mine)
        assert {j.priority for j in mine} == {c.priority}
        assert {j.tenant for j in mine} <= set(c.tenants)
        cancelled = [j for j in mine if j.cancel_after_tokens is not None]
        assert abs(len(cancelled) / len(mine) - c.cancel_fraction) < 0.05
        assert all(1 <= j.cancel_after_tokens < j.max_tokens for j in cancelled)
    assert {j.priority for j in jobs} == {-10, 0, 10}  # aliases interactive, default, batch
    assert all(0 <= t < 49152 for j in jobs[:50] for t in j.prompt_token_ids)


def test_scale_shrinks_lengths() -> None:
    mix = wl.load_mix(wl.DEFAULT_MIX)
    full = wl.generate(mix, rate_per_s=1.0, num_jobs=300, seed=2)
    small = wl.generate(mix, rate_per_s=1.0, num_jobs=300, seed=2, scale=0.1)
    assert max(len(j.prompt_token_ids) for j in full) > 1000
    assert max(len(j.prompt_token_ids) for j in small) <= 205  # 2048 * 0.1, rounded
    assert max(j.max_tokens for j in small) <= 102
    assert sum(j.max_tokens for j in small) < 0.15 * sum(j.max_tokens for j in full)


def test_arrivals_sorted_mean_rate_and_bursts() -> None:
    mix = wl.load_mix(wl.DEFAULT_MIX)
    a = mix.arrivals  # 10 s of every 60 at 4x the mean rate
    jobs = wl.generate(mix, rate_per_s=2.0, duration_s=3000.0, seed=3, scale=0.01)
    times = [j.arrival_s for j in jobs]
    assert times == sorted(times) and times[-1] < 3000.0
    assert abs(len(jobs) / 3000.0 - 2.0) < 0.15  # ~6000 arrivals: sd ~1.3%
    in_burst = sum(a.in_burst(t) for t in times)
    burst_rate = in_burst / (3000.0 * a.burst_len_s / a.burst_every_s)
    quiet_rate = (len(jobs) - in_burst) / (3000.0 * (1 - a.burst_len_s / a.burst_every_s))
    assert burst_rate > 3.0 * 2.0 and quiet_rate < 2.0
    assert abs(burst_rate - 8.0) < 0.8
    assert not any(a.in_burst(t) for t in times if t < 50.0)  # the first period starts quiet


def test_generate_arguments_are_checked() -> None:
    mix = wl.load_mix(wl.DEFAULT_MIX)
    with pytest.raises(ValueError, match="exactly one"):
        wl.generate(mix, rate_per_s=1.0, seed=0)
    with pytest.raises(ValueError, match="exactly one"):
        wl.generate(mix, rate_per_s=1.0, num_jobs=3, duration_s=3.0)


BAD_MIXES = [
    ("{", "not JSON"),
    ('{"classes": []}', "non-empty 'classes'"),
    ('{"classes": [{"name": "a", "weight": 1, "prompt_len": [8, 4], "output_len": [1, 2]}]}',
     "prompt_len must satisfy"),
    ('{"classes": [{"name": "a", "weight": 1, "prompt_len": [1, 4]}]}',
     "missing field 'output_len'"),
    ('{"classes": [{"name": "a", "weight": 1, "prompt_len": [1, 4], "output_len": [1, 2], '
     '"priority": "urgent"}]}', "unknown priority 'urgent'"),
    ('{"classes": [{"name": "a", "weight": 1, "prompt_len": [1, 4], "output_len": [1, 2], '
     '"cancel_fraction": 2}]}', "cancel_fraction must be in"),
    ('{"classes": [{"name": "a", "weight": 1, "prompt_len": [1, 4], "output_len": [1, 2], '
     '"colour": 1}]}', "unknown fields \\['colour'\\]"),
    ('{"arrivals": {"burst_every_s": 10, "burst_len_s": 5, "burst_factor": 3}, "classes": '
     '[{"name": "a", "weight": 1, "prompt_len": [1, 4], "output_len": [1, 2]}]}', "quiet rate"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD_MIXES)
def test_bad_mix_file_says_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mix.json"
    path.write_text(text)
    with pytest.raises(wl.MixError, match=message) as info:
        wl.load_mix(path)
    assert str(path) in str(info.value)
    with pytest.raises(wl.MixError, match="no such mix file"):
        wl.load_mix(tmp_path / "missing.json")


def test_a_users_mix_round_trips(tmp_path: Path) -> None:
    raw = json.loads(wl.DEFAULT_MIX.read_text())
    raw["classes"] = raw["classes"][:1]
    (tmp_path / "mine.json").write_text(json.dumps(raw))
    mix = wl.load_mix(tmp_path / "mine.json")
    assert [c.name for c in mix.classes] == ["chat"]
    assert {j.klass for j in wl.generate(mix, rate_per_s=1.0, num_jobs=20, seed=0)} == {"chat"}


def test_kv_memory_on_a_hand_made_trace() -> None:
    # A: prompt 10, 6 tokens at t = 0..5, ends at 6: holds 11, 12, ..., 16 for 1 s each = 81.
    # B: prompt 20, 4 tokens at t = 0..3, ends at 5: holds 21, 22, 23, then 24 for 2 s = 114.
    a = kv.JobTrace(10, 6, (0.0, 1.0, 2.0, 3.0, 4.0, 5.0), 6.0)
    b = kv.JobTrace(20, 4, (0.0, 1.0, 2.0, 3.0), 5.0)
    usage = kv.kv_usage([a, b], block_size=16, context_len=64)
    assert usage["held_token_seconds"] == 81 + 114
    # Paged, blocks of 16: A one block (16) for 6 s = 96; B two blocks (32) for 5 s = 160.
    assert usage["paged"]["reserved_token_seconds"] == 96 + 160
    assert usage["paged"]["useful_fraction"] == pytest.approx(195 / 256)
    # Contiguous at prompt + max_tokens: A 16 x 6 s, B 24 x 5 s.
    assert usage["contiguous_max_tokens"]["useful_fraction"] == pytest.approx(195 / 216)
    # Contiguous at the context (64) for both lives: 64 x 11 s.
    assert usage["contiguous_context"]["useful_fraction"] == pytest.approx(195 / 704)
    assert usage["peak_held_tokens"] == 15 + 24  # t = 4; at 5 B ends as A grows to 16
    assert usage["paged"]["peak_reserved_tokens"] == 48  # 16 + 32 while both live
    assert usage["contiguous_context"]["peak_reserved_tokens"] == 128


def test_kv_memory_from_records_skips_jobs_without_tokens() -> None:
    rec = {"prompt_tokens": 3, "max_tokens": 2, "token_times_s": [1.0, 2.0], "end_s": 4.0}
    empty = {"prompt_tokens": 3, "max_tokens": 2, "token_times_s": [], "end_s": 0.5}
    usage = kv.from_run([rec, empty], block_size=4, context_len=8)
    assert usage["jobs"] == 1
    # Holds 4 (1 s) then 5 (2 s) = 14; paged 4 then 8 slots = 20; contiguous 5 x 3 s = 15.
    assert usage["paged"]["useful_fraction"] == pytest.approx(14 / 20)
    assert usage["contiguous_max_tokens"]["useful_fraction"] == pytest.approx(14 / 15)
    assert usage["contiguous_context"]["useful_fraction"] == pytest.approx(14 / 24)
