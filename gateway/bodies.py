"""Request bodies at the door: bounded in size before they are read whole, strict JSON after.

``BodyLimit`` answers 413 for a body over ``GatewayConfig.max_body_bytes``, by its
Content-Length before reading a byte, or by counting a chunked body as it arrives; it then
hands the app the body it read, so nothing past the limit is ever held or parsed. Before the
413 it reads and drops the rest of the body (up to `DRAIN_MAX_BYTES`, for `DRAIN_S`): a socket
closed with unread bytes in it is reset, and the reset can overtake the 413 on its way to the
client (a 4 MiB + 1 upload on a loaded 2-core machine got "peer closed connection without
sending complete message body" instead of its 413, 2026-12-04).

``StrictJsonRoute`` parses JSON bodies as RFC 8259 has them: UTF-8, and no lone surrogate
(``"\\udcff"``), which Python's ``json`` reads into a string that fails later, when it is
encoded for Redis (a 500). Both refusals are a 422 naming what is wrong.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic_core import from_json
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ApiError

DRAIN_MAX_BYTES = 64 << 20  # an upload larger than this is cut off without being read
DRAIN_S = 2.0  # nor is one that takes longer than this to arrive


class _Disconnected(Exception):
    """The client left before its body ended: there is nobody to answer."""


def too_large(max_body_bytes: int) -> ApiError:
    # Connection: close, since the rest of a chunked body was not read and must not be taken
    # for the next request on the connection.
    return ApiError(
        413,
        f"request body larger than this gateway's limit of {max_body_bytes} bytes",
        code="request_too_large",
        headers={"Connection": "close"},
    )


class BodyLimit:
    """ASGI middleware: the request's body, at most ``max_body_bytes``, else a 413."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        try:
            body = None if _over(declared, self.max_body_bytes) else await self._read(receive)
            if body is None:
                await _drain(receive)
        except _Disconnected:
            return
        if body is None:
            await too_large(self.max_body_bytes).response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit (the rest is left unread)."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            part: bytes = message.get("body", b"")
            size += len(part)
            if size > self.max_body_bytes:
                return None
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of the body, up to `DRAIN_MAX_BYTES` and `DRAIN_S`."""
    size, deadline = 0, time.monotonic() + DRAIN_S
    while size <= DRAIN_MAX_BYTES and (left := deadline - time.monotonic()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except TimeoutError:
            return
        if message["type"] == "http.disconnect":
            raise _Disconnected
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _over(content_length: str, max_body_bytes: int) -> bool:
    # A malformed Content-Length never gets here: the HTTP server refuses it with a 400.
    return content_length.isdigit() and int(content_length) > max_body_bytes


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body read already, then the server's messages
    (a streaming response waits on them for the client's disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def strict_json(body: bytes) -> Any:
    """``body`` parsed as JSON; ``json.JSONDecodeError`` (FastAPI's 422) when it is not UTF-8,
    holds a lone surrogate, or is not JSON. pydantic-core's parser refuses all three, in one
    pass, where ``json.loads`` would have to be followed by a walk over every string."""
    try:
        return from_json(body)
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc), "", 0) from None


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is parsed by ``strict_json``: the routers' ``route_class``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict_handler
