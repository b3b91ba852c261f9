"""The Dockerfile installs extras that exist, builds the targets compose names, and runs
commands the CLI accepts."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

from worker.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = re.compile(r'"paternoster-llm\[([\w,-]+)\]"')


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def install_lines() -> list[str]:
    joined = dockerfile().replace("\\\n", " ")  # continuation lines into one instruction
    return [line for line in joined.splitlines() if "pip install" in line]


def test_every_installed_extra_exists_in_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    named = [e for line in install_lines() for m in EXTRAS.findall(line) for e in m.split(",")]
    assert sorted(set(named)) == ["gateway", "producer", "worker"]
    for extra in named:
        assert extra in extras, f"the Dockerfile installs [{extra}], pyproject has no such extra"


def test_images_install_the_wheel_built_in_the_first_stage() -> None:
    lines = [line for line in install_lines() if "paternoster-llm[" in line]
    assert len(lines) == 4
    assert all("--find-links /wheels" in line for line in lines)


def test_compose_targets_are_dockerfile_stages() -> None:
    stages = set(re.findall(r"^FROM \S+ AS ([\w-]+)$", dockerfile(), re.MULTILINE))
    assert {"wheel", "producer", "gateway", "worker", "worker-cpu"} <= stages
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for service in services.values():
        if "build" in service:
            assert service["build"]["target"] in stages


def test_every_cmd_parses_with_the_cli() -> None:
    cmds = [json.loads(m) for m in re.findall(r"^CMD (\[.*\])$", dockerfile(), re.MULTILINE)]
    assert len(cmds) == 4
    for cmd in cmds:
        assert cmd[0] == "paternoster"
        if cmd[1:] != ["--help"]:
            build_parser().parse_args(cmd[1:])


def test_the_wheel_stage_copies_every_package_and_the_manifest() -> None:
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile(), re.MULTILINE))
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {p.rstrip("*") for p in packages["packages"]["find"]["include"]}
    assert wanted <= copied, wanted - copied
    assert "MANIFEST.in" in copied  # the status page's HTML rides in the wheel through it
