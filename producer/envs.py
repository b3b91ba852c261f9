"""Every environment variable the producer package reads, in one place, with its default.

The producer imports neither the worker nor the gateway, so it cannot use their modules; they
reach the variables they share with it (``REDIS_URL``, ``PATERNOSTER_PREFIX``) through this
one. Nothing else in ``producer/`` touches ``os.environ``.

- ``REDIS_URL``: where Redis is, for every client, the worker and the gateway (unset: an
  embedded redis-server, ``connection.py``).
- ``PATERNOSTER_PREFIX``: the key prefix, for the same (default ``paternoster``).
- ``PATERNOSTER_CACHE_DIR``: where the embedded Redis keeps its data file (default
  ``$XDG_CACHE_HOME/paternoster``, else ``~/.cache/paternoster``). The worker reads it too, with
  the same meaning, in ``worker/envs.py``: its engine and model loader import nothing of this
  package.
- ``PATERNOSTER_WEBHOOK_ALLOW``: comma-separated addresses, networks and host names a webhook
  may call although they are not public (``producer.webhook_policy``); producers, workers and
  the deliverer read it, so set it alike for all three.
- ``PATERNOSTER_WEBHOOK_SECRET``: the deliverer's default signing secret, for webhooks that
  carry none of their own (``whsec_`` and base64, as Standard Webhooks secrets are).
- ``PATERNOSTER_WEBHOOK_CA_BUNDLE``: a PEM file of the CAs the deliverer trusts for ``https``
  receivers instead of its default bundle (receivers behind a private CA).
"""

from __future__ import annotations

import os
from pathlib import Path

from producer.keys import DEFAULT_PREFIX

WEBHOOK_ALLOW_ENV = "PATERNOSTER_WEBHOOK_ALLOW"
WEBHOOK_SECRET_ENV = "PATERNOSTER_WEBHOOK_SECRET"
WEBHOOK_CA_BUNDLE_ENV = "PATERNOSTER_WEBHOOK_CA_BUNDLE"


def redis_url() -> str | None:
    """``REDIS_URL``, e.g. ``redis://127.0.0.1:6379/0``; None when unset."""
    return os.environ.get("REDIS_URL") or None


def key_prefix() -> str:
    """``PATERNOSTER_PREFIX``: the key prefix, so several job planes can share one Redis."""
    return os.environ.get("PATERNOSTER_PREFIX") or DEFAULT_PREFIX


def cache_dir() -> Path:
    """``PATERNOSTER_CACHE_DIR``, else ``$XDG_CACHE_HOME/paternoster``, else
    ``~/.cache/paternoster``: under it, the embedded Redis's data."""
    override = os.environ.get("PATERNOSTER_CACHE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "paternoster"


def webhook_allow() -> str:
    """``PATERNOSTER_WEBHOOK_ALLOW``, e.g. ``127.0.0.1,10.1.0.0/16``; empty when unset."""
    return os.environ.get(WEBHOOK_ALLOW_ENV, "")


def webhook_secret() -> str | None:
    """``PATERNOSTER_WEBHOOK_SECRET``; None when unset."""
    return os.environ.get(WEBHOOK_SECRET_ENV) or None


def webhook_ca_bundle() -> str | None:
    """``PATERNOSTER_WEBHOOK_CA_BUNDLE``, a PEM file's path; None when unset."""
    return os.environ.get(WEBHOOK_CA_BUNDLE_ENV) or None
