"""`ops/bench/peers/llamacpp.py`'s streamed completion against a canned llama-server stream.

llama-server streams no chunk for a token whose text ends in an incomplete UTF-8 character, so
that token's id never arrives; the final chunk's ``tokens_predicted`` is the server's own count.
The length check reads that count, and the request's ids are marked incomplete for parity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from ops.bench.peers import llamacpp


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)


def stream_body(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    first = body["prompt"][0]
    n = body["n_predict"]
    if first == 1:  # the second of three tokens half a character: the server sends no chunk
        chunks = [{"content": "a", "tokens": [7]}, {"content": "\u00e9", "tokens": [9]}]
    else:
        chunks = [{"content": "x", "tokens": [i]} for i in range(n)]
    final = {"content": "", "tokens": [], "stop": True, "tokens_predicted": n, "timings": {}}
    return httpx.Response(200, content=sse(*chunks, final))


async def complete_all(prompts: list[list[int]], n: int) -> list[dict[str, Any]]:
    transport = httpx.MockTransport(stream_body)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        return [await llamacpp.complete(client, p, n) for p in prompts]


def test_length_is_the_servers_count_and_short_streams_are_marked() -> None:
    results = asyncio.run(complete_all([[1, 2], [5, 6]], 3))
    assert [r["tokens"] for r in results] == [[7, 9], [0, 1, 2]]
    assert [r["num_generated"] for r in results] == [3, 3]
    requests = [
        {"request_id": "r0", "prompt_token_ids": [1, 2], "max_tokens": 3},
        {"request_id": "r1", "prompt_token_ids": [5, 6], "max_tokens": 3},
    ]
    report = llamacpp.summarize(argparse.Namespace(label="llama.cpp"), requests, 2.0, results)
    assert report["lengths_ok"] and report["wrong_lengths"] == []
    assert report["output_tokens"] == 6 and report["output_tok_s"] == 3.0
    assert report["incomplete_outputs"] == ["r0"]


def test_a_short_count_still_fails_the_length_check() -> None:
    results = asyncio.run(complete_all([[5, 6]], 3))
    results[0]["num_generated"] = 2  # the server stopped early (say, out of context)
    requests = [{"request_id": "r1", "prompt_token_ids": [5, 6], "max_tokens": 3}]
    report = llamacpp.summarize(argparse.Namespace(label="llama.cpp"), requests, 1.0, results)
    assert not report["lengths_ok"]
    assert report["wrong_lengths"] == [("r1", 2, 3)]


def test_a_dropped_connection_names_the_server_status_and_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exc = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    message = llamacpp.server_failure(proc, log, exc, lines=2)
    assert "Server disconnected" in message
    assert "exit status 3" in message
    assert message.endswith("line 28\nline 29") and "line 27" not in message


def test_rounds_report_each_and_any_wrong_length() -> None:
    """Two timed rounds: the first's outputs and TTFTs lead, ``rounds`` holds both; a short
    output in the second round alone still fails the length check."""
    requests = [{"request_id": "r1", "prompt_token_ids": [5, 6], "max_tokens": 3}]
    first = asyncio.run(complete_all([[5, 6]], 3))
    second = asyncio.run(complete_all([[5, 6]], 3))
    args = argparse.Namespace(label="llama.cpp")
    report = llamacpp.with_rounds(args, requests, [(2.0, first), (1.0, second)])
    assert report["wall_s"] == 2.0 and report["outputs"] == {"r1": [0, 1, 2]}
    assert [r["output_tok_s"] for r in report["rounds"]] == [1.5, 3.0]
    assert report["lengths_ok"]
    second[0]["num_generated"] = 2
    report = llamacpp.with_rounds(args, requests, [(2.0, first), (1.0, second)])
    assert not report["lengths_ok"] and report["wrong_lengths"] == [("r1", 2, 3)]
