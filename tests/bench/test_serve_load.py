"""``ops/bench/peers/serve_client.py`` and ``serve_load.py`` against a fake streaming server.

The fake speaks both dialects the client uses (vLLM's ``/v1/completions`` with ``token_ids`` per
chunk and ``[DONE]``; llama-server's native ``/completion`` with ``tokens`` and a ``stop`` event),
sleeps ``delay_s`` before each chunk and notes how many tokens it had sent when a client went
away, so the tests see cancels from the server's side. No real peer runs here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / "ops" / "bench" / "peers"
FAIL_TOKEN = 999  # a prompt starting with it gets HTTP 400


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"paternoster_{name}", PEERS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, chunk_tokens: int = 1, delay_s: float = 0.005) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.chunk_tokens, self.delay_s = chunk_tokens, delay_s
        self.bodies: list[dict[str, Any]] = []
        self.aborted: dict[int, int] = {}  # first prompt token -> tokens sent when it went away

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, *_: Any) -> None:  # quiet
        pass

    def write(self, event: dict[str, Any] | str) -> None:
        data = event if isinstance(event, str) else json.dumps(event)
        self.wfile.write(f"data: {data}\n\n".encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if body["prompt"][0] == FAIL_TOKEN:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "bad prompt"}')
            return
        vllm = self.path == "/v1/completions"
        n = body["max_tokens"] if vllm else body["n_predict"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        sent = 0
        try:
            while sent < n:
                time.sleep(self.server.delay_s)
                ids = list(range(sent, min(n, sent + self.server.chunk_tokens)))
                sent += len(ids)
                reason = "length" if sent == n else None
                choice = {"index": 0, "text": "x", "token_ids": ids, "finish_reason": reason}
                self.write({"choices": [choice]} if vllm else {"tokens": ids, "stop": False})
            self.write("[DONE]" if vllm else {"content": "", "tokens": [], "stop": True})
        except (BrokenPipeError, ConnectionResetError):
            self.server.aborted[body["prompt"][0]] = sent


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    return load("serve_client")


def job(
    i: int, arrival_s: float, n: int, cancel: int | None = None, first: int = 0
) -> dict[str, Any]:
    prompt = [first or 100 + i, 5, 6]
    return {
        "job_id": f"j{i}",
        "klass": "chat" if cancel is None else "long-gen",
        "priority": 0,
        "tenant": "acme",
        "prompt_token_ids": prompt,
        "max_tokens": n,
        "cancel_after_tokens": cancel,
        "arrival_s": arrival_s,
    }


@pytest.mark.parametrize("dialect", ["vllm", "llama.cpp"])
@pytest.mark.parametrize("chunk_tokens", [1, 3])
def test_one_time_per_token(
    sc: ModuleType, fake: FakeServer, dialect: str, chunk_tokens: int
) -> None:
    fake.chunk_tokens = chunk_tokens
    records = sc.ServeClient(fake.url, dialect, [job(0, 0.0, 7), job(1, 0.01, 4)]).run(10.0)
    assert [r.outcome for r in records] == ["done", "done"]
    for rec, n in zip(records, (7, 4), strict=True):
        assert len(rec.token_times_s) == n  # a 3-token chunk counts 3 tokens, not 1
        assert rec.token_times_s == sorted(rec.token_times_s)
        assert rec.submit_s is not None and rec.token_times_s[0] > rec.submit_s
        assert rec.end_s is not None and rec.end_s >= rec.token_times_s[-1]
        assert rec.queued_s is None and rec.error is None
    body = fake.bodies[0]
    assert body["stream"] is True and body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["prompt"] in ([100, 5, 6], [101, 5, 6])  # token ids, not text
    if dialect == "vllm":
        assert body["min_tokens"] == body["max_tokens"] and body["return_token_ids"] is True
    else:
        assert body["n_predict"] in (7, 4) and body["return_tokens"] is True


@pytest.mark.parametrize("dialect", ["vllm", "llama.cpp"])
def test_cancel_closes_the_stream(sc: ModuleType, fake: FakeServer, dialect: str) -> None:
    fake.delay_s = 0.02
    (rec,) = sc.ServeClient(fake.url, dialect, [job(0, 0.0, 200, cancel=3)]).run(10.0)
    assert rec.outcome == "cancelled" and rec.cancel_reply == "closed"
    assert len(rec.token_times_s) == 3 < rec.max_tokens
    assert rec.cancel_sent_s is not None and rec.cancel_sent_s >= rec.token_times_s[-1]
    deadline = time.monotonic() + 3.0
    while 100 not in fake.aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert 3 <= fake.aborted[100] < 20  # the server saw the client go within a few tokens


def test_open_loop_a_slow_job_does_not_delay_a_later_arrival(
    sc: ModuleType, fake: FakeServer
) -> None:
    fake.delay_s = 0.03  # the first job streams for ~1.2 s
    jobs = [job(0, 0.0, 40), job(1, 0.2, 2), job(2, 0.4, 2)]
    slow, a, b = sc.ServeClient(fake.url, "vllm", jobs).run(10.0)
    for rec in (a, b):
        assert rec.submit_s - rec.arrival_s < 0.1  # sent on time, not after the slow one
        assert rec.end_s < slow.end_s
    assert [r.outcome for r in (slow, a, b)] == ["done"] * 3


def test_http_error_and_timeout(sc: ModuleType, fake: FakeServer) -> None:
    fake.delay_s = 0.05
    jobs = [job(0, 0.0, 2, first=FAIL_TOKEN), job(1, 0.0, 100), job(2, 5.0, 2)]
    bad, slow, never = sc.ServeClient(fake.url, "vllm", jobs).run(1.0)
    assert bad.outcome == "error" and "HTTP 400" in bad.error
    assert slow.outcome == "timeout" and 0 < len(slow.token_times_s) < 100
    assert never.outcome == "timeout" and never.submit_s is None
    assert slow.end_s is None  # a timeout has no end, as load_client's


def test_records_feed_load_report(fake: FakeServer) -> None:
    sl = load("serve_load")  # imports load_report and workload as load.py does
    fake.chunk_tokens = 2
    jobs = [job(0, 0.0, 6), job(1, 0.05, 30, cancel=4), job(2, 0.1, 5)]
    args = type("Args", (), {"server": "vllm", "timeout_s": 10.0})()
    run = sl.run_rate(args, fake.url, 2.0, jobs)
    o = run["overall"]
    assert o["outcomes"]["done"] == 2 and o["outcomes"]["cancelled"] == 1
    assert o["output_tokens"] == 6 + 4 + 5  # the cancelled job stopped at its 4 tokens
    assert o["ttft_s"]["n"] == 3 and o["tpot_s"]["n"] == 2 and o["e2e_s"]["n"] == 2
    assert run["cancellations"] == {**run["cancellations"], "planned": 1, "sent": 1, "honoured": 1}
    assert run["wrong_lengths"] == [] and run["workload"]["num_jobs"] == 3
    assert set(run["classes"]) == {"chat", "long-gen"}
    assert "kv" not in run and "preemptions" not in run  # no worker-side numbers for a peer
    assert [r["job_id"] for r in run["jobs"]] == ["j0", "j1", "j2"]
    from load_client import JobRecord  # importable once serve_load put ops/bench on the path

    assert set(run["jobs"][0]) == set(JobRecord.__dataclass_fields__)


def test_same_jobs_as_load_py() -> None:
    sl = load("serve_load")
    import workload as wl

    args = sl.parse_args(
        ["--server", "vllm", "--rates", "0.4", "--num-jobs", "9", "--scale", "0.1"]
    )
    vocab = list(range(200, 5000))
    expected = wl.generate(
        wl.load_mix(wl.DEFAULT_MIX), rate_per_s=0.4, num_jobs=9, seed=0, scale=0.1, token_ids=vocab
    )
    jobs = sl.make_jobs(args, 0.4, vocab)
    assert jobs == [asdict(j) for j in expected]


def test_missing_venv_names_the_setup_script(monkeypatch: pytest.MonkeyPatch) -> None:
    sl = load("serve_load")
    monkeypatch.setattr(sl, "VLLM", Path("/nonexistent/vllm"))
    monkeypatch.setattr(sl, "LLAMA_BIN", Path("/nonexistent/bin"))
    for server, script in (("vllm", "setup_vllm.sh"), ("llama.cpp", "setup_llamacpp.sh")):
        args = sl.parse_args(["--server", server, "--threads", "1"])
        with pytest.raises(SystemExit, match=script):
            sl.server_command(args, 8000, 4)


def test_vllm_server_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No prefix cache (every rate replays the same prompts); eager unless --vllm-compile;
    vLLM's own dtype unless told (``auto``, from the float32 export)."""
    sl = load("serve_load")
    fake_python = tmp_path / "python"
    fake_python.touch()
    monkeypatch.setattr(sl, "VLLM", fake_python)
    import export_hf  # on sys.path once serve_load is loaded

    monkeypatch.setattr(export_hf, "export", lambda dtype: tmp_path / dtype)
    for flags, eager in (([], True), (["--vllm-compile"], False)):
        args = sl.parse_args(["--server", "vllm", "--threads", "2", *flags])
        cmd, env = sl.server_command(args, 8000, 4)
        assert "--no-enable-prefix-caching" in cmd
        assert ("--enforce-eager" in cmd) is eager
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
        assert cmd[cmd.index("--dtype") + 1] == "auto"
        assert cmd[cmd.index("--model") + 1] == str(tmp_path / "float32")
    args = sl.parse_args(["--server", "vllm", "--threads", "2", "--vllm-dtype", "float32"])
    cmd, _ = sl.server_command(args, 8000, 4)
    assert cmd[cmd.index("--dtype") + 1] == "float32"


def fake_run(rate: float, tok_s: float, chat_p99_s: float, total_tokens: int) -> dict[str, Any]:
    ttft = {"p50": chat_p99_s / 2, "p90": chat_p99_s, "p99": chat_p99_s, "n": 3}
    return {
        "rate_per_s": rate,
        "workload": {"num_jobs": 3, "output_tokens": total_tokens},
        "overall": {
            "completed_jobs_per_s": 0.5,
            "output_tok_s": tok_s,
            "ttft_s": ttft,
            "tpot_s": ttft,
            "outcomes": {"done": 3},
        },
        "classes": {"chat": {"ttft_s": ttft, "tpot_s": {**ttft, "p99": chat_p99_s / 10}}},
    }


def test_compare_serving_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compare = load("compare_serving")
    ours = tmp_path / "ours.json"
    peer = tmp_path / "peer.json"
    ours.write_text(json.dumps({"runs": [fake_run(0.4, 60.0, 1.0, 90)]}))
    peer.write_text(json.dumps({"runs": [fake_run(0.4, 40.0, 4.0, 90)]}))
    table = compare.main([f"ours={ours}", f"vllm={peer}", "--out", str(tmp_path / "t.json")])
    ours_row, vllm_row = table["0.4"]
    assert ours_row["ours_tok_s_ratio"] == 1.0
    assert vllm_row["ours_tok_s_ratio"] == 1.5 and vllm_row["ours_chat_p99_ratio"] == 0.25
    assert vllm_row["chat_tpot_p99_s"] == 0.4 and vllm_row["ours_chat_tpot_p99_ratio"] == 0.25
    assert "| 0.4 | vllm | 0.500 | 40.0 | 1.50 |" in capsys.readouterr().out
    jobs = [{"klass": "chat", "submit_s": 1.0, "token_times_s": [1.0 + x, 9.0]} for x in (0.2, 2)]
    for path, run in ((ours, fake_run(0.4, 60.0, 1.0, 90)), (peer, fake_run(0.4, 40.0, 4.0, 90))):
        path.write_text(json.dumps({"runs": [{**run, "jobs": jobs}]}))
    compare.main([f"ours={ours}", f"vllm={peer}", "--plot-dir", str(tmp_path / "plots")])
    assert (tmp_path / "plots" / "chat_ttft_cdf_rate0p4.png").stat().st_size > 10_000
    assert (tmp_path / "plots" / "chat_tpot_cdf_rate0p4.png").stat().st_size > 10_000
    assert compare.chat_tpot_s(jobs[0]) == pytest.approx(7.8)  # one gap after the first token
    peer.write_text(json.dumps({"runs": [fake_run(0.4, 40.0, 4.0, 91)]}))  # other work
    with pytest.raises(SystemExit, match="another workload"):
        compare.main([f"ours={ours}", f"vllm={peer}"])
