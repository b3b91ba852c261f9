"""Standard Webhooks signatures: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``.

The signed content is ``f"{id}.{timestamp}.{body}"``; the signature is ``v1,`` and the base64
HMAC-SHA256 of it. A secret written ``whsec_<base64>`` (the spec's convention, what its
libraries generate and verify with) signs with the decoded bytes; any other string signs with
its UTF-8 bytes, and a receiver verifies with the same string.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24  # the spec's libraries generate 24 random bytes (32 base64 characters)


class InvalidSecret(ValueError):
    """A ``whsec_`` secret whose rest is not base64."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a secret: base64-decoded after ``whsec_``, else the string's bytes."""
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode()
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error as exc:
        raise InvalidSecret(f"a {SECRET_PREFIX} secret must be base64 after the prefix") from exc


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signature(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, delivery_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The request's headers: the three of the spec, and the body's type."""
    return {
        "content-type": "application/json",
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, delivery_id, timestamp, body),
    }
