"""Which webhook URLs may be called: the one address policy of submit, the worker and the deliverer.

A webhook makes the deliverer send a request wherever a job says, from inside the deployment's
network: left open, a job could reach a cloud metadata service (169.254.169.254), Redis, or an
admin port on loopback. So only ``http``/``https`` URLs pass, and a host that is (or resolves
to) a private, loopback, link-local, unique-local, multicast, reserved or unspecified address is
refused unless the allowlist (``PATERNOSTER_WEBHOOK_ALLOW``: addresses, networks, host names,
comma-separated) names it. An IP literal or a ``localhost`` name is refused at submit, before
anything connects; other names are resolved by the deliverer, which checks every address they
resolve to and then connects to the checked address itself (no second lookup to rebind).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from producer import envs

SCHEMES = ("http", "https")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookRefused(ValueError):
    """A webhook URL the policy refuses; the message names the URL's part and why."""


@dataclass(frozen=True)
class Allowlist:
    """What the operator allows besides public addresses: networks and exact host names."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        """``"127.0.0.1, 10.0.0.0/8, hooks.internal"``: addresses, networks and host names."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                hosts.add(item.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    @classmethod
    def from_env(cls) -> Allowlist:
        return cls.parse(envs.webhook_allow())

    def allows(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks if net.version == address.version)


@dataclass(frozen=True)
class Target:
    """A URL that passed the checks at submit: its scheme, host (lowercase), port, and whether
    the host is an IP literal or an allowlisted name (nothing left to check at delivery)."""

    scheme: str
    host: str
    port: int
    literal: IPAddress | None
    allowed_name: bool


def refusal(address: IPAddress) -> str | None:
    """Why an address is not public (None: it is)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),  # RFC 1918, fc00::/7 unique-local, 100.64/10 ...
        ("reserved", address.is_reserved),
    )
    return next((name for name, hit in checks if hit), None)


def check_address(address: IPAddress, allow: Allowlist, host: str) -> None:
    """WebhookRefused unless ``address`` is public or allowlisted."""
    why = refusal(address)
    if why is not None and not allow.allows(address):
        raise WebhookRefused(
            f"webhook url host {host!r} is a {why} address ({address}); refused unless "
            f"{envs.WEBHOOK_ALLOW_ENV} names it"
        )


def check_url(url: str, allow: Allowlist | None = None) -> Target:
    """The URL's target, checked as far as possible without a lookup; WebhookRefused if not."""
    allow = Allowlist.from_env() if allow is None else allow
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"webhook url is malformed: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise WebhookRefused(f"webhook url scheme must be http or https, not {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookRefused("webhook url has no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("webhook url must not carry credentials (sign with the secret)")
    default_port = 443 if parts.scheme == "https" else 80
    target = Target(parts.scheme, host, port or default_port, None, host in allow.hosts)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        if not target.allowed_name and (host == "localhost" or host.endswith(".localhost")):
            raise WebhookRefused(
                f"webhook url host {host!r} is loopback; refused unless "
                f"{envs.WEBHOOK_ALLOW_ENV} names it"
            ) from None
        return target
    if not target.allowed_name:
        check_address(literal, allow, host)
    return Target(target.scheme, host, target.port, literal, target.allowed_name)


def check_resolved(target: Target, addresses: Iterable[IPAddress], allow: Allowlist) -> IPAddress:
    """The address to connect to: the first of what the host resolved to, after every one of
    them passed (a name with one private address among public ones is refused whole)."""
    found = list(addresses)
    if not found:
        raise WebhookRefused(f"webhook url host {target.host!r} resolved to no address")
    if not target.allowed_name:
        for address in found:
            check_address(address, allow, target.host)
    return found[0]
