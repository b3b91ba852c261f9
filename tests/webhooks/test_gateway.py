"""``paternoster gateway --webhooks``: the gateway's own event loop delivers too."""

from __future__ import annotations

import time

from gateway.config import GatewayConfig
from tests.gateway.conftest import serve, stop
from tests.webhooks.conftest import Receiver, cancelled_jobs, serving
from worker.cli import build_parser


def test_the_gateway_delivers_when_asked(redis_url: str, key_prefix: str) -> None:
    receiver = Receiver()
    served = serve(GatewayConfig(redis_url=redis_url, prefix=key_prefix, webhooks=True))
    try:
        with serving(receiver) as url:
            (job_id,) = cancelled_jobs(redis_url, key_prefix, url, 1)
            deadline = time.monotonic() + 10
            while not receiver.verified and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        stop(served)
    assert receiver.by_job() == {job_id: 1}


def test_the_flag_is_off_by_default() -> None:
    parser = build_parser()
    assert parser.parse_args(["gateway", "--webhooks"]).webhooks
    assert not parser.parse_args(["gateway"]).webhooks
    assert not GatewayConfig().webhooks
