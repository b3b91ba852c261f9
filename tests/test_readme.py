"""The README's Python examples run as written, so the copy-paste path cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.service.conftest import running_worker, tiny_engine

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def block_with(text: str) -> str:
    (block,) = [b for b in python_blocks() if text in b]
    return block


def test_the_producer_example_streams_a_job(
    tiny_model_dir: Path,
    redis_url: str,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The example uses the defaults: REDIS_URL and PATERNOSTER_PREFIX from the environment.
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("PATERNOSTER_PREFIX", key_prefix)
    with running_worker(tiny_engine(tiny_model_dir), redis_url, key_prefix):
        exec(compile(block_with("from producer import Producer"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "completion_tokens=16" in out  # the printed usage of a 16-token greedy job


@pytest.mark.slow
def test_the_engine_example_generates(
    smol_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exec(compile(block_with("LLMEngine()"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Paris" in out  # greedy SmolLM2 knows it
    # Each stream ends with a reason; which ends last depends on what r1 (sampled, unseeded)
    # answers: "Hello! How can I help?" stops before r2's 8 tokens are out.
    for request in ("r1", "r2"):
        assert re.search(rf"^{request} '[^']*' (stop|length)$", out, re.MULTILINE), request


def test_the_readme_states_the_command_lines_own_sampling_defaults() -> None:
    from producer.sampling_args import CLI_SAMPLING_DEFAULTS

    text = " ".join(README.read_text().split())
    assert f"`--max-tokens` {CLI_SAMPLING_DEFAULTS['max_tokens']}" in text
    assert f"`--temperature` {CLI_SAMPLING_DEFAULTS['temperature']:g} (greedy)" in text
    assert "`SamplingSpec` (so `Producer.submit`, `/v1/jobs`)" in text
