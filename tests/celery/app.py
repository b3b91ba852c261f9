"""The Celery app the bridge tests run: the test process sends with it, a real ``celery worker``
subprocess (``celery -A tests.celery.app worker``) executes with it.

Settings come from the environment so the subprocess and the tests agree on them: the broker and
result backend are the test Redis under a key prefix of the test session's own, and the jobs go
to the Paternoster prefix the session's JobWorker serves.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from producer import Producer
from producer.celery import register

BROKER_ENV = "PN_CELERY_BROKER"  # the test Redis, as a kombu URL
CELERY_PREFIX_ENV = "PN_CELERY_KEYPREFIX"  # broker and backend keys start with it
JOB_PREFIX_ENV = "PATERNOSTER_PREFIX"


def broker_url(redis_url: str) -> str:
    """kombu spells a unix socket ``redis+socket://`` (the embedded test Redis is one)."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


def make_app(broker: str, celery_prefix: str, redis_url: str, job_prefix: str) -> Celery:
    app = Celery("pn-test", broker=broker, backend=broker)
    keyprefix = {"global_keyprefix": celery_prefix}
    app.conf.update(
        broker_transport_options=keyprefix,
        result_backend_transport_options=keyprefix,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.generate = register(
        app, producer_factory=lambda: Producer(redis_url, prefix=job_prefix, result_ttl_s=600)
    )

    @app.task(name="pn_test.join_texts")
    def join_texts(results: list[dict[str, Any]]) -> str:
        """A chord's callback: every job's text, in the header's order."""
        return "|".join(r["text"] for r in results)

    app.join_texts = join_texts
    return app


def app_from_env() -> Celery | None:
    if BROKER_ENV not in os.environ:  # imported by pytest's collection, not by a worker
        return None
    return make_app(
        os.environ[BROKER_ENV],
        os.environ[CELERY_PREFIX_ENV],
        os.environ["REDIS_URL"],
        os.environ[JOB_PREFIX_ENV],
    )


app = app_from_env()
