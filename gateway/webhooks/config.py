"""The deliverer's settings: one frozen dataclass, its flags derived from its fields."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gateway.webhooks.signing import secret_key
from producer import envs


def _consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WebhookConfig:
    """How deliveries are made and retried. After failed attempt n the wait is
    ``backoff_base_s * 2**(n-1)``, scaled by a random 0.5-1.0 so receivers that failed together
    are not retried together: ten attempts span 1 + 2 + ... + 256 = 511 s, 4.3 to 8.5 minutes,
    and no attempt is started past ``max_total_s`` after the first."""

    max_attempts: int = 10  # then the delivery is dead-lettered
    max_total_s: float = 3600.0  # no attempt this long after the first: dead letter
    backoff_base_s: float = 1.0
    backoff_max_s: float = 600.0  # one wait at most, Retry-After included
    # One attempt, connect to the last byte read; a receiver should answer 2xx at once and
    # work afterwards (Standard Webhooks recommends 15 s at most).
    request_timeout_s: float = 10.0
    max_response_bytes: int = 64 * 1024  # read at most this much of a receiver's answer
    max_in_flight: int = 64  # deliveries (and their backoff waits) one deliverer holds at once
    # A delivery pending this long under a deliverer that stopped touching it (killed) is taken
    # over by another; a live deliverer touches its own every claim_idle_s / 3.
    claim_idle_s: float = 30.0
    read_block_ms: int = 1000
    record_ttl_s: int = 7 * 24 * 3600  # delivery hashes kept this long after their last write
    # Signs webhooks without a secret of their own (PATERNOSTER_WEBHOOK_SECRET).
    default_secret: str | None = field(default_factory=envs.webhook_secret, repr=False)
    # A PEM file of the CAs that https receivers' certificates must chain to, instead of the
    # default bundle (certifi's): receivers behind a private CA (PATERNOSTER_WEBHOOK_CA_BUNDLE).
    ca_bundle: str | None = field(default_factory=envs.webhook_ca_bundle)
    name: str = field(default_factory=_consumer_name)  # this deliverer's consumer name

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and value <= 0:
                raise ValueError(f"webhooks: {f.name} must be > 0, not {value}")
        if self.default_secret is not None:  # a bad one would dead-letter every delivery
            secret_key(self.default_secret)
        if self.ca_bundle is not None and not Path(self.ca_bundle).is_file():
            raise ValueError(f"webhooks: ca_bundle {self.ca_bundle!r} is not a file")

    @property
    def touch_every_s(self) -> float:
        return self.claim_idle_s / 3

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One ``--flag`` per number field (``--max-attempts``), its default the field's."""
        g = parser.add_argument_group("delivery")
        for f in dataclasses.fields(cls):
            if f.type in ("int", "float"):
                kind = int if f.type == "int" else float
                flag = "--" + f.name.replace("_", "-")
                g.add_argument(flag, type=kind, default=f.default, help=f"default {f.default}")
        g.add_argument(
            "--ca-bundle",
            default=None,
            metavar="PEM",
            help=f"CAs to trust for https receivers (default: ${envs.WEBHOOK_CA_BUNDLE_ENV}, "
            "else the default bundle)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WebhookConfig:
        numbers = {
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(cls)
            if f.type in ("int", "float") and hasattr(args, f.name)
        }
        ca_bundle = getattr(args, "ca_bundle", None)
        return cls(**numbers, **({"ca_bundle": ca_bundle} if ca_bundle else {}))
