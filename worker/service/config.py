"""The job service's settings: one frozen dataclass, validated once, and the command-line flags
that fill it (declared here, beside the fields, so each default exists once)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from producer import envs as producer_envs
from producer.keys import DEFAULT_PREFIX
from worker import envs


class InvalidWorkerConfig(ValueError):
    """A worker setting is out of range; the message names it."""


def default_worker_name() -> str:
    """Unique per process on a host: the consumer name in the workers' group."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    name: str = field(default_factory=default_worker_name)
    prefix: str = DEFAULT_PREFIX
    # Jobs this worker holds at once (running + waiting in its engine). None: the engine's
    # max_num_seqs plus an eighth (at least 4) waiting behind them, so a finishing sequence is
    # replaced at the next step without a Redis round trip, and the rest stay in Redis for others.
    max_jobs: int | None = None
    stream_interval: int = 1  # tokens per token event at most (the last event may hold fewer)
    result_ttl_s: int = 24 * 3600  # result streams and status hashes live this long after the end
    read_block_ms: int = 1000  # how long a blocking read waits before checking for shutdown
    # Steps of events waiting for Redis at most; past it the model loop waits (bounded memory
    # when Redis is slow or away) instead of buffering without end.
    max_publish_backlog: int = 256
    # Salt every job's prefix-cache blocks with its tenant (and its cache_salt, if any), so
    # tenants never share cached prompts: no cross-tenant hits, and no timing side channel that
    # tells B what A asked. Sharing across tenants (False, `--share-tenant-caches`) is opt-in.
    isolate_tenant_caches: bool = True
    idle_wait_s: float = 0.05  # the model loop's sleep when it has nothing to run
    # The interpreter's thread switch interval, lowered to this while the worker runs (None:
    # left as it is, 5 ms by default). The model loop holds the GIL inside the CPU kernels
    # (kernels/cpu_bindings.cpp releases none), so intake and the publisher wait for it after
    # each Redis reply; Python hands it over only once a waiter has waited this long.
    switch_interval_ms: float | None = None
    # Of max_jobs, slots only the interactive band may take: with every other slot held by
    # batch jobs, an urgent job is still read from Redis at once (then it preempts in the
    # engine). None: an eighth of the capacity, at least 1.
    urgent_reserve: int | None = None
    # Deliveries of a job (its first start plus takeovers after its worker died) before it goes
    # to the dead-letter stream: a job that kills every worker running it stops here.
    max_deliveries: int = 3
    # On SIGTERM: how long running jobs may take to finish before the rest are handed back
    # (the lease dropped, so other workers resume them at once).
    grace_s: float = 30.0
    # Fault injection for the reliability tests and the chaos bench: a job with metadata
    # {"chaos": "crash"} kills the process right after it is claimed. Never on in production.
    chaos: bool = False

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() or c in '"\\' for c in self.name):
            raise InvalidWorkerConfig("name must be non-empty, without spaces, quotes or \\")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise InvalidWorkerConfig("max_jobs must be >= 1")
        if self.stream_interval < 1:
            raise InvalidWorkerConfig("stream_interval must be >= 1")
        if self.result_ttl_s < 1:
            raise InvalidWorkerConfig("result_ttl_s must be >= 1")
        if self.max_publish_backlog < 1:
            raise InvalidWorkerConfig("max_publish_backlog must be >= 1")
        if self.max_deliveries < 1:
            raise InvalidWorkerConfig("max_deliveries must be >= 1")
        if self.grace_s < 0:
            raise InvalidWorkerConfig("grace_s must be >= 0")
        if self.urgent_reserve is not None and self.urgent_reserve < 0:
            raise InvalidWorkerConfig("urgent_reserve must be >= 0")
        if self.switch_interval_ms is not None and self.switch_interval_ms <= 0:
            raise InvalidWorkerConfig("switch_interval_ms must be > 0")

    def job_capacity(self, max_num_seqs: int) -> int:
        return self.max_jobs or max_num_seqs + max(4, max_num_seqs // 8)

    def reserve(self, capacity: int) -> int:
        """Slots kept for the interactive band; never all of them."""
        wanted = max(1, capacity // 8) if self.urgent_reserve is None else self.urgent_reserve
        return min(wanted, capacity - 1)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        """The ``paternoster worker`` flags that fill this config, in a "job service" group
        (returned, so the command adds its own flags beside them). Defaults are the fields'."""
        g = parser.add_argument_group("job service")
        g.add_argument("--name", default=None, help="consumer name (default: host-pid)")
        g.add_argument(
            "--prefix", default=None, help="key prefix (default: PATERNOSTER_PREFIX or paternoster)"
        )
        g.add_argument("--max-jobs", type=int, default=None, help="jobs held at once")
        g.add_argument(
            "--stream-interval",
            type=int,
            default=_default("stream_interval"),
            help="tokens per token event (default %(default)s)",
        )
        g.add_argument("--result-ttl-s", type=int, default=_default("result_ttl_s"))
        g.add_argument(
            "--share-tenant-caches",
            dest="isolate_tenant_caches",
            action="store_false",
            help="let tenants share cached prompt blocks (default: each tenant's are its own, so "
            "no tenant can hit or time another's prompts)",
        )
        g.add_argument(
            "--urgent-reserve",
            type=int,
            default=None,
            help="job slots only interactive jobs may take (default: an eighth, at least 1)",
        )
        g.add_argument(
            "--switch-interval-ms",
            type=float,
            default=_default("switch_interval_ms"),
            help="lower the interpreter's thread switch interval to this while serving: intake "
            "and the publisher get the GIL sooner from a busy model loop (default: leave it)",
        )
        g.add_argument(
            "--grace-s",
            type=float,
            default=_default("grace_s"),
            help="on SIGTERM, seconds for running jobs to finish before the rest are handed back",
        )
        g.add_argument(
            "--max-deliveries",
            type=int,
            default=_default("max_deliveries"),
            help="starts of a job (its worker dying each time) before it goes to the dead letters",
        )
        return g

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerConfig:
        """The config of parsed ``add_arguments`` flags; what no flag sets comes from the
        environment (``--prefix``, chaos: ``producer/envs.py``, ``worker/envs.py``)."""
        # Each flag's dest is its field's name: the fields the flags set, as parsed.
        flags = {
            f.name: vars(args)[f.name] for f in dataclasses.fields(cls) if f.name in vars(args)
        }
        flags["name"] = args.name or default_worker_name()
        flags["prefix"] = args.prefix or producer_envs.key_prefix()
        flags["chaos"] = envs.chaos()
        return cls(**flags)


def _default(name: str) -> Any:
    """A ``WorkerConfig`` field's default: the flags say it once, through this."""
    (f,) = [f for f in dataclasses.fields(WorkerConfig) if f.name == name]
    return f.default
