"""Reading new jobs from the priority bands' streams, most urgent first.

Each band (``keys.band_of``: interactive, default, batch) has its own jobs stream in the
workers' consumer group. A band is read only when every more urgent one is empty, and only as
many entries as intake has free slots for; of those, the urgent reserve (``WorkerConfig
.urgent_reserve``) is kept for the interactive band, so a worker full of batch jobs still
reads an urgent job at once (it then preempts in the engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import redis

from producer.fleet import queue_depths
from producer.keys import Keys
from worker.service.config import WorkerConfig
from worker.service.slots import Slots


class Entry(NamedTuple):
    """One jobs-stream entry as read: its band's stream, its id, its fields."""

    stream: str
    entry_id: str
    fields: Mapping[str, str]


class BandReader:
    def __init__(self, client: redis.Redis, keys: Keys, config: WorkerConfig, slots: Slots):
        self._redis = client
        self.keys = keys
        self._name = config.name
        self._block_ms = config.read_block_ms
        self._slots = slots
        self._reserve = config.reserve(slots.capacity)

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
        """Up to ``count`` entries, most urgent band first: a band is read only when every
        more urgent one is empty. Only the interactive band may use the reserved slots."""
        free = self._slots.capacity - self._slots.in_use  # besides the ``count`` held here
        room = min(count, count + free - self._reserve)  # for the other bands
        urgent, *others = self.keys.job_streams
        streams = [urgent, *(others if room > 0 else [])]
        for stream in streams:
            entries = self._xreadgroup([stream], count if stream == urgent else room, None)
            if entries:
                return entries
        # All empty: wait on them together. XREADGROUP's COUNT is per stream, so wait on no
        # more of them than there is room for; a band left out is read on the next pass.
        waited = [urgent, *others[: max(0, min(count - 1, room))]]
        return self._xreadgroup(waited, 1, self._block_ms)

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
