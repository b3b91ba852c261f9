"""The service's small parts on their own: the claim script's typed outcomes, the early
cancels, and the configs the CLI builds from the flags declared beside them."""

from __future__ import annotations

import dataclasses

import pytest

from worker.cli import build_parser
from worker.engine.config import EngineConfig, parse_tenant_weights
from worker.service.cancels import EarlyCancels
from worker.service.claims import Claim, ClaimOutcome
from worker.service.config import WorkerConfig
from worker.service.recovery import ReclaimOutcome


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        (["started", "10.5", "12.25"], ClaimOutcome.STARTED),
        (["rejected", "10.5", "12.25"], ClaimOutcome.REJECTED),
        (["expired", "10.5", "12.25"], ClaimOutcome.EXPIRED),
        (["cancelled", "", "12.25"], ClaimOutcome.SKIPPED),
        (["running", "", "12.25"], ClaimOutcome.SKIPPED),  # another worker's
        (["done", "", "12.25"], ClaimOutcome.SKIPPED),  # a duplicate entry of an ended job
    ],
)
def test_claim_replies_become_typed_outcomes(reply: list[str], outcome: ClaimOutcome) -> None:
    claim = Claim.from_reply(reply)
    assert claim.outcome is outcome and claim.state == reply[0]  # the state, for the logs
    assert claim.now == 12.25 and claim.submitted_at == (float(reply[1]) if reply[1] else 0.0)


def test_reclaim_answers_become_typed_outcomes() -> None:
    for answer in ("resumed", "queued", "dead_letter", "owned"):
        assert ReclaimOutcome.of(answer) == answer
    for state in ("done", "error", "cancelled", "expired"):  # it had ended before the takeover
        assert ReclaimOutcome.of(state) is ReclaimOutcome.ENDED


def test_early_cancels_are_kept_for_their_ttl_oldest_first() -> None:
    early = EarlyCancels(ttl_s=10.0)
    early.remember("a", now=0.0)
    early.remember("b", now=5.0)
    early.remember("a", now=6.0)  # heard again: young again
    early.expire(now=15.5)  # b is 10.5 s old, a 9.5 s
    assert not early.pop("b") and early.pop("a") and not early.pop("a")
    assert len(early) == 0


def test_worker_flags_default_to_the_config_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATERNOSTER_PREFIX", raising=False)
    monkeypatch.delenv("PATERNOSTER_CHAOS", raising=False)
    config = WorkerConfig.from_args(build_parser().parse_args(["worker"]))
    assert config == dataclasses.replace(WorkerConfig(), name=config.name)
    args = ["worker", "--name", "w1", "--prefix", "p", "--max-jobs", "3", "--grace-s", "2"]
    args += ["--share-tenant-caches", "--urgent-reserve", "0", "--max-deliveries", "5"]
    config = WorkerConfig.from_args(build_parser().parse_args(args))
    assert (config.name, config.prefix, config.max_jobs, config.grace_s) == ("w1", "p", 3, 2.0)
    assert not config.isolate_tenant_caches
    assert (config.urgent_reserve, config.max_deliveries) == (0, 5)
    monkeypatch.setenv("PATERNOSTER_PREFIX", "from-env")
    monkeypatch.setenv("PATERNOSTER_CHAOS", "1")
    config = WorkerConfig.from_args(build_parser().parse_args(["worker"]))
    assert config.prefix == "from-env" and config.chaos


@pytest.mark.parametrize("command", ["generate", "worker", "demo"])
def test_engine_flags_default_to_the_config_fields(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PATERNOSTER_MODEL", raising=False)
    extra = ["x"] if command == "generate" else []
    assert EngineConfig.from_args(build_parser().parse_args([command, *extra])) == EngineConfig()


def test_engine_flags_fill_the_nested_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATERNOSTER_MODEL", "/models/env")
    args = ["worker", "--block-size", "8", "--kv-cache-bytes", "1024", "--max-num-seqs", "4"]
    args += ["--max-num-batched-tokens", "32", "--tenant-weight", "a=2", "--enforce-eager"]
    args += ["--no-priority-preemption", "--dtype", "float32", "--threads", "2"]
    config = EngineConfig.from_args(build_parser().parse_args(args))
    assert config.model == "/models/env" and config.enforce_eager
    assert (config.dtype, config.num_threads) == ("float32", 2)
    assert (config.cache.block_size, config.cache.memory_bytes) == (8, 1024)
    assert (config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens) == (4, 32)
    assert config.scheduler.tenant_weights == {"a": 2.0}
    assert not config.scheduler.preempt_for_priority
    with pytest.raises(ValueError, match="TENANT=WEIGHT"):
        parse_tenant_weights(["a"])
