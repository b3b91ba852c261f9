"""Reading new jobs from the priority bands' streams, most urgent first, aged by wait.

Each band (``keys.band_of``: interactive, default, batch) has its own jobs stream in the
workers' consumer group. With aging off a band is read only when every more urgent one is
empty. With aging on (``SchedulerConfig.aging_per_s``, the engine's rate) each band's head
entry, its oldest entry not yet delivered to any worker, is aged by the engine's own rule
(``aging.aging_key``) from its submission (the millisecond time of its stream id, on the Redis
clock) and from its job's own priority (the status hash's; the band's nominal priority,
-10/0/10, for an entry without one, enqueued by hand), and the band whose head is most urgent
is read: under an unbroken interactive backlog a priority-10 batch head is read once it was
submitted 20 / rate seconds before a priority -10 interactive head. Only as
many entries are read as intake has free slots for; of those, the urgent reserve
(``WorkerConfig.urgent_reserve``) is kept for the interactive band, so a worker full of batch
jobs still reads an urgent job at once (it then preempts in the engine).

Round trips per read with aging on: one script (``BAND_HEADS``: every band's head id, its
job's priority and the Redis time), then the reads (one when the chosen band still has its
head); with aging off, one read per band tried. (Before the script: a pipeline of group info
and time, an XRANGE pipeline that carried each head's whole payload, then the reads.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import redis

from producer import scripts
from producer.fleet import queue_depths
from producer.keys import BANDS, Keys
from producer.protocol import PRIORITY_ALIASES
from worker.engine.aging import aging_key
from worker.service.config import WorkerConfig
from worker.service.slots import Slots


class Entry(NamedTuple):
    """One jobs-stream entry as read: its band's stream, its id, its fields."""

    stream: str
    entry_id: str
    fields: Mapping[str, str]


def entry_ms(entry_id: str) -> int:
    """The millisecond time in a stream id (``1700000000000-0``): when XADD wrote it."""
    return int(entry_id.partition("-")[0])


class BandReader:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        config: WorkerConfig,
        slots: Slots,
        aging_per_s: float = 0.0,
    ) -> None:
        self._redis = client
        self.keys = keys
        self._name = config.name
        self._block_ms = config.read_block_ms
        self._slots = slots
        self._reserve = config.reserve(slots.capacity)
        self._aging_per_s = aging_per_s  # the engine's (SchedulerConfig); 0: strict order
        self._heads = client.register_script(scripts.BAND_HEADS)

    @property
    def aging_per_s(self) -> float:
        return self._aging_per_s

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing, and this worker's consumer in
        it, so ``XINFO CONSUMERS`` lists the worker before its first job (a blocking
        XREADGROUP that finds nothing does not create it on Redis 7)."""
        for stream in self.keys.job_streams:
            try:
                self._redis.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._redis.xgroup_createconsumer(stream, self.keys.group, self._name)

    def read(self, count: int) -> list[Entry]:
        """Up to ``count`` entries of one band: the most urgent band (with aging, the band of
        the most urgent aged head; that head alone when it goes before a more urgent band)
        that has any. Only the interactive band may use the reserved slots."""
        free = self._slots.capacity - self._slots.in_use  # besides the ``count`` held here
        room = min(count, count + free - self._reserve)  # for the other bands
        urgent, *others = self.keys.job_streams
        streams = [urgent, *(others if room > 0 else [])]
        overtakes = False
        if self._aging_per_s > 0:
            streams = self.aged_order(streams)
            # An aged head ahead of a more urgent band's: read it alone, as the entries behind
            # it may not have aged as far.
            overtakes = bool(streams) and streams[0] != min(
                streams, key=self.keys.job_streams.index
            )
        for i, stream in enumerate(streams):
            n = 1 if overtakes and i == 0 else count if stream == urgent else room
            entries = self._xreadgroup([stream], n, None)
            if entries:
                return entries
        # All empty: wait on them together. XREADGROUP's COUNT is per stream, so wait on no
        # more of them than there is room for; a band left out is read on the next pass.
        waited = [urgent, *others[: max(0, min(count - 1, room))]]
        return self._xreadgroup(waited, 1, self._block_ms)

    def aged_order(self, streams: list[str]) -> list[str]:
        """Of ``streams``, those with undelivered entries, most urgent aged head first (ties:
        the more urgent band): one round trip."""
        job_streams = self.keys.job_streams
        reply: Any = self._heads(keys=job_streams, args=[self.keys.group, self.keys.prefix])
        now_ms = int(float(reply[0]) * 1000)
        keyed = []
        for i, (stream, band) in enumerate(zip(job_streams, BANDS, strict=True)):
            entry_id, priority = str(reply[1 + 2 * i]), str(reply[2 + 2 * i])
            if stream in streams and entry_id:
                waited_s = max(0, now_ms - entry_ms(entry_id)) / 1000
                own = int(priority) if priority else PRIORITY_ALIASES[band]
                keyed.append((aging_key(own, waited_s, self._aging_per_s), i, stream))
        return [stream for *_, stream in sorted(keyed)]

    def depths(self) -> dict[str, int]:
        """Entries of each band not yet delivered to any worker (``fleet.queue_depths``)."""
        return queue_depths(self._redis, self.keys)

    def _xreadgroup(self, streams: list[str], count: int, block_ms: int | None) -> list[Entry]:
        reply: Any = self._redis.xreadgroup(
            self.keys.group, self._name, dict.fromkeys(streams, ">"), count=count, block=block_ms
        )
        return [
            Entry(stream, eid, fields) for stream, entries in reply or [] for eid, fields in entries
        ]
