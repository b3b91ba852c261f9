"""The status page: ``/v1/status`` on data written here, the HTML, and (slow) a real browser.

Workers' heartbeats and ``SUBMIT``'s recent-ids list may not be written by the code under test
yet, so the tests write them where they need them, and still pass once the real code does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio as aredis

from gateway import status as status_module
from gateway.config import GatewayConfig
from gateway.tenancy import IdScope
from producer.fleet import WorkerInfo, live_workers, queue_depths
from producer.keys import BANDS, Keys
from tests.gateway.conftest import TOKENS, Served, serve, stop

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

PAGE_IDS = (
    "token", "queues", "workers", "recent", "job-id", "job-state", "job-output",
    "prompt", "max-tokens", "submit", "submit-job-id", "submit-state", "output",
)  # fmt: skip


@pytest.fixture
def own_gateway(redis_url: str, key_prefix: str) -> Iterator[Served]:
    """A gateway on this test's own prefix, with no worker: its data is only what we write."""
    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix))
    yield served
    stop(served)


@pytest.fixture
def own_auth_gateway(redis_url: str, key_prefix: str) -> Iterator[Served]:
    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix, tokens=TOKENS))
    yield served
    stop(served)


def beat(client: redis.Redis, keys: Keys, info: WorkerInfo) -> None:
    """One heartbeat, as a worker writes it (producer/fleet.py)."""
    client.hset(keys.worker(info.name), mapping=info.to_hash())
    client.expire(keys.worker(info.name), 10)
    client.zadd(keys.workers, {info.name: info.heartbeat_at})


def fake_job(client: redis.Redis, keys: Keys, job_id: str, **fields: object) -> None:
    client.hset(keys.job(job_id), mapping={k: str(v) for k, v in fields.items()})
    client.lpush(keys.recent, job_id)


def test_status_json(own_gateway: Served, client: redis.Redis, key_prefix: str) -> None:
    keys = Keys(key_prefix)
    now = time.time()
    beat(client, keys, WorkerInfo(name="w1", model="tiny", running=3, max_num_seqs=8, waiting=2,
                                  kv_blocks_used=64, kv_blocks_total=256, steps=100,
                                  generated_tokens=1234, heartbeat_at=now - 0.5))  # fmt: skip
    beat(client, keys, WorkerInfo(name="w0-dead", heartbeat_at=now - 60))
    fake_job(client, keys, "j-old", state="done", tenant="acme", priority=0, completion_tokens=16)
    fake_job(client, keys, "j-new", state="queued", tenant="acme", priority=-5,
             wait_reason="no free batch slot")  # fmt: skip
    client.lpush(keys.recent, "j-expired")  # listed, but its hash is gone
    with own_gateway.client() as http:
        queued = []  # two jobs in the default band, no worker to take them
        for _ in range(2):
            created = http.post("/v1/jobs", json={"prompt": "Hi", "max_tokens": 2})
            assert created.status_code == 201
            queued.append(created.json()["job_id"])
            ensure_recent(client, keys, queued[-1])
        body = http.get("/v1/status").json()
        # A queued job's wait reason and position are worked out as the status route does.
        want = [http.get(f"/v1/jobs/{job_id}").json() for job_id in reversed(queued)]
    assert list(body["queues"]) == list(BANDS) and body["queues"]["default"] == 2
    assert body["auth"] is False and abs(body["time"] - now) < 5
    (worker,) = body["workers"]  # the dead one's beat is 60 s old: not live
    assert worker["name"] == "w1" and worker["running"] == 3 and worker["max_num_seqs"] == 8
    assert worker["kv_usage_pct"] == 25.0 and worker["generated_tokens"] == 1234
    assert 0 <= worker["heartbeat_age_s"] < 5
    got = {j["job_id"]: j for j in body["recent"]}
    for status in want:
        row = got[status["job_id"]]
        assert row["state"] == "queued" and row["wait_reason"] == status.get("wait_reason")
        assert row["position"] == status.get("position")
    mine = [j for j in body["recent"] if j["job_id"].startswith("j-")]
    assert [j["job_id"] for j in mine] == ["j-new", "j-old"]  # newest first
    assert mine[0]["wait_reason"] == "no free batch slot" and mine[0]["priority"] == -5
    assert mine[1]["state"] == "done" and mine[1]["completion_tokens"] == 16


def test_async_readers_agree_with_fleet(
    redis_url: str, client: redis.Redis, key_prefix: str
) -> None:
    keys = Keys(key_prefix)
    now = time.time()
    beat(client, keys, WorkerInfo(name="b", heartbeat_at=now, kv_blocks_total=10))
    beat(client, keys, WorkerInfo(name="a", heartbeat_at=now - 1, draining=True))
    client.xadd(keys.band("batch"), {"id": "x"})
    client.xgroup_create(keys.band("interactive"), keys.group, id="0", mkstream=True)
    client.xadd(keys.band("interactive"), {"id": "y"})

    async def read() -> tuple[list[status_module.WorkerRow], dict[str, int]]:
        async with aredis.Redis.from_url(redis_url, decode_responses=True) as a:
            return await status_module.live_workers(a, keys, now), await status_module.queue_depths(
                a, keys
            )

    rows, depths = asyncio.run(read())
    want = live_workers(client, keys, now)
    assert [WorkerInfo.model_validate(r.model_dump()) for r in rows] == want
    assert depths == queue_depths(client, keys) == {"interactive": 1, "default": 0, "batch": 1}


def test_status_with_auth(own_auth_gateway: Served, client: redis.Redis, key_prefix: str) -> None:
    keys = Keys(key_prefix)
    # Behind auth a tenant's jobs are those in its id namespace (gateway.tenancy), listed under
    # the ids it knows them by; one written under a bare id is no job of the gateway's tenants.
    for tenant, job_id in (("tenant-a", "job-a"), ("tenant-b", "job-b")):
        scoped = IdScope.of(tenant).internal(job_id)
        fake_job(client, keys, scoped, state="running", tenant=tenant)
    fake_job(client, keys, "job-bare", state="running", tenant="tenant-a")
    with own_auth_gateway.client() as anonymous:
        assert anonymous.get("/v1/status").status_code == 401
        page = anonymous.get("/status")  # the page has no data in it: open, like /docs
        assert page.status_code == 200
    with own_auth_gateway.client("tok-a") as a:
        body = a.get("/v1/status", params={"recent": 100}).json()
    assert body["auth"] is True
    assert [j["job_id"] for j in body["recent"]] == ["job-a"]  # tenant-b's job is not shown


def test_status_page_html(own_gateway: Served) -> None:
    with own_gateway.client() as http:
        page = http.get("/status")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for element_id in PAGE_IDS:
        assert f'id="{element_id}"' in page.text, element_id
    assert "/v1/status" in page.text and "EventSource" in page.text
    # Nothing fetched from elsewhere: the machines it runs on may have no internet.
    assert "http://" not in page.text and "https://" not in page.text
    assert "/status" not in http_paths(own_gateway)  # the page stays out of the OpenAPI spec


def http_paths(served: Served) -> set[str]:
    with served.client() as http:
        return set(http.get("/openapi.json").json()["paths"])


# ----------------------------------------------------------------------------- the browser

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "status_page.png"
# Root in a container has no sandbox to drop into; the rest stop Chromium's background calls to
# Google, which this machine's closed network refuses many at a time, slowing every start.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1200,1400",
)  # fmt: skip


def require_chromium() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return
    why = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
    if os.environ.get("CI") == "true":
        pytest.fail(why)  # CI installs them (.ci/run): missing there is a broken setup
    pytest.skip(why)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def a_live_worker(gateway: Served, gw_prefix: str, client: redis.Redis) -> Iterator[None]:
    """The session's worker, seen through its heartbeat; a stand-in beat (removed afterwards)
    where the worker does not write heartbeats yet."""
    keys = Keys(gw_prefix)
    stand_in = None
    if not live_workers(client, keys):
        stand_in = WorkerInfo(name=f"stand-in-{uuid.uuid4().hex[:6]}", model="tiny",
                              max_num_seqs=8, heartbeat_at=time.time() + 3600)  # fmt: skip
        beat(client, keys, stand_in)
        client.persist(keys.worker(stand_in.name))
    yield
    if stand_in is not None:
        client.zrem(keys.workers, stand_in.name)
        client.delete(keys.worker(stand_in.name))


def wait_for(
    driver: WebDriver, condition: Callable[[WebDriver], object], timeout_s: float = 30.0
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(condition)


def rows(driver: WebDriver, table: str) -> list[WebElement]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")


def text_of(driver: WebDriver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.ID, element_id)
    return str(element.get_attribute("textContent"))


def state_of(driver: WebDriver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, element_id).get_attribute("data-state"))


def submit_prompt(driver: WebDriver, prompt: str, max_tokens: int) -> str:
    """Types a prompt, clicks Submit, and returns the new job's id once the page shows it."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "prompt").send_keys(prompt)
    box = driver.find_element(By.ID, "max-tokens")
    box.clear()
    box.send_keys(str(max_tokens))
    driver.find_element(By.ID, "submit").click()
    wait_for(driver, lambda d: text_of(d, "submit-job-id") or text_of(d, "submit-error"))
    assert not text_of(driver, "submit-error")
    return text_of(driver, "submit-job-id")


def ensure_recent(client: redis.Redis, keys: Keys, job_id: str) -> None:
    """Lists the job in Keys.recent when SUBMIT does not yet."""
    if job_id not in client.lrange(keys.recent, 0, -1):
        client.lpush(keys.recent, job_id)


def save_screenshot(driver: WebDriver, tmp_path: Path) -> Path:
    path = tmp_path / "status_page.png"
    assert driver.save_screenshot(str(path))
    ARTIFACT.parent.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACT)
    print(f"status page screenshot: {path} (copy: {ARTIFACT})")
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("a_live_worker")
def test_page_in_a_browser(
    browser: WebDriver, gateway: Served, gw_prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(f"{gateway.url}/status")
    wait_for(driver, lambda d: len(rows(d, "queues")) == len(BANDS) and rows(d, "workers"))
    assert [r.get_attribute("data-band") for r in rows(driver, "queues")] == list(BANDS)

    job_id = submit_prompt(driver, "Once upon a time", 16)
    ensure_recent(client, Keys(gw_prefix), job_id)
    wait_for(driver, lambda d: state_of(d, "submit-state") in ("done", "error"))
    assert state_of(driver, "submit-state") == "done", text_of(driver, "submit-state")
    with gateway.client() as http:
        result = http.get(f"/v1/jobs/{job_id}/result").json()
    assert text_of(driver, "output") == result["text"] and result["text"]  # streamed, in order

    # The poll lists the job as done; clicking it replays its stream into the job view.
    row = f'#recent tbody tr[data-job="{job_id}"][data-state="done"]'
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, row))
    driver.find_element(By.CSS_SELECTOR, row).click()
    wait_for(driver, lambda d: state_of(d, "job-state") == "done")
    assert text_of(driver, "job-id") == job_id and text_of(driver, "job-output") == result["text"]
    save_screenshot(driver, tmp_path)


@pytest.mark.slow
def test_page_with_a_token(browser: WebDriver, auth_gateway: Served) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(f"{auth_gateway.url}/status")
    wait_for(driver, lambda d: "401" in text_of(d, "poll-error"))  # no token yet
    driver.find_element(By.ID, "token").send_keys("tok-a")
    wait_for(driver, lambda d: len(rows(d, "queues")) == len(BANDS))
    assert "auth on" in text_of(driver, "last-update") and not text_of(driver, "poll-error")
    # With a token the events are read with fetch() and the Authorization header.
    job_id = submit_prompt(driver, "Hello", 8)
    wait_for(driver, lambda d: state_of(d, "submit-state") in ("done", "error"))
    assert state_of(driver, "submit-state") == "done", text_of(driver, "submit-state")
    with auth_gateway.client("tok-a") as http:
        result = http.get(f"/v1/jobs/{job_id}/result").json()
    assert http_tenant(auth_gateway, job_id) == "tenant-a"
    assert text_of(driver, "output") == result["text"]


def http_tenant(served: Served, job_id: str) -> str:
    with served.client("tok-a") as http:
        return str(http.get(f"/v1/jobs/{job_id}").json()["tenant"])
