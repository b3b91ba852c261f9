"""compose.yaml against the compose-spec schema and against the code it runs: every command
parses with the real CLI, every environment variable is one the code reads."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")  # ${NAME:-default} / ${NAME}


def load_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


def interpolate(value: str) -> str:
    """What compose makes of ``${NAME:-default}`` with NAME unset."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", value)


def test_compose_validates_against_the_compose_spec() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("check_jsonschema")  # ships the compose-spec schema vendored
    vendor = resources.files("check_jsonschema") / "builtin_schemas" / "vendor"
    schema = json.loads((vendor / "compose-spec.json").read_text())
    jsonschema.validate(load_compose(), schema)


def test_services_and_their_deployment_settings() -> None:
    services = load_compose()["services"]
    assert {"redis", "worker", "worker-cpu", "prometheus", "grafana"} <= services.keys()
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--appendfsync") + 1] == "everysec"
    assert "healthcheck" in services["redis"] and services["redis"]["volumes"]
    gpu = services["worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert any(v.endswith(":/models:ro") for v in gpu["volumes"])
    assert any(v.startswith("model-cache:") for v in gpu["volumes"])
    assert "profiles" not in gpu and services["worker-cpu"]["profiles"] == ["cpu"]
    assert "deploy" not in services["worker-cpu"]
    for name in ("worker", "worker-cpu"):
        assert grace_s(services[name]["stop_grace_period"]) >= 60  # time to drain on SIGTERM
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def grace_s(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_every_paternoster_command_parses_with_the_cli() -> None:
    services = load_compose()["services"]
    commands = [s["command"] for s in services.values() if s.get("command")]
    ours = [[interpolate(str(a)) for a in c] for c in commands if c[0] == "paternoster"]
    assert len(ours) == 3  # the GPU worker, the CPU worker, the gateway
    parsed = [build_parser().parse_args(command[1:]).command for command in ours]
    assert sorted(parsed) == ["gateway", "worker", "worker"]
    gpu = build_parser().parse_args(interpolate_all(services["worker"]["command"])[1:])
    assert (gpu.model, gpu.device) == ("/models", "cuda")
    cpu = build_parser().parse_args(interpolate_all(services["worker-cpu"]["command"])[1:])
    assert cpu.device == "cpu" and cpu.model is None  # the bundled model


def interpolate_all(command: list[str]) -> list[str]:
    return [interpolate(a) for a in command]


def test_every_environment_variable_is_read_by_the_code() -> None:
    sources = "".join(
        p.read_text() for d in ("producer", "worker", "gateway") for p in (ROOT / d).rglob("*.py")
    )
    services = load_compose()["services"]
    for name in ("worker", "worker-cpu", "gateway"):
        env = services[name]["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0"  # the redis service, by name
        for key in env:
            assert f'"{key}"' in sources, f"{name}: nothing reads {key}"


def test_the_worker_healthcheck_asks_the_workers_health_endpoint() -> None:
    test = load_compose()["services"]["worker"]["healthcheck"]["test"]
    script = test[-1]
    compile(script, "healthcheck", "exec")  # at least valid Python
    assert "/health" in script and ":9400/" in script
