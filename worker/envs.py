"""Every environment variable the worker reads, in one place, with its default."""

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
