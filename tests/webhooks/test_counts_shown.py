"""The webhook counts (``producer.webhook_stats``) where people look: ``paternoster status``
with no job id, ``paternoster top`` (frame and ``--json``) and the gateway's status page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from gateway.config import GatewayConfig
from producer.fleet import queue_depths
from producer.keys import BANDS, Keys
from producer.top import build_snapshot, render
from tests.gateway.conftest import Served, serve, stop
from tests.gateway.test_status_page import browser, rows, wait_for
from tests.webhooks.conftest import cancelled_jobs
from worker.cli import main

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

__all__ = ["browser"]  # the fixture, for the browser test
Capsys = pytest.CaptureFixture[str]
BEHIND = {"to_deliver": 3, "in_hand": 1, "dead": 1}
LINE = "webhooks: 3 to deliver (1 in hand), 1 dead"


@pytest.fixture
def behind(redis_url: str, key_prefix: str, client: Any) -> Keys:
    """Three deliveries queued (CANCEL enqueues them), one of them in a deliverer's hand, and
    one dead letter: ``BEHIND``."""
    keys = Keys(key_prefix)
    cancelled_jobs(redis_url, key_prefix, "http://127.0.0.1:9/hook", 3)
    client.xgroup_create(keys.webhooks, keys.webhook_group, id="0")
    client.xreadgroup(keys.webhook_group, "d1", {keys.webhooks: ">"}, count=1)
    client.xadd(keys.webhook_dead, {"id": "j", "reason": "test"})
    return keys


def _cli(capsys: Capsys, redis_url: str, prefix: str, *args: str) -> tuple[int, str]:
    rc = main([*args, "--redis-url", redis_url, "--prefix", prefix])
    return rc, capsys.readouterr().out


def test_status_without_an_id_counts_queues_and_webhooks(
    redis_url: str, key_prefix: str, behind: Keys, client: Any, capsys: Capsys
) -> None:
    client.xadd(behind.band("batch"), {"id": "q"})
    queues = queue_depths(client, behind)  # the cancelled jobs' entries count until read
    assert list(queues) == list(BANDS) and queues["batch"] == 1
    rc, out = _cli(capsys, redis_url, key_prefix, "status")
    bands = ", ".join(f"{band} {n}" for band, n in queues.items())
    assert rc == 0
    assert out.splitlines() == [f"queued: {bands}; total {sum(queues.values())}", LINE]
    rc, out = _cli(capsys, redis_url, key_prefix, "status", "--json")
    assert rc == 0 and json.loads(out) == {"queues": queues, "webhooks": BEHIND}


def test_status_of_an_empty_deployment(redis_url: str, key_prefix: str, capsys: Capsys) -> None:
    rc, out = _cli(capsys, redis_url, key_prefix, "status")
    assert rc == 0 and out.splitlines()[1] == "webhooks: 0 to deliver (0 in hand), 0 dead"


def test_top_shows_the_counts(
    redis_url: str, key_prefix: str, behind: Keys, client: Any, capsys: Capsys
) -> None:
    snap = build_snapshot(client, behind)
    assert snap.webhooks.model_dump() == BEHIND and snap.to_json()["webhooks"] == BEHIND
    lines = render(snap, width=80).splitlines()
    assert lines[2] == LINE  # under the queues line
    rc, out = _cli(capsys, redis_url, key_prefix, "top", "--once", "--json")
    assert rc == 0 and json.loads(out)["webhooks"] == BEHIND


@pytest.fixture
def own_gateway(redis_url: str, key_prefix: str) -> Iterator[Served]:
    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix))
    yield served
    stop(served)


def test_status_page_has_a_webhooks_table(own_gateway: Served, behind: Keys) -> None:
    with own_gateway.client() as http:
        page = http.get("/status").text
        counts = http.get("/v1/status").json()["webhooks"]
    assert counts == BEHIND  # what the page's table is filled from
    assert '<table id="webhooks">' in page and 'fill("webhooks", [s.webhooks]' in page
    for name in BEHIND:
        assert f"w.{name}" in page


@pytest.mark.slow
def test_status_page_shows_the_counts_in_a_browser(
    browser: WebDriver, own_gateway: Served, behind: Keys
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{own_gateway.url}/status")
    wait_for(browser, lambda d: rows(d, "webhooks"))
    (row,) = rows(browser, "webhooks")
    assert [td.text for td in row.find_elements(By.TAG_NAME, "td")] == ["3", "1", "1"]
