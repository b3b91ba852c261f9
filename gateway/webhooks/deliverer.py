"""The deliverer: reads the webhooks stream through its consumer group and makes each delivery.

Each entry becomes a task that builds the body once, then attempts, waits and retries (backoff
with jitter, ``Retry-After`` honoured) until it is delivered or given up. Meanwhile the entry
stays pending under this deliverer, which touches its entries (``XCLAIM ... JUSTID`` resets
their idle time) every ``claim_idle_s / 3``; a deliverer killed mid-delivery stops touching,
and ``claim_idle_s`` later another one's ``XAUTOCLAIM`` takes the entries over and goes on from
their records (attempts and schedule), as workers reclaim jobs. At least once: a deliverer
killed after a POST and before its record may POST once more, with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from dataclasses import replace
from typing import Any

import httpx
import redis
import redis.asyncio as aredis

from gateway.webhooks import records, schedule, signing
from gateway.webhooks.config import WebhookConfig
from gateway.webhooks.metrics import WebhookMetrics
from gateway.webhooks.prepare import Prepared, Refusal, check_current, prepare
from gateway.webhooks.records import Entry, Outcome, Record
from gateway.webhooks.sender import Attempt, Resolver, Sender, Verdict, system_resolver
from producer.keys import Keys
from producer.webhook_lua import DeliveryField
from producer.webhook_policy import Allowlist

log = logging.getLogger("paternoster.webhooks")
ERROR_PAUSE_S = 1.0  # after a Redis error in the read loop, before the next try


def http_client(config: WebhookConfig) -> httpx.AsyncClient:
    """The attempts' client: no redirects, one attempt's timeout, and the CAs it trusts."""
    verify: ssl.SSLContext | bool = True  # httpx's default context: certifi's CAs
    if config.ca_bundle is not None:
        verify = ssl.create_default_context(cafile=config.ca_bundle)
    timeout = httpx.Timeout(config.request_timeout_s)
    return httpx.AsyncClient(follow_redirects=False, timeout=timeout, verify=verify)


class Deliverer:
    def __init__(
        self,
        client: aredis.Redis,
        keys: Keys,
        config: WebhookConfig | None = None,
        *,
        metrics: WebhookMetrics | None = None,
        resolve: Resolver = system_resolver,
        allow: Allowlist | None = None,
    ) -> None:
        self.client, self.keys = client, keys
        self.config = config or WebhookConfig()
        self.metrics = metrics
        self._resolve = resolve
        self._allow = Allowlist.from_env() if allow is None else allow
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cursor = "0-0"  # XAUTOCLAIM's, kept between rounds

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; deliveries in hand stay pending for the next one."""
        await self._ensure_group()
        async with http_client(self.config) as http:
            sender = Sender(
                http,
                self._resolve,
                self._allow,
                self.config.request_timeout_s,
                self.config.max_response_bytes,
            )
            try:
                await self._loop(stop, sender)
            finally:
                for task in self._tasks.values():
                    task.cancel()
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _ensure_group(self) -> None:
        with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: it exists
            await self.client.xgroup_create(
                self.keys.webhooks, self.keys.webhook_group, id="0", mkstream=True
            )

    async def _loop(self, stop: asyncio.Event, sender: Sender) -> None:
        next_round = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_round:
                    await self._touch()
                    await self._reclaim(sender)
                    next_round = time.monotonic() + self.config.touch_every_s
                await self._read(sender)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("webhooks: Redis unavailable (%s); retrying", exc)
                await asyncio.sleep(ERROR_PAUSE_S)

    def _free(self) -> int:
        return self.config.max_in_flight - len(self._tasks)

    async def _read(self, sender: Sender) -> None:
        if self._free() <= 0:
            await asyncio.sleep(0.05)
            return
        reply: Any = await self.client.xreadgroup(
            self.keys.webhook_group,
            self.config.name,
            {self.keys.webhooks: ">"},
            count=self._free(),
            block=self.config.read_block_ms,
        )
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                self._spawn(entry_id, fields, sender)

    async def _reclaim(self, sender: Sender) -> None:
        """Take over entries idle past ``claim_idle_s``: their deliverer stopped touching them."""
        if self._free() <= 0:
            return
        reply: Any = await self.client.xautoclaim(
            self.keys.webhooks,
            self.keys.webhook_group,
            self.config.name,
            min_idle_time=int(self.config.claim_idle_s * 1000),
            start_id=self._cursor,
            count=self._free(),
        )
        self._cursor = reply[0]
        for entry_id, fields in reply[1]:
            if fields:  # a deleted entry comes back empty (Redis 7 drops it from the PEL)
                log.info("webhooks: took over delivery entry %s", entry_id)
                self._spawn(entry_id, fields, sender)

    async def _touch(self) -> None:
        if self._tasks:
            await self.client.xclaim(
                self.keys.webhooks,
                self.keys.webhook_group,
                self.config.name,
                min_idle_time=0,
                message_ids=list(self._tasks),
                justid=True,
            )

    def _spawn(self, entry_id: str, fields: dict[str, str], sender: Sender) -> None:
        if entry_id in self._tasks:
            return
        entry = Entry(
            entry_id,
            fields.get(DeliveryField.ID, ""),
            fields.get(DeliveryField.EVENT, ""),
            fields.get(DeliveryField.SUBMITTED_AT, ""),
        )
        task = asyncio.create_task(self._deliver(entry, sender), name=f"webhook-{entry_id}")
        self._tasks[entry_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(entry_id, None))
        if self.metrics is not None:
            self.metrics.in_flight.set(len(self._tasks))

    async def _deliver(self, entry: Entry, sender: Sender) -> None:
        try:
            await self._make(entry, sender)
        except asyncio.CancelledError:
            raise
        except Exception:  # left pending: it is taken over (by anyone) after claim_idle_s
            log.exception("webhooks: delivery %s failed unexpectedly", entry.delivery_id)
        finally:
            if self.metrics is not None:
                self.metrics.in_flight.set(len(self._tasks) - 1)

    async def _make(self, entry: Entry, sender: Sender) -> None:
        record = await records.load(
            self.client, self.keys, entry.job_id, entry.event, entry.delivery_id
        )
        try:
            job = await prepare(self.client, self.keys, entry, self.config.default_secret)
        except Refusal as why:
            await self._end(entry, replace(record, last_error=str(why)), str(why))
            return
        record = replace(record, url=job.url)
        while (reason := schedule.give_up(self.config, record)) is None:
            await asyncio.sleep(max(0.0, record.next_attempt_at - time.time()))
            try:
                if record.attempts:  # the first attempt follows prepare's own check
                    await check_current(self.client, self.keys, entry)
            except Refusal as why:
                await self._end(entry, replace(record, last_error=str(why)), str(why))
                return
            attempt = await self._attempt(entry, job, sender)
            record = schedule.after(self.config, record, attempt)
            if attempt.verdict is Verdict.DELIVERED:
                await self._end(entry, record)
                return
            if attempt.verdict is not Verdict.RETRY:
                await self._end(entry, record, attempt.error)
                return
            await records.save(
                self.client, self.keys, entry.job_id, entry.event, record, self.config.record_ttl_s
            )
        await self._end(entry, record, reason)

    async def _attempt(self, entry: Entry, job: Prepared, sender: Sender) -> Attempt:
        now_s = int(time.time())
        headers = signing.headers(job.secret, entry.delivery_id, now_s, job.body)
        attempt = await sender.post(job.url, headers, job.body)
        if self.metrics is not None:
            self.metrics.attempt(attempt)
        return attempt

    async def _end(self, entry: Entry, record: Record, dead_reason: str = "") -> None:
        outcome = Outcome.DEAD_LETTER if dead_reason else Outcome.DELIVERED
        record = replace(record, outcome=outcome)
        await records.finish(
            self.client, self.keys, entry, record, self.config.record_ttl_s, dead_reason
        )
        if self.metrics is not None:
            self.metrics.ended(outcome.value)
        if dead_reason:
            log.warning("webhooks: %s dead-lettered: %s", entry.delivery_id, dead_reason)
