"""Batch API files: the ``purpose`` filter of ``GET /v1/files`` runs before the page is cut,
and a batch's input file is kept until its batch's window (and the grace) has ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aredis

from gateway.batch_api import INPUT_GRACE_S
from gateway.config import GatewayConfig
from gateway.files_store import FileObject, FileStore
from producer.keys import Keys
from tests.gateway.conftest import Served, serve, stop
from tests.gateway.test_batches import _client, completion_line, jsonl


@pytest.fixture
def own_gateway(redis_url: str, key_prefix: str) -> Iterator[Served]:
    """A gateway on this test's prefix with no runner: batches stay validating."""
    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix, batch_runner=False))
    yield served
    stop(served)


def _store(redis_url: str, prefix: str, purposes: list[str]) -> list[str]:
    """Files of these purposes, oldest first, one second apart; their ids."""

    async def put() -> list[str]:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        store, now = FileStore(client, Keys(prefix), None), int(time.time())
        ids = []
        for i, purpose in enumerate(purposes):
            meta = FileObject(f"file-t{i}", 3, now - 100 + i, now + 600, f"{i}.jsonl", purpose)
            ids.append((await store.create(meta, b"{}\n")).id)
        await client.aclose()
        return ids

    return asyncio.run(put())


def test_the_purpose_filter_runs_before_paging(
    own_gateway: Served, redis_url: str, key_prefix: str
) -> None:
    # Newest first: out, in, out, out, in. Filtered after paging, the first page of 2 of
    # purpose=batch would hold one file (of the newest 2, one is an output).
    ids = _store(redis_url, key_prefix, ["batch", "batch_output", "batch_output", "batch",
                                         "batch_output"])  # fmt: skip
    with own_gateway.client() as http:
        first = http.get("/v1/files", params={"purpose": "batch", "limit": 2}).json()
        rest = http.get("/v1/files", params={"purpose": "batch", "after": ids[3]}).json()
        end = http.get("/v1/files", params={"purpose": "batch", "after": ids[0]}).json()
        outputs = http.get("/v1/files", params={"purpose": "batch_output", "limit": 2}).json()
        unfiltered = http.get("/v1/files", params={"limit": 4}).json()
    assert [f["id"] for f in first["data"]] == [ids[3], ids[0]] and not first["has_more"]
    assert [f["id"] for f in rest["data"]] == [ids[0]] and not rest["has_more"]
    assert end["data"] == [] and not end["has_more"]
    assert [f["id"] for f in outputs["data"]] == [ids[4], ids[2]] and outputs["has_more"]
    assert [f["id"] for f in unfiltered["data"]] == ids[:0:-1] and unfiltered["has_more"]


def test_a_batch_keeps_its_input_file_to_its_end(
    own_gateway: Served, client: Any, key_prefix: str
) -> None:
    openai = _client(own_gateway)
    content = jsonl([completion_line("a", "Hi")])
    uploaded = openai.files.create(
        file=("in.jsonl", content),
        purpose="batch",
        extra_body={"expires_after": {"anchor": "created_at", "seconds": 3600}},
    )
    assert uploaded.expires_at == uploaded.created_at + 3600  # an hour: shorter than 24 h
    batch = openai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    assert batch.expires_at is not None
    kept = openai.files.retrieve(uploaded.id).expires_at
    assert kept == batch.expires_at + INPUT_GRACE_S
    keys = Keys(key_prefix)
    for key in (keys.file(uploaded.id), keys.file_content(uploaded.id)):
        assert abs(time.time() + client.ttl(key) - (batch.expires_at + INPUT_GRACE_S)) <= 2
    # A second batch over the same file keeps it to the later of the two ends (the second,
    # created up to a second later, may end a second later); never shorter.
    second = openai.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                   completion_window="24h")  # fmt: skip
    assert second.expires_at is not None and second.expires_at >= batch.expires_at
    assert openai.files.retrieve(uploaded.id).expires_at == second.expires_at + INPUT_GRACE_S
