"""Request bodies at the door: a size limit (413), JSON that must be valid UTF-8 with no lone
surrogates (4xx), and every refusal in the documented error shape."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.config import MAX_BODY_ENV, GatewayConfig
from producer.protocol import MAX_PAYLOAD_BYTES
from tests.gateway.conftest import Served, serve, stop

LIMIT = 2048  # the small gateway's limit: bodies a little past it fit in any socket buffer
JSON = {"content-type": "application/json"}
ROUTES = ("/v1/jobs", "/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def small_gateway(redis_url: str, gw_prefix: str) -> Iterator[Served]:
    """A gateway with a 2 KiB body limit, on the idle prefix (no worker: jobs stay queued)."""
    config = GatewayConfig(
        redis_url=redis_url, prefix=f"{gw_prefix}-idle", max_body_bytes=LIMIT, request_timeout_s=1
    )
    served = serve(config)
    yield served
    stop(served)


def assert_error_shape(response: httpx.Response, status: int | tuple[int, ...]) -> dict[str, str]:
    assert response.status_code in (status if isinstance(status, tuple) else (status,)), (
        response.status_code,
        response.text,
    )
    error: dict[str, str] = response.json()["error"]
    assert {"message", "type", "code", "param"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    return error


def padded(size: int, body: bytes = b'{"prompt": "Hi", "max_tokens": 1}') -> bytes:
    """``body`` with spaces inside, ``size`` bytes in all: still the same JSON."""
    return body[:-1] + b" " * (size - len(body)) + b"}"


def chunks(body: bytes, size: int = 512) -> Iterator[bytes]:
    """A generator body: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.mark.parametrize("path", ROUTES)
def test_body_over_limit_is_413(small_gateway: Served, path: str) -> None:
    with small_gateway.client() as client:
        declared = client.post(path, content=padded(LIMIT + 1), headers=JSON)
        error = assert_error_shape(declared, 413)
        assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
        streamed = client.post(path, content=chunks(padded(2 * LIMIT)), headers=JSON)
        assert "content-length" not in streamed.request.headers
        assert assert_error_shape(streamed, 413)["code"] == "request_too_large"


def test_body_at_limit_is_read(small_gateway: Served) -> None:
    with small_gateway.client() as client:
        for content in (padded(LIMIT), chunks(padded(LIMIT))):
            created = client.post("/v1/jobs", content=content, headers=JSON)
            assert created.status_code == 201, created.text
            job_id = created.json()["job_id"]
            assert client.post(f"/v1/jobs/{job_id}/cancel").json()["outcome"] == "cancelled"


def test_default_limit_is_4_mib(idle_gateway: Served) -> None:
    assert GatewayConfig().max_body_bytes == 4 * MAX_PAYLOAD_BYTES == 4 * 1024 * 1024
    with idle_gateway.client() as client:
        big = client.post("/v1/jobs", content=padded(4 * 1024 * 1024 + 1), headers=JSON)
        assert assert_error_shape(big, 413)["code"] == "request_too_large"


def test_limit_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_BODY_ENV, "1000")
    assert GatewayConfig.from_env().max_body_bytes == 1000
    monkeypatch.setenv(MAX_BODY_ENV, "lots")
    with pytest.raises(ValueError, match=MAX_BODY_ENV):
        GatewayConfig.from_env()
    with pytest.raises(ValueError, match="max_body_bytes"):
        GatewayConfig(max_body_bytes=0)


BAD_TEXT = {
    "lone low surrogate": rb"\udcff",
    "lone high surrogate": rb"\ud83d",
    "reversed pair": rb"\udc00\ud800",
}


def bodies(text: bytes) -> dict[str, bytes]:
    """A body for each route with ``text`` inside a JSON string."""
    return {
        "/v1/jobs": b'{"prompt": "a' + text + b'", "max_tokens": 1}',
        "/v1/completions": b'{"model": "m", "prompt": "' + text + b'", "max_tokens": 1}',
        "/v1/chat/completions": b'{"messages": [{"role": "user", "content": "'
        + text
        + b'"}], "max_tokens": 1}',
    }


@pytest.mark.parametrize("text", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_lone_surrogate_is_a_client_error(small_gateway: Served, text: bytes) -> None:
    with small_gateway.client() as client:
        for path, body in bodies(text).items():
            error = assert_error_shape(client.post(path, content=body, headers=JSON), (400, 422))
            assert "JSON" in error["message"], error
        key = b'{"prompt": "a", "metadata": {"' + text + b'": 1}}'
        assert_error_shape(client.post("/v1/jobs", content=key, headers=JSON), (400, 422))


@pytest.mark.parametrize("raw", [b"\xff", b"\xc3", b"\xed\xb3\xbf", b"\xf0\x9f\x98"])
def test_invalid_utf8_is_a_client_error(small_gateway: Served, raw: bytes) -> None:
    with small_gateway.client() as client:
        for path, body in bodies(raw).items():
            error = assert_error_shape(client.post(path, content=body, headers=JSON), (400, 422))
            assert "JSON" in error["message"], error


def test_valid_escapes_still_pass(small_gateway: Served) -> None:
    with small_gateway.client() as client:
        body = b'{"prompt": "\\ud83d\\ude00 caf\\u00e9 \xc3\xa9", "max_tokens": 1}'
        created = client.post("/v1/jobs", content=body, headers=JSON)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        assert client.post(f"/v1/jobs/{job_id}/cancel").json()["outcome"] == "cancelled"


def test_framework_errors_have_the_shape(small_gateway: Served) -> None:
    with small_gateway.client() as client:
        assert_error_shape(client.get("/v1/no-such-route"), 404)
        assert_error_shape(client.delete("/v1/jobs"), 405)


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("max_tokens", b"true"),
        ("max_tokens", b'"2"'),
        ("temperature", b"Infinity"),
        ("temperature", b"NaN"),
        ("top_p", b"1e999"),
    ],
)
def test_loose_numbers_are_refused_naming_the_field(
    small_gateway: Served, path: str, field: str, raw: bytes
) -> None:
    """As on the wire: true is no 1, "2" no 2, and JSON has no NaN or Infinity."""
    prompt = (
        b'"messages": [{"role": "user", "content": "Hi"}]' if "chat" in path else b'"prompt": "Hi"'
    )
    body = b"{" + prompt + b', "' + field.encode() + b'": ' + raw + b"}"
    with small_gateway.client() as client:
        error = assert_error_shape(client.post(path, content=body, headers=JSON), (400, 422))
    assert field in error["message"] or error["param"] == field or "JSON" in error["message"]


def test_an_oversized_body_is_drained_before_the_413_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rest of a refused body is read before the answer (a socket closed on unread bytes is
    reset, which can overtake the 413), but no more than `DRAIN_MAX_BYTES` of it."""
    import asyncio

    from gateway import bodies

    def run(chunks: int, declared: int, drain_max: int = 1000) -> tuple[int, list[int]]:
        monkeypatch.setattr(bodies, "DRAIN_MAX_BYTES", drain_max)
        left = [
            {"type": "http.request", "body": b"x" * 100, "more_body": i < chunks - 1}
            for i in range(chunks)
        ]
        read, sent = [0], []

        async def receive() -> dict[str, object]:
            read[0] += 1
            return left.pop(0) if left else {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                sent.append(int(message["status"]))  # type: ignore[call-overload]

        async def app(scope: object, receive: object, send: object) -> None:
            raise AssertionError("a refused body must not reach the app")

        headers = [(b"content-length", str(declared).encode())] if declared else []
        scope = {"type": "http", "headers": headers, "method": "POST", "path": "/"}
        asyncio.run(bodies.BodyLimit(app, 150)(scope, receive, send))  # type: ignore[arg-type]
        return read[0], sent

    assert run(5, 500) == (5, [413])  # declared too large: all 500 bytes read, then the 413
    assert run(5, 0) == (5, [413])  # chunked: counted past 150, the rest read too
    assert run(9, 900, 250) == (3, [413])  # past DRAIN_MAX_BYTES: the rest is left unread
