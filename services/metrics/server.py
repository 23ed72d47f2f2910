"""A small threaded HTTP server for /metrics, /healthz and /readyz of one worker process.

stdlib ``ThreadingHTTPServer`` in a daemon thread: it keeps answering while the asyncio loop of
the worker is busy with a batch, and it never blocks process exit.

Liveness from the first second: a long-running command starts its server with ``serve_early``
before it waits for the broker (services/metrics/startup.py), so /healthz answers and /readyz says
what it waits for while the app is not built yet. The app's own ``serve()`` for the same address
then adopts that server (its registry and readiness replace the early ones) instead of binding a
second port: the port never changes hands, which matters with port 0.

The bound address is written to a port file when one is configured (GOOSE_INGEST_METRICS_PORT_FILE,
set by the image): the image's HEALTHCHECK (``python -m services.metrics.healthcheck``) reads it, so
it checks the port the process really listens on (``--metrics-port``, port 0), not the one the
environment names.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics, generate_latest

from services.readiness import not_ready
from services.settings import ConfigError

if TYPE_CHECKING:
    from services.metrics.registry import Metrics

log = logging.getLogger(__name__)
# Every command that serves /metrics imports this module: no `_created` series beside each counter
# and histogram (they doubled /metrics; rate() and increase() need no creation time to handle resets).
disable_created_metrics()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], metrics: Any,
                 ready: Callable[[], object]) -> None:
        self.metrics = metrics
        self.ready = ready
        super().__init__(addr, handler)


    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that gave up (its scrape_timeout passed while a loaded machine rendered the page)
        # closes the connection: that is the scraper's news, not a traceback on the worker's stderr.
        # Anything else is a bug in a handler: logged once through logging, not printed by socketserver.
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("metrics http: client %s went away (%s)", client_address, type(exc).__name__)
        else:
            log.error("metrics http: request from %s failed", client_address, exc_info=exc)


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
            reason = ""
            try:
                status = self.server.ready()
                ok = bool(status)
                reason = str(getattr(status, "reason", "") or "")  # a Readiness says why it is not ready
            except Exception:  # a failing probe is "not ready", never a crashed server thread
                log.exception("readiness callback failed")
                ok = False
            body = b"not ready: " + reason.encode() + b"\n" if reason else b"not ready\n"
            self._reply(200, b"ready\n") if ok else self._reply(503, body)
        else:
            self._reply(404, b"not found\n")

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        # The gateway's early server holds the gateway's own port while it checks the broker: a tap
        # posting then gets what the gateway says when Redis is away (503, retry), not a 501.
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= 1 << 20:
            self.rfile.read(length)
        else:
            self.close_connection = True
        self.send_response(503)
        body = b'{"reason": "starting"}\n'
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes every 15 s are not news
        log.debug("metrics http: " + format, *args)


class MetricsServer:
    """A running metrics server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, httpd: _Server, thread: threading.Thread, requested: tuple[str, int] = ("", -1),
                 port_file: str = ""):
        self._httpd = httpd
        self._thread = thread
        host, port = httpd.server_address[:2]
        # typeshed allows bytes for any socket family; an AF_INET/AF_INET6 server's bound host is a str
        self.host: str = host if isinstance(host, str) else bytes(host).decode()
        self.port: int = port
        self.requested = requested  # (host, port) as asked for: port 0 binds any port
        self.port_file = port_file
        if port_file:
            write_port_file(port_file, self.host, self.port)

    def adopt(self, metrics: Any, ready: Callable[[], object]) -> None:
        """Serve this registry and readiness from now on (the app taking over an early server)."""
        self._httpd.metrics = metrics
        self._httpd.ready = ready

    def not_ready(self, reason: str) -> None:
        """/readyz says ``reason`` from now on (an early server, while its command waits)."""
        self._httpd.ready = lambda: not_ready(reason)

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        global _early
        if _early is self:
            _early = None
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()
        if self.port_file:
            with contextlib.suppress(OSError):  # removed already, or /tmp not writable: nothing to undo
                os.unlink(self.port_file)
            self.port_file = ""

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MetricsPortUnavailable(ConfigError):
    """The metrics address cannot be bound (in use by another worker, not a local address, privileged)."""


def bind_error(host: str, port: int, exc: OSError, role: str = "metrics") -> MetricsPortUnavailable:
    """The one-line refusal naming the settings that choose this address (``role``: "metrics", or
    "gateway" for the gateway's own port, which its probes share)."""
    if exc.errno == errno.EADDRINUSE:
        why = ("is already in use (another gateway on this host?)" if role == "gateway"
               else "is already in use (another worker or `up` on this host?)")
    elif exc.errno == errno.EACCES:
        why = "needs privileges this process does not have"
    else:
        why = f"cannot be bound ({exc.strerror or exc})"
    name = role.upper()
    return MetricsPortUnavailable(
        f"{role} address {host}:{port} {why}: set GOOSE_INGEST_{name}_PORT (or --port) to a free port "
        f"(0: any free port) or GOOSE_INGEST_{name}_HOST"
        if role == "gateway" else
        f"{role} address {host}:{port} {why}: set GOOSE_INGEST_{name}_PORT to a free port "
        f"(0: any free port) or GOOSE_INGEST_{name}_HOST"
    )


def check_bindable(host: str, port: int) -> None:
    """Raise MetricsPortUnavailable now when host:port cannot be served (port 0 always can)."""
    server_cls = _Server6 if ":" in host else _Server
    try:
        with socket.socket(server_cls.address_family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind((host, port))
    except OSError as exc:
        raise bind_error(host, port, exc) from None


def write_port_file(path: str, host: str, port: int) -> None:
    """``host port`` on one line, written whole (a reader never sees half a file); a failure is logged."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{host} {port}\n")
        os.replace(tmp, path)
    except OSError as exc:  # e.g. a read-only root without a /tmp volume: the check falls back to the setting
        log.warning("cannot write the metrics port file %s (%s)", path, exc.strerror or exc)


def read_port_file(path: str) -> tuple[str, int] | None:
    """The (host, port) a running server wrote, or None when there is no usable file."""
    try:
        with open(path, encoding="ascii") as f:
            host, port = f.read().split()
        return host, int(port)
    except (OSError, ValueError):
        return None


_early: MetricsServer | None = None  # started by serve_early, waiting for the app's serve() to adopt it


def serve_early(host: str, port: int, reason: str, port_file: str = "", role: str = "metrics") -> MetricsServer:
    """Serve /healthz now and a /readyz that says ``reason``, until ``serve()`` adopts the server."""
    global _early
    from prometheus_client import CollectorRegistry

    empty = type("NoMetricsYet", (), {"registry": CollectorRegistry(auto_describe=True)})()
    _early = None  # a second early server of the process binds its own address
    server = _early = serve(cast("Metrics", empty), host, port, lambda: not_ready(reason), port_file=port_file,
                            role=role)
    return server


def serve(metrics: Metrics, host: str, port: int, ready: Callable[[], object], port_file: str = "",
          role: str = "metrics") -> MetricsServer:
    """Start serving ``metrics.registry`` on host:port (0: any free port) in a daemon thread.

    Only ``metrics.registry`` is read (the exporters pass their own families' holder, cast).
    An early server of this process for the same requested address is adopted, not bound again.
    Raises MetricsPortUnavailable (a ConfigError: one line, exit 2 in the CLI) when it cannot bind."""
    global _early
    early = _early
    if early is not None and early.requested == (host, port):
        _early = None
        early.adopt(metrics, ready)
        return early
    server_cls = _Server6 if ":" in host else _Server
    try:
        httpd = server_cls((host, port), _Handler, metrics, ready)
    except OSError as exc:
        raise bind_error(host, port, exc, role) from None
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name=f"metrics-http-{httpd.server_address[1]}", daemon=True
    )
    thread.start()
    return MetricsServer(httpd, thread, (host, port), port_file)
