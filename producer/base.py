"""What ``Producer`` and ``AsyncProducer`` (and their job handles) hold alike: the connection,
the key names, the result TTL and the reconnect policy; each runs ``producer.flows`` its way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from producer import envs, flows
from producer import requests as rq
from producer.calls import IO
from producer.connection import open_client
from producer.keys import Keys
from producer.reconnect import DEFAULT_RECONNECT, EventCursor, ReconnectPolicy

ClientT = TypeVar("ClientT")
ProducerT = TypeVar("ProducerT")


class ProducerBase(Generic[ClientT]):
    """The arguments both clients take (``Producer`` says what they mean); a subclass makes
    its client (``_from_url``) and what its flows run on (``_make_io``)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: ClientT | None = None,
        prefix: str | None = None,
        result_ttl_s: int = rq.DEFAULT_RESULT_TTL_S,
        reconnect: ReconnectPolicy = DEFAULT_RECONNECT,
    ) -> None:
        self.redis: ClientT
        self.redis, self._embedded = open_client(redis_url, client, self._from_url)
        self.keys = Keys(prefix or envs.key_prefix())
        self.result_ttl_s = result_ttl_s
        self.reconnect = reconnect
        self._io = self._make_io()

    def _from_url(self, url: str) -> ClientT:
        """A client for ``url``, decoding replies to str."""
        raise NotImplementedError

    def _make_io(self) -> IO:
        """What the flows run on: this client, its scripts, the matching sleep."""
        raise NotImplementedError

    def _scripts(self) -> dict[str, Callable[..., Any]]:
        """The protocol's scripts registered on this client (redis-py reloads one on NOSCRIPT)."""
        client: Any = self.redis
        return {name: client.register_script(text) for name, text in flows.SCRIPTS.items()}

    def cursor(
        self, job_id: str, from_event: str = "0", timeout_s: float | None = None
    ) -> EventCursor:
        """Where a stream of the job's events starts, for ``next_events``."""
        return EventCursor(job_id, from_event, timeout_s, self.reconnect)

    def _close_embedded(self) -> None:
        if self._embedded is not None:
            self._embedded.close()


class HandleBase(Generic[ProducerT]):
    """A submitted job. ``stream()`` resumes after the last event it yielded."""

    def __init__(self, producer: ProducerT, job_id: str, created: bool) -> None:
        self.producer = producer
        self.job_id = job_id
        self.created = created  # False: a job with this id already existed; nothing was added
        self.last_event_id = "0"

    def _seen(self, event_id: str | None) -> None:
        self.last_event_id = event_id or self.last_event_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.job_id!r}, created={self.created})"
