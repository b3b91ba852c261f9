"""A real TLS handshake through the pinned-address path: a receiver on 127.0.0.1 serving a
certificate for a host name only (no IP in it), made here by a CA made here; the name resolves
to 127.0.0.1, which the allowlist names (the name itself is not allowlisted, so the deliverer
pins the checked address). Trusting that CA (``ca_bundle``) the delivery arrives verified, the
server name sent and the ``Host`` header being the URL's host; trusting the default bundle it
fails the handshake."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.webhooks.config import WebhookConfig
from producer import envs
from producer.keys import Keys
from producer.webhook_policy import IPAddress
from tests.webhooks.conftest import Receiver, cancelled_jobs, deliver_until, serving

HOST = "hooks.paternoster.test"  # .test never resolves in public DNS (RFC 2606)


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA's certificate: the deliverer's ca_bundle
    cert: Path  # the receiver's, for HOST only, signed by the CA
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is missing: apt-get install openssl")
    d = tmp_path_factory.mktemp("tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=paternoster test CA", cwd=d)  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={HOST}",
             cwd=d)  # fmt: skip
    # What a strict verifier wants of a leaf: its name as a SAN, key ids, server auth.
    (d / "leaf.ext").write_text(
        f"subjectAltName=DNS:{HOST}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "keyUsage=digitalSignature\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "leaf.ext",
             cwd=d)  # fmt: skip
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key")


def _server_context(certs: Certs, names: list[str | None]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.cert, certs.key)

    def sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        names.append(name)  # what the client sent as its server name (None: none)

    ctx.sni_callback = sni
    return ctx


async def _to_loopback(host: str, _port: int) -> list[IPAddress]:
    """The name's one address, as a resolver would answer it."""
    assert host == HOST
    return [ipaddress.ip_address("127.0.0.1")]


def _deliver(redis_url: str, prefix: str, url: str, client: Any, **config: Any) -> str:
    """One job's terminal delivery to ``url``, run until it ends; its job id."""
    (job_id,) = cancelled_jobs(redis_url, prefix, url, 1)
    keys = Keys(prefix)

    def ended() -> bool:
        outcome = client.hget(keys.delivery(job_id), "terminal_outcome")
        return outcome in ("delivered", "dead_letter")

    asyncio.run(deliver_until(redis_url, prefix, ended, resolve=_to_loopback, **config))
    return job_id


def test_a_delivery_over_tls_to_a_pinned_name_arrives_verified(
    certs: Certs, redis_url: str, key_prefix: str, client: Any
) -> None:
    receiver, names = Receiver(), list[str | None]()
    with serving(receiver, _server_context(certs, names), host=HOST) as url:
        job_id = _deliver(redis_url, key_prefix, url, client, ca_bundle=str(certs.ca))
    port = url.split(":")[2].split("/")[0]
    assert receiver.by_job() == {job_id: 1} and receiver.bad == 0
    assert names == [HOST]  # the TLS server name: the URL's host, not 127.0.0.1
    assert receiver.hosts == [f"{HOST}:{port}"]
    record = client.hgetall(Keys(key_prefix).delivery(job_id))
    assert record["terminal_outcome"] == "delivered" and record["terminal_last_status"] == "200"


def test_an_untrusted_certificate_is_not_delivered(
    certs: Certs, redis_url: str, key_prefix: str, client: Any
) -> None:
    receiver, names = Receiver(), list[str | None]()
    with serving(receiver, _server_context(certs, names), host=HOST) as url:
        job_id = _deliver(redis_url, key_prefix, url, client, max_attempts=1)
    assert receiver.attempts == {} and names == [HOST]  # the handshake failed: no request
    ((_, dead),) = client.xrange(Keys(key_prefix).webhook_dead)
    assert dead["id"] == job_id and "CERTIFICATE_VERIFY_FAILED" in dead["reason"]


def test_the_ca_bundle_from_the_flag_or_the_environment(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = argparse.ArgumentParser()
    WebhookConfig.add_arguments(parser)
    flagged = WebhookConfig.from_args(parser.parse_args(["--ca-bundle", str(certs.ca)]))
    assert flagged.ca_bundle == str(certs.ca) and WebhookConfig().ca_bundle is None
    monkeypatch.setenv(envs.WEBHOOK_CA_BUNDLE_ENV, str(certs.ca))
    assert WebhookConfig.from_args(parser.parse_args([])).ca_bundle == str(certs.ca)
    with pytest.raises(ValueError, match="is not a file"):
        WebhookConfig(ca_bundle=str(certs.ca.parent / "missing.pem"))
