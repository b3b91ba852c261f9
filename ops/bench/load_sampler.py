"""Scrapes a worker's Prometheus /metrics on a thread while ``load.py`` runs its load.

Every ``every_s`` (0.5 s by default: a CPU step takes ~200 ms, so each sample sees a new step or
two; a scrape costs the worker ~1 ms of rendering) it keeps the KV cache usage, the running and
waiting sequences, and the counters the report turns into per-run deltas (preemptions by reason,
intake rejections by code, steps, generated tokens).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

GAUGES = {
    "paternoster_kv_cache_usage_ratio": "kv_usage",
    "paternoster_kv_cache_used_blocks": "kv_used_blocks",
    "paternoster_kv_cache_total_blocks": "kv_total_blocks",
    "paternoster_running_sequences": "running",
    "paternoster_waiting_sequences": "waiting",
    "paternoster_steps_total": "steps",
    "paternoster_generated_tokens_total": "generated_tokens",
}
# Counters with one label: {label value: count}.
LABELLED = {
    "paternoster_preemptions_total": ("preemptions", "reason"),
    "paternoster_jobs_rejected_total": ("rejected", "code"),
}


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """One sample of ``url`` (a /metrics address), stamped with the wall clock (unix s)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        text = reply.read().decode()
    sample: dict[str, Any] = {"t_unix": time.time()}
    sample.update({name: {} for name, _ in LABELLED.values()})
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in GAUGES:
                sample[GAUGES[s.name]] = s.value
            elif s.name in LABELLED:
                name, label = LABELLED[s.name]
                sample[name][s.labels.get(label, "")] = s.value
    return sample


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the counters of two samples say happened between them."""
    out: dict[str, Any] = {
        key: after.get(key, 0.0) - before.get(key, 0.0) for key in ("steps", "generated_tokens")
    }
    for name, _ in LABELLED.values():
        keys = set(before[name]) | set(after[name])
        out[name] = {k: after[name].get(k, 0.0) - before[name].get(k, 0.0) for k in sorted(keys)}
    return out


class Sampler:
    """``start()`` scrapes until ``stop()``; ``samples`` holds every one that answered."""

    def __init__(self, url: str, every_s: float = 0.5) -> None:
        self.url, self.every_s = url, every_s
        self.samples: list[dict[str, Any]] = []
        self.errors = 0  # scrapes that failed (the worker busy past the timeout, or gone)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(scrape(self.url))
            except OSError:
                self.errors += 1
            self._stop.wait(self.every_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
