"""Paternoster's producer library: submit LLM generation jobs to Redis and follow their tokens.

Light on purpose (redis and pydantic only): web apps install it without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.aio import AsyncJobHandle, AsyncProducer
    from producer.client import JobHandle, Producer
    from producer.errors import (
        InvalidJob,
        JobCancelled,
        JobEnded,
        JobExpired,
        JobFailed,
        JobNotFound,
        JobTimeout,
        NoRedis,
        Overloaded,
        PaternosterError,
        RedisUnavailable,
    )
    from producer.keys import Keys
    from producer.protocol import SCHEMA_VERSION, ChatMessage, JobSpec, JobState, SamplingSpec
    from producer.reconnect import ReconnectPolicy
    from producer.results import JobResult, JobStatus

# Each name's module, imported on first use: ``import producer.protocol`` (the worker's engine
# reads the sampling contract there) then loads pydantic, not the Redis clients.
_HOME = {
    **dict.fromkeys(("AsyncJobHandle", "AsyncProducer"), "aio"),
    **dict.fromkeys(("JobHandle", "Producer"), "client"),
    **dict.fromkeys(
        (
            "InvalidJob",
            "JobCancelled",
            "JobEnded",
            "JobExpired",
            "JobFailed",
            "JobNotFound",
            "JobTimeout",
            "NoRedis",
            "Overloaded",
            "PaternosterError",
            "RedisUnavailable",
        ),
        "errors",
    ),
    "Keys": "keys",
    **dict.fromkeys(
        ("SCHEMA_VERSION", "ChatMessage", "JobSpec", "JobState", "SamplingSpec"), "protocol"
    ),
    "ReconnectPolicy": "reconnect",
    **dict.fromkeys(("JobResult", "JobStatus"), "results"),
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'producer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"producer.{_HOME[name]}"), name)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


__all__ = [
    "SCHEMA_VERSION",
    "AsyncJobHandle",
    "AsyncProducer",
    "ChatMessage",
    "InvalidJob",
    "JobCancelled",
    "JobEnded",
    "JobExpired",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "JobResult",
    "JobSpec",
    "JobState",
    "JobStatus",
    "JobTimeout",
    "Keys",
    "NoRedis",
    "Overloaded",
    "PaternosterError",
    "Producer",
    "ReconnectPolicy",
    "RedisUnavailable",
    "SamplingSpec",
]
