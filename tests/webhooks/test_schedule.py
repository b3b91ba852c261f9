"""Backoff with jitter, Retry-After within the cap, and the two ways a delivery is given up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.webhooks import schedule
from gateway.webhooks.config import WebhookConfig
from gateway.webhooks.records import Record
from gateway.webhooks.sender import Attempt, Verdict

CONFIG = WebhookConfig(backoff_base_s=1.0, backoff_max_s=60.0, max_attempts=5, max_total_s=100)
FAILED = Attempt(Verdict.RETRY, "5xx", 503, "HTTP 503")


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    for n, full in ((1, 1.0), (2, 2.0), (4, 8.0), (7, 60.0), (20, 60.0)):
        waits = [schedule.backoff_s(CONFIG, n) for _ in range(200)]
        assert full * 0.5 <= min(waits) and max(waits) <= full
        assert max(waits) - min(waits) > full * 0.2  # jittered, not one value


def test_retry_after_lengthens_the_wait_within_the_cap() -> None:
    record = schedule.after(CONFIG, Record("d"), replace(FAILED, retry_after_s=30.0))
    assert 29.9 < record.next_attempt_at - record.last_attempt_at <= 30.0
    record = schedule.after(CONFIG, Record("d"), replace(FAILED, retry_after_s=3600.0))
    assert record.next_attempt_at - record.last_attempt_at <= 60.0


def test_a_delivery_is_given_up_after_max_attempts_or_max_total_s() -> None:
    record = Record("d")
    for _ in range(4):
        record = schedule.after(CONFIG, record, FAILED)
        assert schedule.give_up(CONFIG, record) is None
    record = schedule.after(CONFIG, record, FAILED)
    assert schedule.give_up(CONFIG, record) == "gave up after 5 attempts: last HTTP 503"
    late = replace(Record("d"), attempts=1, first_attempt_at=1000.0, next_attempt_at=1100.5)
    assert "max_total_s 100" in (schedule.give_up(CONFIG, late) or "")


def test_bad_settings_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="max_attempts must be > 0"):
        WebhookConfig(max_attempts=0)
    with pytest.raises(ValueError, match="base64"):
        WebhookConfig(default_secret="whsec_!!")
