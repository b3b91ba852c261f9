"""The batch runner: an asyncio task in the gateway that drives every active batch.

Each poll (``GatewayConfig.batch_poll_s``; ``BATCH_IDLE_POLL_S`` while no batch is active) it
sets the window from the live workers' batch slots (``GatewayConfig.batch_window_for``), takes
each batch of ``Keys.batches_active`` whose lease it holds or can take (``Keys.batch_lease``,
renewed each poll), and moves it one step:

- ``validating``: read and check the input file; ``failed`` (with ``errors``) or ``in_progress``;
- ``in_progress``: submit lines (``batch_progress``), collect the jobs that ended;
  once the completion window has ended, the rest become ``batch_expired`` error lines;
- ``cancelling``: cancel the jobs in flight, the rest become ``batch_cancelled`` lines;
- every line has its result: write the output and error files, then the final status.

Any number of gateways run runners; the lease keeps two from driving one batch at once, and a
gateway that dies stops renewing it, so another (or the same one, restarted) takes over within
``LEASE_MS``. Should two ever drive one batch for a moment, nothing doubles: job ids are
derived, result lines are HSETNX, statuses move under WATCH and file ids are fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from gateway.auth import Caller
from gateway.batch_lines import ENDPOINTS, LineJob, parse_input
from gateway.batch_progress import Driver, Progress
from gateway.batch_store import COUNT_FIELDS, FINAL, BatchStatus, BatchStore
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.files_store import FileObject, FileStore
from gateway.metrics import GatewayMetrics
from gateway.tenancy import IdScope
from producer import AsyncProducer, fleet
from producer.calls import adrive, async_io

log = logging.getLogger(__name__)
# How long a runner holds a batch without renewing: 50 polls at the default 0.2 s, so a busy
# event loop does not lose it, and a dead gateway's batches move on within 10 s.
LEASE_MS = 10_000
# How often a runner with no active batch looks for one: a new batch's first step waits up
# to this; a busy runner polls every ``GatewayConfig.batch_poll_s``.
BATCH_IDLE_POLL_S = 1.0
SWEEP_S = 600.0  # how often the files directory is swept of expired files


class BatchRunner:
    def __init__(
        self, producer: AsyncProducer, config: GatewayConfig, metrics: GatewayMetrics | None = None
    ) -> None:
        self.producer, self.config = producer, config
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self.redis: Any = producer.redis  # decoding redis.asyncio: replies are str
        self.keys = producer.keys
        self.store = BatchStore(self.redis, self.keys)
        self.files = FileStore(self.redis, self.keys, config.files_dir)
        self.driver = Driver(producer, self.metrics)
        self.name = f"gateway-{uuid.uuid4().hex[:12]}"
        self.progress: dict[str, Progress] = {}
        self.held: set[str] = set()  # the batches whose lease this runner took
        self._swept_at = 0.0
        self.window = 1  # a batch's jobs in flight at most: set each poll from the fleet

    async def run(self) -> None:
        """Poll until cancelled; an error in one poll is logged and the next poll retries."""
        try:
            while True:
                active = True
                try:
                    active = await self.poll()
                except Exception:  # Redis away, a bug: the gateway keeps serving
                    log.exception("batch runner poll failed")
                await asyncio.sleep(self.config.batch_poll_s if active else BATCH_IDLE_POLL_S)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release())

    async def poll(self) -> bool:
        """One step of every batch this runner holds; whether any batch is active."""
        active: set[str] = await self.redis.smembers(self.keys.batches_active)
        if active:
            workers = await adrive(fleet.live_workers_flow(self.keys), async_io(self.redis))
            self.window = self.config.batch_window_for(sum(w.max_num_seqs for w in workers))
        for batch_id in sorted(active):
            if not await self.hold(batch_id):
                self.progress.pop(batch_id, None)
                continue
            try:
                await self.step(batch_id)
            except Exception:  # one batch's fault (a bug, a corrupt hash) stops no other
                log.exception("batch %s: step failed", batch_id)
                self.progress.pop(batch_id, None)  # rebuilt from Redis at the next poll
        if time.monotonic() - self._swept_at > SWEEP_S:
            self._swept_at = time.monotonic()
            await self.files.sweep()
        return bool(active)

    async def hold(self, batch_id: str) -> bool:
        """Take or renew the batch's lease; a lease newly taken drops what this runner knew
        of the batch (another runner may have moved it on since)."""
        key = self.keys.batch_lease(batch_id)
        if await self.redis.set(key, self.name, nx=True, px=LEASE_MS):
            self.progress.pop(batch_id, None)
        elif await self.redis.get(key) == self.name:
            await self.redis.pexpire(key, LEASE_MS)
        else:
            self.held.discard(batch_id)
            return False
        self.held.add(batch_id)
        return True

    async def release(self) -> None:
        """Give up this runner's leases (a clean shutdown: the next runner need not wait)."""
        for batch_id in list(self.held):
            key = self.keys.batch_lease(batch_id)
            if await self.redis.get(key) == self.name:
                await self.redis.delete(key)

    async def step(self, batch_id: str) -> None:
        fields = await self.store.read(batch_id)
        if not fields:
            await self.redis.srem(self.keys.batches_active, batch_id)
            return
        status = BatchStatus(fields["status"])
        if status in FINAL:  # a runner stopped between the status and the clean-up
            await self.store.retire(batch_id, self.config.files_ttl_s)
        elif status is BatchStatus.VALIDATING:
            await self.validate(fields)
        elif status is BatchStatus.FINALIZING:
            await self.finalize(fields)
        else:
            await self.advance(fields, status)

    def line_job(self, fields: dict[str, str]) -> LineJob:
        owner = fields.get("owner") or None
        return LineJob(fields["endpoint"], owner, float(fields["expires_at"]),
                       self.config.default_max_tokens)  # fmt: skip

    async def parse(self, fields: dict[str, str]) -> tuple[Progress, list[dict[str, object]]]:
        """The batch's lines, and the problems that fail it (none: it can run)."""
        batch_id, owner = fields["id"], fields.get("owner") or None
        scope = IdScope.of(owner)
        _, chat = ENDPOINTS[fields["endpoint"]]
        progress = Progress(batch_id, scope, chat, self.config.model_name, [])
        try:
            meta = await self.files.get(fields["input_file_id"], Caller(owner))
            content = await self.files.content(meta)
        except ApiError as exc:
            return progress, [{"code": "invalid_file", "message": exc.message, "param":
                               "input_file_id", "line": None}]  # fmt: skip
        parsed = parse_input(content, self.line_job(fields), progress.job_id)
        progress.lines = parsed.lines
        return progress, parsed.problems

    async def validate(self, fields: dict[str, str]) -> None:
        progress, problems = await self.parse(fields)
        now = int(time.time())
        if problems:
            errors = {"object": "list", "data": problems}
            if await self.store.move(fields["id"], BatchStatus.FAILED, now, errors=errors):
                self.metrics.batch_ended(str(BatchStatus.FAILED))
                await self.store.retire(fields["id"], self.config.files_ttl_s)
            return  # else a cancel came first: the next poll finishes it as cancelled
        total = len(progress.lines)
        if await self.store.move(fields["id"], BatchStatus.IN_PROGRESS, now, total=total):
            self.metrics.lines("refused", sum(line.spec is None for line in progress.lines))

    async def advance(self, fields: dict[str, str], status: BatchStatus) -> None:
        batch_id = fields["id"]
        progress = self.progress.get(batch_id)
        if progress is None:
            progress, _ = await self.parse(fields)
            await self.redis.hsetnx(self.keys.batch(batch_id), "total", str(len(progress.lines)))
            await self.driver.resume(progress, int(fields.get("submitted", 0)))
            self.progress[batch_id] = progress
        cancelling = status is BatchStatus.CANCELLING
        ended = time.time() >= float(fields["expires_at"])
        code = "batch_cancelled" if cancelling else "batch_expired"
        if cancelling or ended:
            if ended and not cancelling:
                await self.redis.hset(self.keys.batch(batch_id), "window_ended", "1")
            await self.driver.drop_unsubmitted(progress, code)
            await self.driver.cancel_in_flight(progress)
        else:
            await self.driver.submit_more(progress, self.window)
        await self.driver.collect(progress, code)
        if not progress.drained:
            return
        if cancelling:
            await self.finalize(fields, BatchStatus.CANCELLED)
        elif await self.store.move(batch_id, BatchStatus.FINALIZING, int(time.time())):
            await self.finalize(await self.store.read(batch_id))

    async def finalize(self, fields: dict[str, str], final: BatchStatus | None = None) -> None:
        """Write the files, then the final status (a repeat writes the same files again)."""
        batch_id = fields["id"]
        ids = await self.write_files(fields)
        if final is None:
            ended = fields.get("window_ended") == "1"
            final = BatchStatus.EXPIRED if ended else BatchStatus.COMPLETED
        completed, failed = await self.store.counts(batch_id)
        counts = dict(zip(COUNT_FIELDS, (completed, failed), strict=True))
        if await self.store.move(batch_id, final, int(time.time()), **ids, **counts):
            self.metrics.batch_ended(str(final))
        if (await self.store.read(batch_id)).get("status") in FINAL:  # this runner's or another's
            await self.store.retire(batch_id, self.config.files_ttl_s)
        self.progress.pop(batch_id, None)

    async def write_files(self, fields: dict[str, str]) -> dict[str, str]:
        """The output and error files from the per-line hashes, lines in input order; a file
        only where there are lines (OpenAI's ids are then null)."""
        batch_id, now = fields["id"], int(time.time())
        ids = {}
        for kind, key in (("output", self.keys.batch_output), ("error", self.keys.batch_errors)):
            lines: dict[str, str] = await self.redis.hgetall(key(batch_id))
            if not lines:
                continue
            content = "".join(lines[k] + "\n" for k in sorted(lines, key=int)).encode()
            meta = FileObject(
                f"file-{batch_id.removeprefix('batch_')}-{kind}",
                bytes=len(content),
                created_at=now,
                expires_at=now + self.config.files_ttl_s,
                filename=f"{batch_id}_{kind}.jsonl",
                purpose="batch_output",
                owner=fields.get("owner", ""),
            )
            await self.files.create(meta, content)
            ids[f"{kind}_file_id"] = meta.id
        return ids
