"""Workers that die, stop or lose Redis: no job lost, no token duplicated (real processes)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ops.bench.redis_server import RedisServer
from producer import JobHandle, JobState, Producer
from producer.protocol import ErrorEvent
from tests.service.conftest import tiny_engine
from tests.service.streams import check_stream
from tests.service.test_priority import wait_until
from tests.service.test_processes import start_worker, wait_for_consumers
from worker.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0.0, "ignore_eos": True}
# Each engine step of the workers takes 20 ms more: a tiny model then decodes slowly enough
# for a test to act mid-job, on any machine.
CHAOS = {"PATERNOSTER_CHAOS": "1", "PATERNOSTER_CHAOS_STEP_DELAY_S": "0.02"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path)
    srv.start()
    yield srv
    srv.stop()


class Workers:
    def __init__(self, model_dir: Path, url: str, prefix: str) -> None:
        self.model_dir, self.url, self.prefix = model_dir, url, prefix
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, *extra: str) -> subprocess.Popen[str]:
        proc = start_worker(self.model_dir, self.url, self.prefix, name, extra, CHAOS)
        self.procs[name] = proc
        wait_for_consumers(self.url, self.prefix, {name}, [proc])
        return proc

    def stop_all(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            if proc.stdout is not None:  # shown by pytest when a test fails
                print(f"--- {name} ---\n{proc.stdout.read()[-6000:]}")


@pytest.fixture
def workers(tiny_model_dir: Path, server: RedisServer, prefix: str) -> Iterator[Workers]:
    pool = Workers(tiny_model_dir, server.url, prefix)
    yield pool
    pool.stop_all()


def expected_tokens(model_dir: Path, prompts: list[str], max_tokens: int) -> list[list[int]]:
    engine = tiny_engine(model_dir)
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, **GREEDY))
    return [list(o.token_ids) for o in outs]


def field(p: Producer, handle: JobHandle, name: str) -> str | None:
    value = p.redis.hget(p.keys.job(handle.job_id), name)
    return None if value is None else str(value)


def test_kill_9_mid_decode_every_job_completes_once_with_contiguous_streams(
    tiny_model_dir: Path, workers: Workers, server: RedisServer, prefix: str
) -> None:
    prompts = [f"reliable job {i}" for i in range(8)]
    expected = expected_tokens(tiny_model_dir, prompts, 40)
    victim = workers.start("w-victim")
    workers.start("w-survivor")
    with Producer(server.url, prefix=prefix) as p:
        handles = [p.submit(t, max_tokens=40, **GREEDY) for t in prompts]
        # Mid-decode: the victim has streamed some tokens of a job it holds, not all.
        wait_until(
            lambda: any(
                field(p, h, "worker") == "w-victim"
                and 5 <= int(field(p, h, "completion_tokens") or 0) < 40
                for h in handles
            )
        )
        victim.send_signal(signal.SIGKILL)
        results = [h.result(timeout_s=90) for h in handles]
        resumed = 0
        for handle, result, tokens in zip(handles, results, expected, strict=True):
            assert check_stream(list(p.stream(handle.job_id))) == tokens
            assert result.token_ids == tokens
            resumed += field(p, handle, "deliveries") == "2"
        assert resumed >= 1, "the survivor resumed the victim's jobs"
        assert p.redis.xlen(p.keys.dead_letter) == 0


def test_a_long_job_is_not_taken_from_a_live_worker(
    workers: Workers, server: RedisServer, prefix: str
) -> None:
    workers.start("w-owner")
    with Producer(server.url, prefix=prefix) as p:
        # ~300 steps of 20 ms: longer than the lease grace and several reclaim passes.
        handle = p.submit("a long one", max_tokens=300, **GREEDY)
        wait_until(lambda: field(p, handle, "worker") == "w-owner")
        workers.start("w-other")
        result = handle.result(timeout_s=90)
        assert len(result.token_ids) == 300
        assert field(p, handle, "worker") == "w-owner"
        assert field(p, handle, "deliveries") == "1" and field(p, handle, "resumed_at") is None


def test_redis_restart_mid_run_every_acknowledged_job_completes(
    tiny_model_dir: Path, workers: Workers, server: RedisServer, prefix: str
) -> None:
    prompts = [f"restart job {i}" for i in range(6)]
    expected = expected_tokens(tiny_model_dir, prompts, 60)
    workers.start("w-steady")
    with Producer(server.url, prefix=prefix) as p:
        handles = [p.submit(t, max_tokens=60, **GREEDY) for t in prompts]
        wait_until(lambda: int(field(p, handles[0], "completion_tokens") or 0) >= 5)
        time.sleep(1.5)  # appendfsync everysec: what was acknowledged is on disk
        server.restart(down_s=2.0)
        for handle, tokens in zip(handles, expected, strict=True):
            result = retry_on_connection_error(lambda h=handle: h.result(timeout_s=90))
            assert result.token_ids == tokens
            assert check_stream(list(p.stream(handle.job_id))) == tokens
    assert workers.procs["w-steady"].poll() is None, "the worker survived the restart"


def retry_on_connection_error(call: Callable[[], Any]) -> Any:
    for _ in range(20):
        try:
            return call()
        except redis.ConnectionError:
            time.sleep(0.5)
    return call()


def test_sigterm_finishes_what_it_can_and_hands_back_the_rest(
    tiny_model_dir: Path, workers: Workers, server: RedisServer, prefix: str
) -> None:
    prompts = [f"handed back {i}" for i in range(4)]
    expected = expected_tokens(tiny_model_dir, prompts, 400)
    # One sequence at a time on the leaving worker, so what it can finish in its 0.5 s grace
    # does not depend on the machine's speed: 4 x 400 tokens one after another cannot all fit.
    # (With all 4 decoding together, a faster decode step once let it finish every job.)
    leaving = workers.start(
        "w-leaving", "--grace-s", "0.5", "--max-jobs", "5", "--max-num-seqs", "1"
    )
    with Producer(server.url, prefix=prefix) as p:
        handles = [p.submit(t, max_tokens=400, **GREEDY) for t in prompts]
        wait_until(lambda: all(field(p, h, "worker") == "w-leaving" for h in handles))
        wait_until(lambda: int(field(p, handles[0], "completion_tokens") or 0) >= 5)
        workers.start("w-staying")
        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(timeout=60) == 0
        for handle, tokens in zip(handles, expected, strict=True):
            assert handle.result(timeout_s=90).token_ids == tokens
            assert check_stream(list(p.stream(handle.job_id))) == tokens
            assert field(p, handle, "deliveries") == "1"  # a handoff is no failed delivery
        finished_by = [field(p, h, "worker") for h in handles]
        assert set(finished_by) <= {"w-leaving", "w-staying"}
        # The last in line never started on the leaving worker: it was handed back.
        assert finished_by[-1] == "w-staying", finished_by


def test_a_job_that_kills_every_worker_ends_in_the_dead_letter_stream(
    workers: Workers, server: RedisServer, prefix: str
) -> None:
    with Producer(server.url, prefix=prefix) as p:
        poison = p.submit("boom", max_tokens=4, metadata={"chaos": "crash"}, **GREEDY)
        exits = []
        for _ in range(6):  # a supervisor restarting the worker under the same name
            # Not workers.start: it may die before it is seen in the consumer group.
            extra = ["--max-deliveries", "3"]
            proc = start_worker(workers.model_dir, server.url, prefix, "w-restarted", extra, CHAOS)
            workers.procs[f"w-restarted-{len(exits)}"] = proc
            wait_until(
                lambda w=proc: w.poll() is not None or p.status(poison.job_id).state.terminal
            )
            if proc.poll() is None:
                break  # it survived: the poison job has ended
            exits.append(proc.returncode)
        assert exits == [137, 137, 137]
        events = list(p.stream(poison.job_id, timeout_s=30))
        assert isinstance(events[-1], ErrorEvent) and events[-1].code == "dead_letter"
        assert p.status(poison.job_id).state is JobState.ERROR
        (entry,) = p.redis.xrange(p.keys.dead_letter)
        assert entry[1]["id"] == poison.job_id and entry[1]["deliveries"] == "4"
        good = p.submit("after the poison", max_tokens=3, **GREEDY)
        assert len(good.result(timeout_s=60).token_ids) == 3
