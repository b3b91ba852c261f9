"""The docs' copy-paste examples run as written, like the README's (tests/test_readme.py).

docs/gateway.md's Python blocks run against a live gateway and worker, with the documented
address swapped for the test server's; its curl blocks run too, each curl turned into the same
request with httpx (the machines that run the tests need not have curl). Every doc's Python
blocks at least compile: docs/celery.md's needs a Celery broker and names of the reader's
(``prompts``, ``summarise``), so it is not run.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.config import GatewayConfig
from tests.gateway.conftest import Served, serve, stop
from tests.service.conftest import running_worker, tiny_engine

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOCUMENTED_URL = "http://127.0.0.1:8000"  # `paternoster gateway`'s default address
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[[^\n]*\n")  # structlog's console lines


def blocks(doc: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", doc.read_text(), flags=re.S)


@dataclass
class Curl:
    """One curl command line, the subset the docs use: -s, -N, -X, -H, -d and a URL."""

    url: str
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    data: str | None = None

    @classmethod
    def parse(cls, line: str) -> Curl:
        words = shlex.split(line, comments=True)
        assert words[0] == "curl", f"not a curl command: {line!r}"
        curl, args = cls(url=""), iter(words[1:])
        for word in args:
            if word == "-X":
                curl.method = next(args)
            elif word == "-H":
                name, _, value = next(args).partition(":")
                curl.headers[name.strip()] = value.strip()
            elif word == "-d":
                curl.data, curl.method = next(args), "POST" if curl.method == "GET" else curl.method
            elif word.startswith("http"):
                curl.url = word
            else:  # -s (quiet) and -N (no buffering) change nothing for httpx
                assert word in ("-s", "-N", "-sN"), f"unsupported curl option {word!r}"
        assert curl.url, f"no URL in {line!r}"
        return curl

    def run(self, base_url: str) -> httpx.Response:
        url = self.url.replace(DOCUMENTED_URL, base_url)
        return httpx.request(self.method, url, headers=self.headers, content=self.data, timeout=30)


def commands(block: str) -> list[str]:
    """The block's command lines: continuations joined, comment-only lines dropped."""
    joined = block.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def curl_blocks() -> list[str]:
    return [b for b in blocks(DOCS / "gateway.md", "sh") if "curl " in b]


@pytest.fixture(scope="module")
def live_gateway(tiny_model_dir: Path, redis_url: str) -> Iterator[Served]:
    """A gateway and worker of this module's own (the docs' fixed job ids stay in its prefix)."""
    import redis

    prefix = f"pn-docs-{uuid.uuid4().hex[:10]}"
    with running_worker(tiny_engine(tiny_model_dir), redis_url, prefix):
        served = serve(GatewayConfig(redis_url=redis_url, prefix=prefix))
        yield served
        stop(served)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_docs_have_examples() -> None:
    assert curl_blocks() and blocks(DOCS / "gateway.md", "python")


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_python_blocks_compile(doc: Path) -> None:
    for block in blocks(doc, "python"):
        compile(block, str(doc), "exec")


def test_gateway_curl_examples(live_gateway: Served) -> None:
    outputs = []
    for block in curl_blocks():
        for line in commands(block):
            response = Curl.parse(line).run(live_gateway.url)
            assert response.is_success, (line, response.status_code, response.text)
            outputs.append(response.text)
    submitted, events, result, status = outputs
    assert '"created":true' in submitted.replace(" ", "")
    assert "event: started" in events and events.rstrip().split("\n")[-2] == "event: done"
    assert '"state":"done"' in result.replace(" ", "")
    assert '"queues"' in status and '"workers"' in status


def test_gateway_python_examples(live_gateway: Served, capsys: pytest.CaptureFixture[str]) -> None:
    for block in blocks(DOCS / "gateway.md", "python"):
        code = block.replace(DOCUMENTED_URL, live_gateway.url)
        # As a reader's script runs: without this module's `from __future__ import annotations`
        # (which compile() would inherit, leaving pydantic models of the docs unresolvable).
        exec(compile(code, "docs/gateway.md", "exec", dont_inherit=True), {"__name__": "docs"})
    # The worker thread logs to the same stdout, maybe in the middle of the streamed line.
    out = LOG_RECORD.sub("", capsys.readouterr().out).splitlines()
    # The parsed structured output, the streamed completion, then the status line.
    assert len(out) == 3 and out[0].startswith("sky=") and out[1].strip()
    assert out[2].startswith("{'interactive': 0, 'default': 0, 'batch': 0}")
