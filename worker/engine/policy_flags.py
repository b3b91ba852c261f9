"""The scheduler policy's command-line flags, beside the defaults they show (``SchedulerConfig``'s):
priority and preemption, tenant fair share, aging, per-band TPOT targets, the first-token lane."""

from __future__ import annotations

import argparse

from worker.engine.config import DEFAULT_TPOT_TARGET_MS, DEFAULT_URGENT_STEP_MAX, SchedulerConfig
from worker.engine.step_targets import format_tpot_targets


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``SchedulerConfig`` flags of priority, fair share, aging and TPOT targets
    (``EngineConfig.add_arguments``; ``EngineConfig.from_args`` reads them)."""
    g = parser.add_argument_group("priority and fairness")
    g.add_argument(
        "--no-priority-preemption",
        action="store_true",
        help="urgent jobs wait for a free slot instead of preempting less urgent ones",
    )
    preemptions = SchedulerConfig.max_priority_preemptions
    g.add_argument(
        "--max-priority-preemptions", type=int, default=preemptions, help="per job, then immune"
    )
    g.add_argument(
        "--tenant-weight",
        action="append",
        default=[],
        metavar="TENANT=WEIGHT",
        help="fair-share weight of a tenant (default 1); repeat for several",
    )
    g.add_argument("--max-running-per-tenant", type=int, default=None)
    targets = format_tpot_targets(DEFAULT_TPOT_TARGET_MS)
    g.add_argument(
        "--tpot-target-ms",
        default=targets,
        metavar="BAND=MS,...",
        help=f"per-band time per output token each step is sized to (default {targets}; off)",
    )
    slowdown = SchedulerConfig.tpot_slowdown_max
    g.add_argument(
        "--tpot-slowdown-max",
        type=float,
        default=slowdown,
        help="a step beside targeted decodes costs at most this many times those decodes "
        f"alone (default {slowdown:g}; 0: off)",
    )
    chunk = SchedulerConfig.min_prefill_chunk_tokens
    g.add_argument("--min-prefill-chunk-tokens", type=int, default=chunk)
    aging = SchedulerConfig.aging_per_s
    g.add_argument(
        "--aging-per-s",
        type=float,
        default=aging,
        help=f"priority points a waiting job gains per second (default {aging:g}; 0: off)",
    )
    lane = SchedulerConfig.first_token_lane_steps
    g.add_argument(
        "--first-token-lane-steps",
        type=int,
        default=lane,
        help="consecutive steps that may leave batch rows out for an interactive job's first "
        f"token (default {lane}; 0: off)",
    )
    by_device = ", ".join(f"{d} {v:g}" for d, v in DEFAULT_URGENT_STEP_MAX.items())
    g.add_argument(
        "--urgent-step-max",
        type=float,
        default=SchedulerConfig.urgent_step_max,
        help="while a job more urgent than batch is about, batch work fills a step only up to "
        f"about this many times a chat's own measured step (default by device: {by_device}; "
        "0: off)",
    )
