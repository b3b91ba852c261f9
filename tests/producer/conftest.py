"""Fixtures of the producer tests: a Producer, a raw client and a fake worker on one prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from producer import Keys, Producer
from tests.producer.fake_worker import FakeWorker


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    return Keys(key_prefix)


@pytest.fixture
def producer(redis_url: str, key_prefix: str) -> Iterator[Producer]:
    with Producer(redis_url, prefix=key_prefix, result_ttl_s=300) as p:
        yield p


@pytest.fixture
def worker(client: redis.Redis, keys: Keys) -> FakeWorker:
    return FakeWorker(client, keys)
