"""The gateway's settings: one frozen dataclass; the environment comes from ``envs.py``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway import envs
from gateway.envs import MAX_BODY_ENV as MAX_BODY_ENV  # re-exported: callers know it here
from gateway.tenancy import check_distinct_tags
from producer.protocol import MAX_PAYLOAD_BYTES
from producer.reconnect import DEFAULT_RECONNECT, ReconnectPolicy

DEFAULT_MODEL_NAME = "paternoster"
# Four times the protocol's payload limit (1 MiB: 4 MiB): JSON escapes (`\u00e9` is 6 bytes, 2
# in UTF-8) and whitespace can make the body of an admissible job that much larger.
DEFAULT_MAX_BODY_BYTES = 4 * MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class GatewayConfig:
    """What ``create_app`` needs. ``tokens`` empty: no auth, and a request may name its tenant."""

    redis_url: str | None = None  # None: REDIS_URL, else the embedded server
    prefix: str | None = None  # None: PATERNOSTER_PREFIX, else "paternoster"
    model_name: str = DEFAULT_MODEL_NAME
    tokens: Mapping[str, str] = field(default_factory=dict)  # bearer token -> tenant
    # OpenAI's chat API has no max_tokens default of its own we could copy (it runs to the
    # context's end); 256 keeps a forgotten limit from holding a batch slot for minutes.
    default_max_tokens: int = 256
    # A non-streaming OpenAI request waits this long for its job, then 504s and cancels it.
    request_timeout_s: float = 600.0
    # A comment line on an idle SSE stream this often: proxies keep it open, and a client that
    # left is noticed at the next write even where the server does not report disconnects.
    sse_ping_s: float = 15.0
    # How long a stream rides out a Redis outage before it ends with a redis_unavailable
    # error event; requests that are not streams answer 503 at once.
    reconnect: ReconnectPolicy = DEFAULT_RECONNECT
    # A request body past this is a 413, refused before it is read whole or parsed.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # The Batch API (docs/gateway.md#batch-api). Files' bytes live in Redis, or in this
    # directory when set (their objects stay in Redis either way).
    files_dir: str | None = None
    # One uploaded file at most. An upload is also a request body: with framing, a file this
    # large needs max_body_bytes raised by a few hundred bytes. A batch's output is not capped
    # by it (its lines, times their max_tokens, bound it; losing results would be worse).
    max_file_bytes: int = DEFAULT_MAX_BODY_BYTES
    # How long a file lives: OpenAI's default for purpose=batch files, 30 days; an upload's
    # expires_after may shorten it. A batch's object lives this long after it ends.
    files_ttl_s: int = 30 * 24 * 3600
    batch_runner: bool = True  # drive batches in this process (any number of gateways may)
    # A batch's jobs submitted and not yet finished, at most: ``batch_window_for`` the live
    # workers' batch slots, ``batch_slot_share`` of them (at least 1), capped by
    # ``batch_window``; the rest of its file waits in the gateway, not in Redis. Throughput
    # against interactive latency, 1,000 lines of 16 tokens, two workers of 64 slots on the
    # tiny model (ops/bench/batch_api.py, 2 shared cores, load 7-8): 64 in flight (poll
    # 0.2 s) 94 lines/s, interactive-band TTFT p99 4.9x idle's; 16 (poll 0.05 s, share
    # 0.125) 69-71 lines/s, 1.7x and 3.3x (p50 1.4x, 2.0x). On a CPU a step's time grows with
    # its rows; on a GPU it barely does until the batch is large: raise the share there.
    batch_slot_share: float = 0.125
    batch_window: int = 1024
    # How often a runner moves its batches on while any is active: the window refills at
    # this pace (16 jobs of 16 tokens end within 0.1-0.3 s here). Without active batches it
    # looks every ``BATCH_IDLE_POLL_S``.
    batch_poll_s: float = 0.05
    # Deliver job webhooks in this process too (``paternoster webhooks``' work, docs/webhooks.md).
    webhooks: bool = False

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_file_bytes", "files_ttl_s", "batch_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not 0 < self.batch_slot_share <= 1:
            raise ValueError(f"batch_slot_share must be in (0, 1], not {self.batch_slot_share}")
        check_distinct_tags(self.tokens.values())  # behind auth, tenants' ids must not meet

    def batch_window_for(self, slots: int) -> int:
        """A batch's jobs in flight at most, for ``slots`` live batch slots in the fleet."""
        return max(1, min(self.batch_window, int(self.batch_slot_share * slots)))

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens)

    @classmethod
    def from_env(cls, tokens_file: str | None = None, **overrides: object) -> GatewayConfig:
        """Settings from the environment; ``tokens_file`` (else ``PATERNOSTER_GATEWAY_TOKENS``)
        turns auth on. ``overrides`` that are None are ignored, so CLI flags pass straight in."""
        path = tokens_file or envs.tokens_file()
        values: dict[str, object] = {"model_name": envs.model_name()}
        values["tokens"] = load_tokens(Path(path)) if path else None
        values["max_body_bytes"] = envs.max_body_bytes()
        values.update(overrides)
        return cls(**{k: v for k, v in values.items() if v is not None})  # type: ignore[arg-type]


def load_tokens(path: Path) -> dict[str, str]:
    """``{token: tenant}`` from a JSON file; ValueError (the CLI's exit 2) when malformed."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"tokens file {path}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise ValueError(f"tokens file {path}: expected a non-empty object {{token: tenant}}")
    for token, tenant in data.items():
        if not token or not isinstance(tenant, str) or not tenant:
            raise ValueError(f"tokens file {path}: each token needs a non-empty tenant string")
    return dict(data)
