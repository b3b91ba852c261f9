"""Where the helper threads meet the model loop: what they hand it, and what it holds.

Intake (and a takeover) puts admitted jobs here and the cancel listener the ids it heard; both
set ``wake`` so an idle loop runs at once instead of after its idle wait. The loop keeps its
running jobs in ``active``; the reclaimer, on the intake thread, reads which stream entries
this process holds, so it never takes back a job of its own that is only slow.
"""

from __future__ import annotations

import queue
import threading

from worker.service.jobs import ActiveJob, AdmittedJob


class Inbox:
    def __init__(self) -> None:
        self.admitted: queue.Queue[AdmittedJob] = queue.Queue()  # claimed, for the engine
        self.cancel_ids: queue.Queue[str] = queue.Queue()  # heard on the cancels stream
        self.wake = threading.Event()
        # The jobs in the engine, by id: only the model loop changes it.
        self.active: dict[str, ActiveJob] = {}

    def admit(self, job: AdmittedJob) -> None:
        """Hand a claimed job to the model loop (from the intake thread)."""
        self.admitted.put(job)
        self.wake.set()

    def next_admitted(self) -> AdmittedJob | None:
        try:
            return self.admitted.get_nowait()
        except queue.Empty:
            return None

    def next_cancel(self) -> str | None:
        try:
            return self.cancel_ids.get_nowait()
        except queue.Empty:
            return None

    @property
    def empty(self) -> bool:
        """No job running and none waiting to start: a stopping loop may return."""
        return not self.active and self.admitted.empty()

    def held_entries(self) -> set[str]:
        """Entry ids of the jobs this process holds (called from the intake thread: both are
        copied before they are read, as the loop may change them meanwhile)."""
        jobs = list(self.active.values())
        return {j.job.entry_id for j in jobs} | {j.entry_id for j in list(self.admitted.queue)}
