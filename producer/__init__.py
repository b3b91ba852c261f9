"""Paternoster's producer library: submit LLM generation jobs to Redis and follow their tokens.

Light on purpose (redis and pydantic only): web apps install it without torch.
"""

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
