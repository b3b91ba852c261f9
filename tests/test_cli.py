from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from worker.cli import main


def test_generate_json_prints_one_object_per_prompt_in_input_order(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = ["a much longer first prompt than the others, so it finishes prefill last", "b", "c"]
    args = ["generate", "--model", str(tiny_model_dir), "--json", "--ignore-eos"]
    rc = main([*args, "--max-tokens", "4", "--block-size", "4", *prompts])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["prompt"] for r in records] == prompts
    for r in records:
        assert r["finish_reason"] == "length"
        assert len(r["token_ids"]) == r["num_output_tokens"] == 4
        assert isinstance(r["text"], str)


def test_bad_sampling_value_is_a_clear_error(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["generate", "--model", str(tiny_model_dir), "--top-p", "0", "x"])
    assert rc == 2
    assert "top_p" in capsys.readouterr().err


def test_missing_model_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", "--model", str(tmp_path / "nope.gguf"), "x"])
    assert rc == 2
    assert "nope.gguf" in capsys.readouterr().err


@pytest.mark.slow
def test_bundled_model_knows_the_capital_of_france(capsys: pytest.CaptureFixture[str]) -> None:
    question = "What is the capital of France?"
    rc = main(["generate", "--chat", "--json", "--max-tokens", "12", question])
    assert rc == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert "Paris" in record["text"]
    assert record["finish_reason"] == "stop"


def test_bench_imports_the_load_bench_as_a_module(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--admission-limit" in capsys.readouterr().out
    module = sys.modules["ops.bench.load"]  # a package module, not a file loaded by its path
    assert module.__spec__ is not None and module.__spec__.name == "ops.bench.load"
