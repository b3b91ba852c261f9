"""Structured JSON logs: one line per job lifecycle event.

Every job event (``job_started``, ``job_rejected``, ``job_skipped``, ``job_cancel_requested``,
``job_deadline``, ``job_finished``, ...) carries ``job_id``, ``tenant`` (null where the job's
spec could not be read) and ``worker``, the consumer name: the worker and its intake thread
each log through a logger bound to that name, so a log sink shared by many workers can be
filtered to one worker or one tenant. ``paternoster worker --log-level`` sets the level.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines on stderr (or ``stream``), with an ISO timestamp and the level; events below
    ``level`` are dropped before any processor runs."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # log.exception(...): the traceback as a string field, not a bare "exc_info": true.
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
