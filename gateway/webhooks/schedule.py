"""When a delivery is tried again, and when it is given up: pure functions of its record."""

from __future__ import annotations

import random
import time
from dataclasses import replace

from gateway.webhooks.config import WebhookConfig
from gateway.webhooks.records import Outcome, Record
from gateway.webhooks.sender import Attempt, Verdict


def backoff_s(config: WebhookConfig, attempts: int) -> float:
    """The wait after ``attempts`` failed ones: exponential, capped, scaled by 0.5-1.0."""
    full = min(config.backoff_max_s, config.backoff_base_s * 2 ** (attempts - 1))
    return full * random.uniform(0.5, 1.0)


def after(config: WebhookConfig, record: Record, attempt: Attempt) -> Record:
    """The record once ``attempt`` is made: counts, times, and when the next one is due."""
    now = time.time()
    attempts = record.attempts + 1
    delay = backoff_s(config, attempts)
    if attempt.retry_after_s is not None:  # the receiver's word, within our cap
        delay = max(delay, min(attempt.retry_after_s, config.backoff_max_s))
    delivered = attempt.verdict is Verdict.DELIVERED
    return replace(
        record,
        attempts=attempts,
        first_attempt_at=record.first_attempt_at or now,
        last_attempt_at=now,
        next_attempt_at=0.0 if delivered else now + delay,
        last_status=attempt.status,
        last_error=attempt.error,
        delivered_at=now if delivered else 0.0,
        outcome=Outcome.DELIVERED if delivered else Outcome.PENDING,
    )


def give_up(config: WebhookConfig, record: Record) -> str | None:
    """Why no further attempt is made (None: make it)."""
    last = f": last {record.last_error}" if record.last_error else ""
    if record.attempts >= config.max_attempts:
        return f"gave up after {record.attempts} attempts{last}"
    late = record.next_attempt_at - record.first_attempt_at > config.max_total_s
    if record.attempts and late:
        return f"gave up: a next attempt would pass max_total_s {config.max_total_s:g}{last}"
    return None
