"""A seeded open-loop workload: job classes of a named mix (a JSON file) arriving as a bursty
Poisson process. ``load.py`` replays it against a worker; ``mixes/default.json`` is the default.

A mix file::

    {"name": "default",
     "arrivals": {"burst_every_s": 60, "burst_len_s": 10, "burst_factor": 4},
     "classes": [{"name": "chat", "weight": 0.6, "prompt_len": [16, 64], "output_len": [16, 64],
                  "priority": "interactive", "tenants": ["acme"], "cancel_fraction": 0.1,
                  "cancel_after_fraction": [0.1, 0.9]}, ...]}

Lengths are inclusive ranges and are forced (the client sends ``ignore_eos`` and
``min_tokens = max_tokens``), so every system does the same work. ``priority`` is an int or an
alias (``producer.protocol.PRIORITY_ALIASES``). A cancelled job is cancelled by the client once
it has ``cancel_after_tokens`` tokens, drawn from ``cancel_after_fraction`` of its length.

Arrivals: the last ``burst_len_s`` of every ``burst_every_s`` run at ``burst_factor`` times the
mean rate, the rest slower, so the mean over a period is the rate asked for. The first period
starts quiet: the first jobs meet an idle worker. Classes and lengths come from one random
stream and arrival times from another, so ``num_jobs`` jobs are the same jobs at every rate.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.bench.engine_workload import scaled_range
from producer.protocol import parse_priority

DEFAULT_MIX = Path(__file__).with_name("mixes") / "default.json"
SMOL_VOCAB = 49152  # SmolLM2's: token ids when the caller gives none (load.py gives the model's)


class MixError(ValueError):
    """A mix file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class JobClass:
    name: str
    weight: float  # relative share of the jobs
    prompt_len: tuple[int, int]  # inclusive, before scale
    output_len: tuple[int, int]
    priority: int  # lower is more urgent
    tenants: tuple[str, ...]  # each job picks one uniformly
    cancel_fraction: float = 0.0  # share of this class's jobs the client cancels mid-stream
    cancel_after_fraction: tuple[float, float] = (0.1, 0.9)  # of max_tokens, when cancelled


@dataclass(frozen=True)
class Arrivals:
    burst_every_s: float = 0.0  # 0: no bursts, a plain Poisson process
    burst_len_s: float = 0.0
    burst_factor: float = 1.0  # rate inside a burst, as a multiple of the mean rate

    def in_burst(self, t: float) -> bool:
        if self.burst_every_s <= 0 or self.burst_len_s <= 0:
            return False
        return t % self.burst_every_s >= self.burst_every_s - self.burst_len_s

    def rates(self, mean_rate: float) -> tuple[float, float]:
        """(quiet rate, burst rate) whose time-weighted mean is ``mean_rate``."""
        if not self.burst_every_s or not self.burst_len_s:
            return mean_rate, mean_rate
        share = self.burst_len_s / self.burst_every_s
        burst = self.burst_factor * mean_rate
        return (mean_rate - burst * share) / (1 - share), burst


@dataclass(frozen=True)
class Mix:
    name: str
    classes: tuple[JobClass, ...]
    arrivals: Arrivals = Arrivals()
    description: str = ""


@dataclass(frozen=True)
class WorkloadJob:
    job_id: str
    klass: str
    arrival_s: float  # since the start of the run
    prompt_token_ids: tuple[int, ...]
    max_tokens: int  # forced: exactly this many unless cancelled
    priority: int
    tenant: str
    cancel_after_tokens: int | None  # None: runs to the end


def _range(raw: Any, what: str, low: float) -> tuple[Any, Any]:
    if not (isinstance(raw, list | tuple) and len(raw) == 2):
        raise MixError(f"{what} must be [low, high], got {raw!r}")
    lo, hi = raw
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi)):
        raise MixError(f"{what} must be numbers, got {raw!r}")
    if not low <= lo <= hi:
        raise MixError(f"{what} must satisfy {low} <= low <= high, got {raw!r}")
    return lo, hi


def _job_class(raw: Mapping[str, Any], where: str) -> JobClass:
    known = set(JobClass.__dataclass_fields__)
    if unknown := set(raw) - known:
        raise MixError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
    for key in ("name", "weight", "prompt_len", "output_len"):
        if key not in raw:
            raise MixError(f"{where}: missing field {key!r}")
    name = raw["name"]
    weight, cancel = raw["weight"], raw.get("cancel_fraction", 0.0)
    if not isinstance(weight, int | float) or weight <= 0:
        raise MixError(f"{where} ({name}): weight must be a number > 0, got {weight!r}")
    if not isinstance(cancel, int | float) or not 0 <= cancel <= 1:
        raise MixError(f"{where} ({name}): cancel_fraction must be in [0, 1], got {cancel!r}")
    tenants = tuple(raw.get("tenants", ["default"]))
    if not tenants or not all(isinstance(t, str) and t for t in tenants):
        raise MixError(f"{where} ({name}): tenants must be a non-empty list of names")
    try:
        priority = parse_priority(raw.get("priority", "default"))
    except ValueError as exc:
        raise MixError(f"{where} ({name}): {exc}") from None
    lo, hi = _range(raw.get("cancel_after_fraction", (0.1, 0.9)), f"{where} cancel_after", 0.0)
    if hi > 1:
        raise MixError(f"{where} ({name}): cancel_after_fraction must be within [0, 1]")
    return JobClass(
        name=str(name),
        weight=float(weight),
        prompt_len=_range(raw["prompt_len"], f"{where} ({name}) prompt_len", 1),
        output_len=_range(raw["output_len"], f"{where} ({name}) output_len", 1),
        priority=priority,
        tenants=tenants,
        cancel_fraction=float(cancel),
        cancel_after_fraction=(float(lo), float(hi)),
    )


def parse_mix(raw: Any, source: str = "mix") -> Mix:
    """A Mix from parsed JSON; MixError naming ``source`` and the bad field otherwise."""
    if not isinstance(raw, dict) or not isinstance(raw.get("classes"), list) or not raw["classes"]:
        raise MixError(f"{source}: a mix is an object with a non-empty 'classes' list")
    classes = tuple(_job_class(c, f"{source}: classes[{i}]") for i, c in enumerate(raw["classes"]))
    if len({c.name for c in classes}) != len(classes):
        raise MixError(f"{source}: class names must be unique")
    try:
        arrivals = Arrivals(**{k: float(v) for k, v in raw.get("arrivals", {}).items()})
    except (TypeError, ValueError) as exc:
        raise MixError(f"{source}: arrivals: {exc}") from None
    a = arrivals
    share = a.burst_len_s / a.burst_every_s if a.burst_every_s > 0 else 0.0
    if a.burst_factor < 1 or not 0 <= share < 1 or a.burst_factor * share >= 1:
        raise MixError(
            f"{source}: arrivals need burst_factor >= 1, 0 <= burst_len_s < burst_every_s and "
            f"burst_factor * burst_len_s / burst_every_s < 1 (the quiet rate must stay > 0)"
        )
    return Mix(str(raw.get("name", source)), classes, arrivals, str(raw.get("description", "")))


def load_mix(path: str | Path) -> Mix:
    """The mix in a JSON file; MixError (a ValueError) with the reason when it is not one."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise MixError(f"{path}: no such mix file") from None
    except json.JSONDecodeError as exc:
        raise MixError(f"{path}: not JSON: {exc}") from None
    return parse_mix(raw, str(path))


def arrival_times(
    arrivals: Arrivals,
    rate_per_s: float,
    rng: random.Random,
    *,
    duration_s: float | None,
    num_jobs: int | None,
) -> list[float]:
    """Poisson arrivals at the burst-modulated rate, by thinning a process at the peak rate."""
    quiet, burst = arrivals.rates(rate_per_s)
    peak = max(quiet, burst)
    times: list[float] = []
    t = 0.0
    while num_jobs is None or len(times) < num_jobs:
        t += rng.expovariate(peak)
        if duration_s is not None and t >= duration_s:
            break
        if rng.random() * peak < (burst if arrivals.in_burst(t) else quiet):
            times.append(t)
    return times


def generate(
    mix: Mix,
    *,
    rate_per_s: float,
    duration_s: float | None = None,
    num_jobs: int | None = None,
    seed: int = 0,
    scale: float = 1.0,
    token_ids: Sequence[int] = range(SMOL_VOCAB),
) -> list[WorkloadJob]:
    """Jobs sorted by arrival: give ``duration_s`` (arrivals until then) or ``num_jobs``.
    ``scale`` multiplies every length range (0.1 for smoke runs); prompts are ``token_ids``
    drawn at random (load.py passes the model's ordinary tokens)."""
    if (duration_s is None) == (num_jobs is None):
        raise ValueError("give exactly one of duration_s and num_jobs")
    if rate_per_s <= 0 or scale <= 0:
        raise ValueError("rate_per_s and scale must be > 0")
    arrival_rng = random.Random(f"{seed}-arrivals")
    times = arrival_times(
        mix.arrivals, rate_per_s, arrival_rng, duration_s=duration_s, num_jobs=num_jobs
    )
    rng = random.Random(seed)
    weights = [c.weight for c in mix.classes]
    jobs = []
    for i, t in enumerate(times):
        c = rng.choices(mix.classes, weights)[0]
        prompt_len = rng.randint(*scaled_range(c.prompt_len, scale))
        max_tokens = rng.randint(*scaled_range(c.output_len, scale))
        tenant = rng.choice(c.tenants)
        cancel_after = None
        if rng.random() < c.cancel_fraction and max_tokens >= 2:
            share = rng.uniform(*c.cancel_after_fraction)
            cancel_after = min(max_tokens - 1, max(1, round(share * max_tokens)))
        prompt = tuple(rng.choices(token_ids, k=prompt_len))
        row = (f"j{i:05d}-{c.name}", c.name, t, prompt, max_tokens, c.priority, tenant)
        jobs.append(WorkloadJob(*row, cancel_after_tokens=cancel_after))
    return jobs


def totals(jobs: Sequence[WorkloadJob]) -> dict[str, Any]:
    """Counts and token totals per class: the offered work."""
    per_class: dict[str, dict[str, int]] = {}
    for j in jobs:
        c = per_class.setdefault(j.klass, {"jobs": 0, "prompt_tokens": 0, "output_tokens": 0})
        c["jobs"] += 1
        c["prompt_tokens"] += len(j.prompt_token_ids)
        c["output_tokens"] += j.max_tokens
    span = jobs[-1].arrival_s if jobs else 0.0
    return {
        "num_jobs": len(jobs),
        "prompt_tokens": sum(len(j.prompt_token_ids) for j in jobs),
        "output_tokens": sum(j.max_tokens for j in jobs),
        "cancelled_jobs": sum(j.cancel_after_tokens is not None for j in jobs),
        "arrival_span_s": span,
        "offered_jobs_per_s": len(jobs) / span if span > 0 else None,
        "per_class": per_class,
    }
