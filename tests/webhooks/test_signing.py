"""Signatures as Standard Webhooks defines them, checked by the test's own verifier."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest

from gateway.webhooks import signing
from tests.webhooks.conftest import SECRET, verify

BODY = b'{"type":"job.done","data":{"job_id":"j1","text":"caf\\u00e9"}}'


def test_a_signed_request_verifies_with_an_independent_verifier() -> None:
    ts = int(time.time())
    headers = signing.headers(SECRET, "j1:terminal:1.5", ts, BODY)
    assert headers["webhook-id"] == "j1:terminal:1.5"
    assert headers["webhook-timestamp"] == str(ts)
    assert headers["webhook-signature"].startswith("v1,")
    assert verify(SECRET, headers, BODY)


@pytest.mark.parametrize("change", ["body", "id", "timestamp", "secret"])
def test_any_change_breaks_the_signature(change: str) -> None:
    ts = int(time.time())
    headers = signing.headers(SECRET, "j1:terminal:1.5", ts, BODY)
    body, secret = BODY, SECRET
    if change == "body":
        body = BODY.replace(b"j1", b"j2")
    elif change == "id":
        headers["webhook-id"] = "j2:terminal:1.5"
    elif change == "timestamp":
        headers["webhook-timestamp"] = str(ts - 1)
    else:
        secret = "whsec_" + base64.b64encode(b"another key").decode()
    assert not verify(secret, headers, body)


def test_a_plain_secret_signs_with_its_utf8_bytes() -> None:
    ts = 1_700_000_000
    expected = hmac.new(b"s3cret", b"d1.1700000000." + BODY, hashlib.sha256).digest()
    assert (
        signing.signature("s3cret", "d1", ts, BODY) == "v1," + base64.b64encode(expected).decode()
    )


def test_a_whsec_secret_must_be_base64() -> None:
    with pytest.raises(signing.InvalidSecret, match="base64"):
        signing.secret_key("whsec_not base64!")


def test_new_secrets_are_whsec_base64_of_24_bytes() -> None:
    secret = signing.new_secret()
    assert secret.startswith("whsec_") and len(signing.secret_key(secret)) == 24
    assert secret != signing.new_secret()
