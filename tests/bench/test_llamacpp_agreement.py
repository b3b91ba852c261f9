"""`ops/bench/peers/llamacpp_agreement.py` without llama.cpp: the comparison, the request and
response shapes, and the client against a fake ``llama-server`` (a small http.server script)."""

from __future__ import annotations

import argparse
import math
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from ops.bench.peers import llamacpp_agreement as agree


def test_first_divergence() -> None:
    assert agree.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert agree.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert agree.first_divergence([4], [5]) == 0
    assert agree.first_divergence([1, 2], [1, 2, 3]) == 2  # one side stopped early


def test_compare_counts_common_prefixes_and_keeps_tops_at_the_divergence() -> None:
    ours = [[1, 2, 3, 4], [7, 8, 9, 9]]
    theirs = [[1, 2, 3, 4], [7, 6, 9, 9]]
    ours_top = [[[(1, -0.1)]] * 4, [[(7, -0.2)], [(8, -0.7), (6, -0.8)], [], []]]
    theirs_top = [[[(1, -0.1)]] * 4, [[(7, -0.2)], [(6, -0.69), (8, -0.71)], [], []]]
    report = agree.compare(ours, theirs, ours_top, theirs_top)
    assert report["identical_prompts"] == 1 and report["num_prompts"] == 2
    # The second prompt's later equal tokens (9, 9) follow different text: not counted.
    assert (report["matching_tokens"], report["total_tokens"]) == (5, 8)
    assert report["agreement"] == pytest.approx(5 / 8)
    first, second = report["prompts"]
    assert first == {"prompt": 0, "first_divergence": None, "common_prefix": 4}
    assert second["first_divergence"] == 1 and second["common_prefix"] == 1
    assert second["ours_top"] == [(8, -0.7), (6, -0.8)]
    assert second["llamacpp_top"] == [(6, -0.69), (8, -0.71)]


def test_llama_body_is_greedy_on_token_ids() -> None:
    body = agree.llama_body([5, 6], 64, 2)
    assert body["prompt"] == [5, 6] and body["n_predict"] == 64 and body["n_probs"] == 2
    assert body["temperature"] == 0.0 and body["top_k"] == 1
    assert body["return_tokens"] and not body["cache_prompt"]
    assert "ignore_eos" not in body  # llama.cpp masks EOS under it, ours emits it: EOS stops


def test_parse_llama_reads_both_probability_shapes() -> None:
    newer = {
        "tokens": [3, 4],
        "completion_probabilities": [
            {"id": 3, "top_logprobs": [{"id": 3, "logprob": -0.1}, {"id": 9, "logprob": -2.5}]},
            {"id": 4, "top_logprobs": [{"id": 4, "logprob": -0.3}]},
        ],
    }
    assert agree.parse_llama(newer) == ([3, 4], [[(3, -0.1), (9, -2.5)], [(4, -0.3)]])
    older = {"tokens": [3], "completion_probabilities": [{"probs": [{"id": 3, "prob": 0.5}]}]}
    ids, tops = agree.parse_llama(older)
    assert ids == [3] and tops[0][0][0] == 3 and tops[0][0][1] == pytest.approx(math.log(0.5))
    assert agree.parse_llama({}) == ([], [])


FAKE_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    port = int(sys.argv[sys.argv.index("--port") + 1])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, payload):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply({"status": "ok"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            # "Greedy": the prompt's last id plus 1, 2, ...; each with itself as top.
            ids = [body["prompt"][-1] + i + 1 for i in range(body["n_predict"])]
            probs = [{"top_logprobs": [{"id": t, "logprob": -0.5}]} for t in ids]
            self.reply({"tokens": ids, "completion_probabilities": probs})

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_llamacpp_against_a_fake_server(tmp_path: Path) -> None:
    server = tmp_path / "llama-server"
    server.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    server.chmod(0o755)
    args = argparse.Namespace(
        server=server,
        llamacpp_gguf=tmp_path / "m.gguf",
        port=free_port(),
        threads=1,
        tokens=3,
        top=2,
        startup_timeout_s=30.0,
        no_repack=True,
    )
    assert agree.server_command(args)[-1] == "--no-repack"
    ids, tops, log = agree.run_llamacpp(args, [[10, 11], [20]])
    assert ids == [[12, 13, 14], [21, 22, 23]]
    assert tops[1] == [[(21, -0.5)], [(22, -0.5)], [(23, -0.5)]]
    assert Path(log).exists()
    Path(log).unlink()
