"""Tenant fairness: a virtual token counter per tenant (VTC, Sheng et al., OSDI 2024).

Each tenant's counter grows by the service its sequences receive, divided by the tenant's
weight; the scheduler admits, within one priority, from the tenant with the smallest counter.
A tenant that floods the queue therefore cannot starve one that submits a tenth as much: once
its counter is ahead, the other tenant's jobs go first until the counters meet.

A tenant that comes back after a pause has its counter lifted to the smallest counter among
tenants already active, so idle time is not banked as credit for a later burst (VTC's rule).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from worker.engine.sequence import Sequence

# VTC's default costs: an output token counts twice a prompt token, since a decode step costs
# a full pass over the weights for one token while prefill amortises it over many.
PROMPT_TOKEN_COST = 1.0
OUTPUT_TOKEN_COST = 2.0


class FairShare:
    """Per-tenant virtual counters and the number of unfinished sequences each tenant has."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = dict(weights or {})
        self._counters: dict[str, float] = {}
        self._active: dict[str, int] = {}  # tenant -> unfinished sequences (waiting or running)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def activate(self, tenant: str) -> None:
        """A sequence of ``tenant`` joined; a tenant with none before is lifted (see module)."""
        if self._active.get(tenant, 0) == 0:
            others = [self.counter(t) for t, n in self._active.items() if n > 0]
            if others:
                self._counters[tenant] = max(self.counter(tenant), min(others))
        self._active[tenant] = self._active.get(tenant, 0) + 1

    def deactivate(self, tenant: str) -> None:
        """A sequence of ``tenant`` finished."""
        left = self._active.get(tenant, 0) - 1
        if left > 0:
            self._active[tenant] = left
        else:
            self._active.pop(tenant, None)

    def charge(self, tenant: str, *, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        cost = prompt_tokens * PROMPT_TOKEN_COST + output_tokens * OUTPUT_TOKEN_COST
        if cost:
            self._counters[tenant] = self.counter(tenant) + cost / self.weight(tenant)


def capped_tenants(running: Iterable[Sequence], cap: int | None) -> set[str]:
    """Tenants running ``cap`` sequences already (none without a cap)."""
    if cap is None:
        return set()
    counts = Counter(s.tenant for s in running)
    return {t for t, n in counts.items() if n >= cap}


def parse_tenant_weights(items: Iterable[str]) -> dict[str, float]:
    """``--tenant-weight TENANT=WEIGHT`` items as ``SchedulerConfig.tenant_weights``."""
    weights = {}
    for item in items:
        tenant, sep, weight = item.partition("=")
        if not sep or not tenant:
            raise ValueError(f"--tenant-weight takes TENANT=WEIGHT, got {item!r}")
        weights[tenant] = float(weight)
    return weights
