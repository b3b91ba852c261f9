"""The Prometheus and Grafana files compose mounts, checked without Docker: each one exists and
parses, Prometheus scrapes the port the workers serve, and every dashboard query names only
metrics that docs/metrics.md documents (which tests/service/test_metrics.py ties to the code)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_compose import INTERPOLATION, interpolate, load_compose
from worker.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "ops/grafana/dashboards/paternoster.json"
DOC_ROW = re.compile(r"^\| `(paternoster_\w+)` \| \w+ \|([^|]*)\|")
# A metric in PromQL: a paternoster_ name anywhere, or any name right before a {selector}.
METRIC = re.compile(r"\b(paternoster_\w+|[a-zA-Z_:][\w:]*(?=\{))")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
NOT_OURS = {"up"}  # Prometheus' own per-target series
ALWAYS_LABELS = {"le", "instance", "job"}  # bucket bound, and what Prometheus adds per target


def documented() -> dict[str, set[str]]:
    """Metric name -> its label names, from the table in docs/metrics.md."""
    out = {}
    for line in (ROOT / "docs/metrics.md").read_text().splitlines():
        if m := DOC_ROW.match(line):
            out[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    return out


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of each bind mount the repository provides; a path an
    environment variable picks (the model directory) is the operator's, not ours."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith(".") and not INTERPOLATION.search(source):
            mounts.append((source, target))
    return mounts


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_every_bind_mount_exists_and_every_yaml_loads() -> None:
    services = load_compose()["services"]
    mounts = [m for s in services.values() for m in bind_mounts(s)]
    assert len(mounts) >= 3  # prometheus.yml, grafana provisioning and dashboards
    for source, _ in mounts:
        path = ROOT / interpolate(source)
        assert path.exists(), f"compose mounts {source}, which does not exist"
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in files:
            if f.suffix in (".yml", ".yaml"):
                assert isinstance(yaml.safe_load(f.read_text()), dict), f
            elif f.suffix == ".json":
                json.loads(f.read_text())


def test_prometheus_scrapes_the_port_each_worker_serves() -> None:
    services = load_compose()["services"]
    config = yaml.safe_load((ROOT / "ops/prometheus/prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "paternoster-worker"]
    assert job["scrape_interval"] == "5s"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert {t.split(":")[0] for t in targets} == {"worker", "worker-cpu"}
    for target in targets:
        name, port = target.split(":")
        command = services[name]["command"]
        assert command[command.index("--metrics-port") + 1] == port, target
        assert port in [str(p) for p in services[name]["expose"]], target
    prometheus = services["prometheus"]
    config_path = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    assert ("./ops/prometheus/prometheus.yml", config_path.split("=", 1)[1]) in bind_mounts(
        prometheus
    )
    for name in ("prometheus", "grafana"):  # pinned: a new major must be a deliberate change
        image, _, tag = services[name]["image"].partition(":")
        assert tag and tag != "latest" and re.match(r"v?\d+\.\d+\.\d+$", tag), image


def test_grafana_provisions_the_datasource_and_dashboard_folder() -> None:
    grafana = load_compose()["services"]["grafana"]
    targets = dict(bind_mounts(grafana))
    assert targets["./ops/grafana/provisioning"] == "/etc/grafana/provisioning"
    provisioning = ROOT / "ops/grafana/provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards/paternoster.yml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == targets["./ops/grafana/dashboards"]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    uids = {t["datasource"]["uid"] for p in panels for t in [p, *p["targets"]]}
    assert uids == {source["uid"]}


def test_dashboard_queries_name_only_documented_metrics_and_labels() -> None:
    docs = documented()
    exprs = dashboard_exprs()
    assert len(exprs) >= 12
    used = set()
    for expr in exprs:
        names = {re.sub(r"_(bucket|sum|count)$", "", n) for n in METRIC.findall(expr)}
        unknown = names - docs.keys() - NOT_OURS
        assert not unknown, f"{expr}: {sorted(unknown)} not in docs/metrics.md"
        assert names, f"{expr}: names no metric"
        labels = set().union(*(docs.get(n, set()) for n in names)) | ALWAYS_LABELS
        for group in GROUPING.findall(expr):
            grouped = {g.strip() for g in group.split(",") if g.strip()}
            assert grouped <= labels, f"{expr}: groups by {sorted(grouped - labels)}"
        used |= names
    for wanted in (
        "paternoster_queued_jobs",
        "paternoster_held_jobs",
        "paternoster_kv_cache_usage_ratio",
        "paternoster_generated_tokens_total",
        "paternoster_time_to_first_token_seconds",
        "paternoster_e2e_latency_seconds",
        "paternoster_preemptions_total",
        "paternoster_jobs_rejected_total",
        "paternoster_jobs_finished_total",
        "paternoster_waiting_jobs",
    ):
        assert wanted in used, f"no panel shows {wanted}"
    job = 'up{job="paternoster-worker"}'
    assert all(job in e for e in exprs if re.search(r"\bup\{", e))


def test_the_workers_pass_the_metrics_port_the_cli_takes() -> None:
    services = load_compose()["services"]
    args = {
        n: build_parser().parse_known_args(services[n]["command"][1:])[0]
        for n in ("worker", "worker-cpu")
    }
    assert {int(a.metrics_port) for a in args.values()} == {9400}
