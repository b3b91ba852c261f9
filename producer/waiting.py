"""Why a queued job waits, and how many jobs are ahead of it: what ``status()`` adds to a job
still in Redis (state ``queued``).

- ``no_worker``: no live worker (``fleet.live_workers`` is empty);
- ``behind_higher_priority``: a more urgent band has entries no worker has read yet
  (``fleet.read_queues``), and workers read those first;
- ``workers_busy``: otherwise; the workers have no room for it yet.

``position`` counts the jobs ahead: every undelivered entry of the more urgent bands, plus the
entries of its own band between the group's last-delivered id and its own entry (from the
start when there is no group yet). Entries of jobs cancelled while queued count until a worker
reads and drops them, so it is an upper bound. The same rules as ``fleet``, fetched in two
pipelined round trips through functions both clients share (the sync one and the asyncio one).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from producer.fleet import HEARTBEAT_TTL_S, BandQueue, ask_queues, read_queues
from producer.keys import BANDS, Keys

NO_WORKER, BEHIND_HIGHER_PRIORITY, WORKERS_BUSY = (
    "no_worker", "behind_higher_priority", "workers_busy"
)  # fmt: skip
# XRANGE reads at most this many entries to count a job's position: one round trip of a few
# hundred KB at worst; a job that far back shows position 10000 (meaning "at least").
POSITION_SCAN_CAP = 10_000


@dataclass(frozen=True)
class Waiting:
    wait_reason: str
    position: int


def ask_fleet(pipe: Any, keys: Keys, now_s: float | None = None) -> None:
    """First round trip: the live workers' names and every band's group info and length."""
    now_s = time.time() if now_s is None else now_s
    pipe.zrangebyscore(keys.workers, now_s - HEARTBEAT_TTL_S, "+inf")
    ask_queues(pipe, keys)


def read_fleet(replies: Sequence[Any], keys: Keys) -> tuple[list[str], dict[str, BandQueue]]:
    """The first round trip's replies (run with ``raise_on_error=False``: a band without a
    stream answers XINFO GROUPS with an error)."""
    return [str(n) for n in replies[0]], read_queues(replies[1:], keys)


def ask_position(
    pipe: Any, keys: Keys, names: Sequence[str], band: str, queue: BandQueue, stream_id: str
) -> None:
    """Second round trip: which named workers still have a heartbeat hash, and the entries ahead
    of ``stream_id`` in its band (exclusive bounds: Redis 6.2+)."""
    for name in names:
        pipe.exists(keys.worker(name))
    low = "-" if queue.last_delivered is None else f"({queue.last_delivered}"
    pipe.xrange(keys.band(band), low, f"({stream_id}", count=POSITION_SCAN_CAP)


def waiting(
    replies: Sequence[Any], names: Sequence[str], band: str, queues: dict[str, BandQueue]
) -> Waiting:
    """The second round trip's replies, read with the first's results."""
    live = sum(1 for r in replies[: len(names)] if not isinstance(r, Exception) and int(r))
    ahead_reply = replies[len(names)]
    ahead = 0 if isinstance(ahead_reply, Exception) else len(ahead_reply)
    urgent = sum(queues[b].depth for b in BANDS[: BANDS.index(band)])
    if not live:
        reason = NO_WORKER
    else:
        reason = BEHIND_HIGHER_PRIORITY if urgent else WORKERS_BUSY
    return Waiting(reason, urgent + ahead)
