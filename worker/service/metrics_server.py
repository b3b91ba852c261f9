"""The worker's HTTP endpoint: /metrics for Prometheus and /health for orchestrators.

A ``ThreadingHTTPServer`` on a daemon thread, not an async framework: two read-only routes, a
scrape every 5 s, and nothing the model loop waits on (each request reads counters under
prometheus_client's per-metric locks; a step never takes a lock the server holds).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

Health = Callable[[], tuple[int, dict[str, object]]]  # () -> (HTTP status, JSON body)


class MetricsServer(ThreadingHTTPServer):
    """Serves from the moment it is built; ``close()`` stops the thread and frees the port.
    ``port`` is the bound one (ask for port 0 to get a free one, as the tests do)."""

    daemon_threads = True  # a scraper holding a connection open never blocks the worker's exit

    def __init__(
        self, host: str, port: int, *, render: Callable[[], bytes], health: Health
    ) -> None:
        super().__init__((host, port), _Handler)
        self.render = render
        self.health = health
        self.port: int = self.server_address[1]
        # 0.1 s poll: close() returns within ~100 ms, so a stopping worker is not held up.
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.1}, name="metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the socket; safe to call twice."""
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join(timeout=5)
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.render(), CONTENT_TYPE_LATEST)
        elif path == "/health":
            status, body = self.server.health()
            self._send(status, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b"not found: try /metrics or /health\n", "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a scrape every 5 s: an access line each time would drown the worker's job logs
