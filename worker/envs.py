"""Every environment variable the worker reads, in one place, with its default.

Nothing else in ``worker/`` touches ``os.environ``. ``REDIS_URL`` and ``PATERNOSTER_PREFIX``
are the producer's (``producer/envs.py``, the producer package's one place: it cannot import
the worker); the job service reads them through it. ``PATERNOSTER_CACHE_DIR`` is read in both
places with the same meaning: the engine and the model loader import nothing of the producer.

- ``PATERNOSTER_MODEL``: the model used when ``--model`` is not given (default: the bundled
  SmolLM2-135M-Instruct).
- ``PATERNOSTER_CACHE_DIR``: where converted models live (default
  ``$XDG_CACHE_HOME/paternoster``, else ``~/.cache/paternoster``).
- ``PATERNOSTER_CHAOS``: ``1`` turns fault injection on (``WorkerConfig.chaos``): for the
  reliability tests and the chaos bench, never in production.
- ``PATERNOSTER_CHAOS_STEP_DELAY_S``: with chaos on, seconds added to every engine step.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted models live: ``PATERNOSTER_CACHE_DIR``, else ``~/.cache/paternoster``."""
    override = os.environ.get("PATERNOSTER_CACHE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "paternoster"


def default_model() -> str | None:
    """``PATERNOSTER_MODEL``: the model path used when none is given on the command line."""
    return os.environ.get("PATERNOSTER_MODEL") or None


def chaos() -> bool:
    """``PATERNOSTER_CHAOS=1``: fault injection on (``WorkerConfig.chaos``)."""
    return os.environ.get("PATERNOSTER_CHAOS") == "1"


def chaos_step_delay_s() -> float:
    """``PATERNOSTER_CHAOS_STEP_DELAY_S``: seconds added to each step under chaos (default 0)."""
    return float(os.environ.get("PATERNOSTER_CHAOS_STEP_DELAY_S") or 0)
