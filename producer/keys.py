"""Every Redis key and consumer-group name of the protocol, in one place.

A deployment (or a test) picks a prefix; all keys start with it so one Redis can hold several
independent job planes and ``SCAN MATCH prefix:*`` finds everything one of them wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "paternoster"
# Priority bands, most urgent first; each has its own jobs stream so a worker reads urgent jobs
# before a backlog of batch jobs (one stream in arrival order could not). See `band_of`.
BANDS = ("interactive", "default", "batch")
# The lowest priority of each band after the first, in order: below 0 interactive, 0-9
# default, 10 and up batch. `band_of` and the SUBMIT script's (generated) band_of read this.
BAND_FLOORS = {"default": 0, "batch": 10}
DEAD_LETTER_MAXLEN = 10_000  # entries the dead-letter stream keeps (approximately: MAXLEN ~)
CANCELS_MAXLEN = 10_000  # entries the cancels stream keeps (approximately: MAXLEN ~)
RECENT_KEPT = 100  # ids the recent list keeps (SUBMIT trims it)
# Job ids become parts of key names and log lines: keep them to a safe, bounded alphabet.
MAX_JOB_ID_CHARS = 128
JOB_ID_PATTERN = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:@-]{{0,{MAX_JOB_ID_CHARS - 1}}}$")


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. ``group`` is the workers' consumer group on the jobs stream."""

    prefix: str = DEFAULT_PREFIX
    group: str = "workers"

    @property
    def jobs(self) -> str:
        """Stream of submitted jobs of the ``default`` band: entries ``id <job id> payload
        <JobSpec JSON>``. The other bands' streams are ``jobs:interactive`` and ``jobs:batch``."""
        return f"{self.prefix}:jobs"

    def band(self, band: str) -> str:
        """The jobs stream of one priority band (``BANDS``)."""
        if band not in BANDS:
            raise ValueError(f"unknown band {band!r}; bands: {', '.join(BANDS)}")
        return self.jobs if band == "default" else f"{self.prefix}:jobs:{band}"

    @property
    def job_streams(self) -> tuple[str, ...]:
        """Every band's jobs stream, most urgent first: the order workers read them in."""
        return tuple(self.band(b) for b in BANDS)

    def band_load(self, band: str) -> str:
        """Hash ``jobs``, ``tokens``: what is queued (submitted, not yet taken) in a band."""
        return f"{self.prefix}:load:band:{band}"

    def tenant_load(self, tenant: str) -> str:
        """Hash ``jobs``, ``tokens``: what one tenant has queued, over all bands."""
        return f"{self.prefix}:load:tenant:{tenant}"

    @property
    def limits(self) -> str:
        """Hash of admission limits that ``SUBMIT`` enforces (see ``producer.admission``)."""
        return f"{self.prefix}:limits"

    @property
    def workers(self) -> str:
        """Sorted set: worker name -> unix time of its last heartbeat."""
        return f"{self.prefix}:workers"

    def worker(self, name: str) -> str:
        """Hash: one worker's heartbeat (``producer.fleet.WorkerInfo``); expires if it stops."""
        return f"{self.prefix}:worker:{name}"

    def lease(self, name: str) -> str:
        """String with a TTL: a worker holds its jobs while it renews this (``worker.service.
        lease``); once it lapses, other workers reclaim and resume them."""
        return f"{self.prefix}:lease:{name}"

    def published(self, name: str) -> str:
        """String: the last publish round trip a worker knows Redis applied (its publisher's
        exactly-once marker, written in the same transaction as the events)."""
        return f"{self.prefix}:published:{name}"

    @property
    def dead_letter(self) -> str:
        """Stream of jobs given up after too many deliveries: ``id``, ``entry_id``, ``payload``,
        ``deliveries``, ``worker`` (the last one to die running it)."""
        return f"{self.prefix}:dead"

    @property
    def recent(self) -> str:
        """List of the most recently submitted job ids, newest first (at most RECENT_KEPT)."""
        return f"{self.prefix}:recent"

    @property
    def cancels(self) -> str:
        """Stream of cancel requests for running jobs: entries ``id <job id>``; every worker reads
        it whole (no group), because only the job's owner knows it is running there."""
        return f"{self.prefix}:cancels"

    # A job's keys are `<prefix>:<kind>:<job id>`, the id last and each kind a tag of its own
    # that no other key starts with: ids may hold ":", so a kind spelt after the id
    # (`job:<id>:events`) made the id `a:events` name job `a`'s events.

    def job(self, job_id: str) -> str:
        """Hash: the job's status fields (see ``protocol.JobStatus``)."""
        return f"{self.prefix}:job:{job_id}"

    def events(self, job_id: str) -> str:
        """Stream: the job's result events, oldest first, one terminal event last."""
        return f"{self.prefix}:events:{job_id}"

    def pattern(self) -> str:
        """``SCAN MATCH`` pattern for every key under this prefix."""
        return f"{self.prefix}:*"

    # The OpenAI Batch API's files and batches (``gateway.files_store``, ``gateway.batch_store``).

    def file(self, file_id: str) -> str:
        """Hash: one uploaded or produced file's object (``bytes``, ``filename``, ``purpose``,
        ``owner``, times); expires with the file."""
        return f"{self.prefix}:file:{file_id}"

    def file_content(self, file_id: str) -> str:
        """String: a file's bytes, when files live in Redis (not ``--files-dir``)."""
        return f"{self.prefix}:file-content:{file_id}"

    def files(self, owner: str) -> str:
        """Sorted set: file id -> created time, of one owner (a tenant, or ``*`` for all)."""
        return f"{self.prefix}:files:{owner}"

    def batch(self, batch_id: str) -> str:
        """Hash: one batch's object (status, times, file ids, counts, its runner's cursor)."""
        return f"{self.prefix}:batch:{batch_id}"

    def batches(self, owner: str) -> str:
        """Sorted set: batch id -> created time, of one owner (a tenant, or ``*`` for all)."""
        return f"{self.prefix}:batches:{owner}"

    def batch_output(self, batch_id: str) -> str:
        """Hash: input line index -> the output line of a request that succeeded (HSETNX:
        one line per request, however often its result is collected)."""
        return f"{self.prefix}:batch-output:{batch_id}"

    def batch_errors(self, batch_id: str) -> str:
        """Hash: input line index -> the error line of a request that failed."""
        return f"{self.prefix}:batch-errors:{batch_id}"

    def batch_lease(self, batch_id: str) -> str:
        """String with a TTL: the gateway whose runner drives the batch while it renews it."""
        return f"{self.prefix}:batch-lease:{batch_id}"

    @property
    def batches_active(self) -> str:
        """Set: ids of the batches not yet in a final status, which runners pick up."""
        return f"{self.prefix}:batches-active"

    # Webhooks (issue 22): deliveries queued atomically with the event they report, sent by
    # `paternoster webhooks` (``gateway.webhooks``).

    @property
    def webhooks(self) -> str:
        """Stream of webhook deliveries to make: ``id`` (job id), ``event`` (terminal |
        started), ``submitted_at`` (its status hash's). The deliverers' group reads it."""
        return f"{self.prefix}:webhooks"

    @property
    def webhook_group(self) -> str:
        """The deliverers' consumer group on the webhooks stream."""
        return "deliverers"

    @property
    def webhook_dead(self) -> str:
        """Stream of deliveries given up (attempts or time spent, or refused): see
        ``gateway.webhooks.records``. Trimmed to about DEAD_LETTER_MAXLEN entries."""
        return f"{self.prefix}:webhook-dead"

    def delivery(self, job_id: str) -> str:
        """Hash: the webhook deliveries of one job, fields ``<event>_<name>`` (attempts,
        last_status, delivered_at, ...: ``gateway.webhooks.records``)."""
        return f"{self.prefix}:delivery:{job_id}"


def band_of(priority: int) -> str:
    """Band of a priority (lower is more urgent): the last band whose floor it reaches
    (``BAND_FLOORS``), else the first."""
    band = BANDS[0]
    for name, floor in BAND_FLOORS.items():
        if priority >= floor:
            band = name
    return band


def is_valid_job_id(job_id: str) -> bool:
    return bool(JOB_ID_PATTERN.match(job_id))
