"""Bearer-token auth: with tokens configured, every API request names its tenant by its token.

The tenant then comes from the token and never from the body, so one customer cannot spend
another's quota or read another's jobs. Without tokens the gateway trusts its network, as Redis
does, and a request may name any tenant.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from gateway.errors import ApiError


@dataclass(frozen=True)
class Caller:
    """Who is asking: ``tenant`` None means no auth is configured (any tenant may be named)."""

    tenant: str | None = None

    def tenant_for(self, requested: str | None) -> str | None:
        """The tenant a new job gets: the token's, else what the request named."""
        return self.tenant if self.tenant is not None else requested

    def may_see(self, job_tenant: str | None) -> bool:
        return self.tenant is None or job_tenant == self.tenant


def _match(tokens: dict[str, str], given: str) -> str | None:
    # compare_digest on each: how long a wrong token took says nothing about the right ones.
    found = None
    for token, tenant in tokens.items():
        if hmac.compare_digest(token.encode(), given.encode()):
            found = tenant
    return found


async def caller(request: Request) -> Caller:
    """FastAPI dependency: the request's Caller, or 401 when auth is on and the token is bad."""
    tokens: dict[str, str] = dict(request.app.state.config.tokens)
    if not tokens:
        return Caller()
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    tenant = _match(tokens, token.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise ApiError(
            401,
            "missing or invalid bearer token (Authorization: Bearer <token>)",
            type_="authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Caller(tenant)
