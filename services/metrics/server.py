"""A small threaded HTTP server for /metrics, /healthz and /readyz of one worker process.

stdlib ``ThreadingHTTPServer`` in a daemon thread: it keeps answering while the asyncio loop of
the worker is busy with a batch, and it never blocks process exit.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.metrics.registry import Metrics

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, metrics: Metrics, ready: Callable[[], bool]):
        self.metrics = metrics
        self.ready = ready
        super().__init__(addr, handler)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._reply(200, b"ok\n")
        elif path == "/readyz":
            try:
                ok = bool(self.server.ready())
            except Exception:  # a failing probe is "not ready", never a crashed server thread
                log.exception("readiness callback failed")
                ok = False
            self._reply(200, b"ready\n") if ok else self._reply(503, b"not ready\n")
        else:
            self._reply(404, b"not found\n")

    do_HEAD = do_GET

    def log_message(self, format: str, *args) -> None:  # scrapes every 15 s are not news
        log.debug("metrics http: " + format, *args)


class MetricsServer:
    """A running metrics server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, httpd: _Server, thread: threading.Thread):
        self._httpd = httpd
        self._thread = thread
        self.host: str = httpd.server_address[0]
        self.port: int = httpd.server_address[1]

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(metrics: Metrics, host: str, port: int, ready: Callable[[], bool]) -> MetricsServer:
    """Start serving ``metrics.registry`` on host:port (0: any free port) in a daemon thread."""
    server_cls = _Server6 if ":" in host else _Server
    httpd = server_cls((host, port), _Handler, metrics, ready)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name=f"metrics-http-{httpd.server_address[1]}", daemon=True
    )
    thread.start()
    return MetricsServer(httpd, thread)
