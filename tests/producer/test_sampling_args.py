"""The CLI's sampling flags take SamplingSpec's defaults, except where they say they differ;
``cache_salt`` can be set through every way in: ``build_spec``, ``Producer.submit``, the CLI."""

from __future__ import annotations

import argparse
import json

import pytest
import redis

from producer import InvalidJob, Keys, Producer, SamplingSpec
from producer.requests import build_spec
from producer.sampling_args import CLI_SAMPLING_DEFAULTS, add_sampling_arguments, sampling_fields
from worker.cli import main


def test_flags_default_to_sampling_spec_except_the_cli_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_sampling_arguments(parser)
    fields = sampling_fields(parser.parse_args([]))
    spec = SamplingSpec()
    for name, value in fields.items():
        assert value == CLI_SAMPLING_DEFAULTS.get(name, getattr(spec, name)), name
    # The deliberate differences, and nothing else: 64 greedy tokens on the command line.
    assert CLI_SAMPLING_DEFAULTS == {"max_tokens": 64, "temperature": 0.0}
    assert (spec.max_tokens, spec.temperature) == (16, 1.0)


@pytest.mark.parametrize("command", ["submit", "generate"])
def test_help_says_where_the_cli_defaults_differ(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    assert "default 64 here; SamplingSpec's, which Producer.submit and the gateway's" in text
    assert "/v1/jobs use: 16)" in text
    assert "default 0.0 here; SamplingSpec's" in text and "use: 1.0)" in text


def test_build_spec_takes_a_cache_salt() -> None:
    assert build_spec("hi", cache_salt="s1").cache_salt == "s1"
    assert build_spec("hi").cache_salt is None
    with pytest.raises(InvalidJob, match="cache_salt"):
        build_spec("hi", cache_salt="")
    with pytest.raises(InvalidJob, match="cache_salt"):
        build_spec("hi", cache_salt="x" * 129)


def payload(client: redis.Redis, keys: Keys, job_id: str) -> dict[str, object]:
    for stream in keys.job_streams:
        for _, fields in client.xrange(stream):
            if fields["id"] == job_id:
                spec: dict[str, object] = json.loads(fields["payload"])
                return spec
    raise AssertionError(f"no entry for {job_id}")


def test_producer_submit_carries_the_cache_salt(
    producer: Producer, client: redis.Redis, keys: Keys
) -> None:
    producer.submit("hi", job_id="salted", cache_salt="team-1", max_tokens=2)
    assert payload(client, keys, "salted")["cache_salt"] == "team-1"
    producer.submit("hi", job_id="plain", max_tokens=2)
    assert "cache_salt" not in payload(client, keys, "plain")


def test_submit_cache_salt_flag(
    redis_url: str,
    key_prefix: str,
    client: redis.Redis,
    keys: Keys,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--redis-url", redis_url, "--prefix", key_prefix, "--id", "cli-salt"]
    assert main(["submit", *args, "--cache-salt", "team-2", "hi"]) == 0
    assert capsys.readouterr().out.strip() == "cli-salt"
    assert payload(client, keys, "cli-salt")["cache_salt"] == "team-2"
