"""Every environment variable the gateway reads, in one place; ``config.py`` turns them into a
``GatewayConfig``. ``REDIS_URL`` and ``PATERNOSTER_PREFIX`` are read through the producer
(``producer/envs.py``), whose clients the gateway uses. Nothing else in ``gateway/`` touches
``os.environ``.

- ``PATERNOSTER_GATEWAY_TOKENS``: a JSON file ``{token: tenant}``; set, bearer auth is on.
- ``PATERNOSTER_GATEWAY_MODEL``: the model name the OpenAI routes answer to.
- ``PATERNOSTER_GATEWAY_MAX_BODY_BYTES``: the request body limit (an integer).
"""

from __future__ import annotations

import os

TOKENS_ENV = "PATERNOSTER_GATEWAY_TOKENS"  # path to a JSON file {token: tenant}
MODEL_NAME_ENV = "PATERNOSTER_GATEWAY_MODEL"
MAX_BODY_ENV = "PATERNOSTER_GATEWAY_MAX_BODY_BYTES"


def tokens_file() -> str | None:
    return os.environ.get(TOKENS_ENV) or None


def model_name() -> str | None:
    return os.environ.get(MODEL_NAME_ENV) or None


def max_body_bytes() -> int | None:
    return env_int(MAX_BODY_ENV)


def env_int(name: str) -> int | None:
    """An int environment variable, None when unset; ValueError naming it when not an int."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, not {text!r}") from None
