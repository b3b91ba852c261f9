"""``build_worker``: a ``JobWorker`` and every part it runs, each made whole before it is used.

The parts, and what connects them:

- four Redis connections, one per thread that blocks on Redis (intake, cancels, the lease; the
  publisher writes), so a blocking read never holds up a write;
- the ``Inbox`` between the helper threads and the model loop (admitted jobs, cancel ids, the
  wake event, the jobs the loop runs), and the ``Slots`` that bound how many jobs it holds;
- intake and what it calls: the band reader, the claim script, the takeover path (reclaimer and
  resumer), the handover to the loop, and a tokenizer of its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import redis

from producer.keys import Keys
from worker.engine.llm_engine import LLMEngine
from worker.service.bands import BandReader
from worker.service.cancels import CancelListener
from worker.service.claims import Claims
from worker.service.config import WorkerConfig
from worker.service.handover import Handover
from worker.service.inbox import Inbox
from worker.service.intake import Intake
from worker.service.job_parsing import PromptLimits
from worker.service.lease import Lease
from worker.service.metrics import WorkerMetrics
from worker.service.publisher import Publisher
from worker.service.recovery import Reclaimer, Resumer
from worker.service.reporting import Reporter
from worker.service.resp_packer import packer_kwargs
from worker.service.slots import Slots
from worker.service.worker import JobWorker


class Connections(NamedTuple):
    """One Redis connection per thread that uses Redis."""

    intake: redis.Redis
    cancels: redis.Redis
    lease: redis.Redis
    publisher: redis.Redis


def build_worker(
    engine: LLMEngine,
    redis_url: str,
    config: WorkerConfig | None = None,
    metrics: WorkerMetrics | None = None,
) -> JobWorker:
    """A worker serving ``engine``'s model from the Redis at ``redis_url`` (not yet running:
    call ``run()``, from the thread that built the engine)."""
    config = config or WorkerConfig()
    keys = Keys(config.prefix)
    clients = connect(redis_url, config)
    slots = Slots(config.job_capacity(engine.config.scheduler.max_num_seqs))
    inbox = Inbox()
    marker = keys.published(config.name)
    if metrics is not None:  # what the worker thinks a step costs (issue 21)
        metrics.step_cost.follow(engine.scheduler)
    return JobWorker(
        engine,
        config,
        inbox=inbox,
        slots=slots,
        intake=build_intake(engine, clients.intake, config, slots, inbox, metrics),
        cancels=CancelListener(
            clients.cancels, keys, inbox.cancel_ids, inbox.wake, config.read_block_ms
        ),
        publisher=Publisher(clients.publisher, config.max_publish_backlog, marker),
        lease=Lease(clients.lease, keys, config.name),
        reporter=Reporter(engine, keys, config.name, metrics),
        metrics=metrics,
    )


def connect(redis_url: str, config: WorkerConfig) -> Connections:
    """The four connections. Blocking reads wait read_block_ms; a socket timeout 10 s past
    that means a half-open connection after a network fault raises instead of hanging. The
    writer's timeout bounds a hung write. (No TCP keepalive: the embedded Redis is a unix
    socket, which refuses it.)"""
    readers: dict[str, Any] = {
        "decode_responses": True,
        # Entries come from any client: bytes that are not UTF-8 must not make a read raise
        # (that ended the intake thread once). They decode to lone surrogates, which
        # parse_job refuses as malformed_json, and encode back to the same bytes.
        "encoding_errors": "surrogateescape",
        "socket_timeout": config.read_block_ms / 1000 + 10,
        "socket_connect_timeout": 10,
    }
    writer = redis.Redis.from_url(
        redis_url,
        decode_responses=True,
        socket_timeout=30,
        socket_connect_timeout=10,
        **packer_kwargs(),  # every streamed token is one command packed on this connection
    )
    return Connections(
        intake=redis.Redis.from_url(redis_url, **readers),
        cancels=redis.Redis.from_url(redis_url, **readers),
        lease=redis.Redis.from_url(redis_url, **readers),
        publisher=writer,
    )


def build_intake(
    engine: LLMEngine,
    client: redis.Redis,
    config: WorkerConfig,
    slots: Slots,
    inbox: Inbox,
    metrics: WorkerMetrics | None,
) -> Intake:
    """Intake and its parts, on one connection (they all run on the intake thread)."""
    keys = Keys(config.prefix)
    limits = PromptLimits(
        _own_tokenizer(engine), engine.max_model_len, engine.model_config.vocab_size
    )
    handover = Handover(config, inbox)
    reclaimer = Reclaimer(
        client,
        keys,
        config.name,
        config.max_deliveries,
        config.result_ttl_s,
        held=inbox.held_entries,
    )
    return Intake(
        config,
        reader=BandReader(client, keys, config, slots, engine.config.scheduler.aging_per_s),
        claims=Claims(client, keys, config.name, config.result_ttl_s),
        resumer=Resumer(client, reclaimer, limits, handover),
        handover=handover,
        limits=limits,
        slots=slots,
        metrics=metrics,
    )


def _own_tokenizer(engine: LLMEngine) -> object:
    """A second tokenizer for the intake thread: HF fast tokenizers may fail with 'Already
    borrowed' when one instance is used from two threads at once."""
    from worker.models.loader import load_tokenizer

    return load_tokenizer(engine.model_dir)
