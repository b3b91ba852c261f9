"""Every Redis key and consumer-group name of the protocol, in one place.

A deployment (or a test) picks a prefix; all keys start with it so one Redis can hold several
independent job planes and ``SCAN MATCH prefix:*`` finds everything one of them wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "paternoster"
# Job ids become parts of key names and log lines: keep them to a safe, bounded alphabet.
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. ``group`` is the workers' consumer group on the jobs stream."""

    prefix: str = DEFAULT_PREFIX
    group: str = "workers"

    @property
    def jobs(self) -> str:
        """Stream of submitted jobs: entries ``id <job id> payload <JobSpec JSON>``."""
        return f"{self.prefix}:jobs"

    @property
    def cancels(self) -> str:
        """Stream of cancel requests for running jobs: entries ``id <job id>``; every worker reads
        it whole (no group), because only the job's owner knows it is running there."""
        return f"{self.prefix}:cancels"

    def job(self, job_id: str) -> str:
        """Hash: the job's status fields (see ``protocol.JobStatus``)."""
        return f"{self.prefix}:job:{job_id}"

    def events(self, job_id: str) -> str:
        """Stream: the job's result events, oldest first, one terminal event last."""
        return f"{self.prefix}:job:{job_id}:events"

    def pattern(self) -> str:
        """``SCAN MATCH`` pattern for every key under this prefix."""
        return f"{self.prefix}:*"


def is_valid_job_id(job_id: str) -> bool:
    return bool(JOB_ID_PATTERN.match(job_id))
