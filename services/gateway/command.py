"""`goose-ingest gateway`: the ingest gateway on uvicorn (docs/gateway.md); `tokens` lives in tokens.py."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import socket
import sys

PROG = "goose-ingest"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "gateway", help="authenticated HTTP ingest of raw entries (agent hosts need no Redis credential)",
        description="Serve POST /v1/raw (JSON array or NDJSON of raw entries, gzip/zstd), /healthz, /readyz, "
        "/metrics. Tokens: `goose-ingest tokens`. See docs/gateway.md.")
    p.add_argument("--host", default=None, help="bind address (default GOOSE_INGEST_GATEWAY_HOST)")
    p.add_argument("--port", type=int, default=None, help="port (default GOOSE_INGEST_GATEWAY_PORT; 0: any free)")
    p.set_defaults(func=run)
    from services.gateway import tokens

    tokens.register(sub)


def _bind(host: str, port: int) -> socket.socket:
    from services.metrics.server import bind_error

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: a response's head and body are two writes, and with Nagle the
    # second waits for the client's delayed ACK (~40 ms a request, measured here).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise bind_error(host, port, exc, "gateway") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _check_tls(cert: str, key: str) -> None:
    """A certificate or key that does not load is a one-line configuration error, not a traceback."""
    import ssl

    from services.settings import ConfigError

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"GOOSE_INGEST_GATEWAY_TLS_CERT_FILE / _KEY_FILE do not load ({exc})") from None


def _check_shard_count(client: object, settings: object) -> None:
    """Like every writer: another shard count than the data's would route runs elsewhere (exit 2).
    Redis down at start is no reason to stop: requests answer 503 until it is back."""
    import redis

    from services.broker.cluster import ensure_shard_count

    try:
        ensure_shard_count(client, settings.layout)  # type: ignore[attr-defined]
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        logging.getLogger("goose_ingest.gateway").warning("Redis unreachable at start (%s); serving 503 until it is back",
                                                         type(exc).__name__)


def freeze_startup_heap() -> None:
    """Move everything start-up made (modules, classes, the app: ~60,000 objects) out of the collector's sight.

    Why: a full (generation 2) collection walks every tracked object with the event loop stopped; at
    1,000 requests/s one came every 2.5-5 s, and with the start-up heap in it each took 31-39 ms of CPU
    here (60-100 ms wall under load), holding every request in flight: the gateway's share of the p99
    (``bench/gateway.py --trace``, docs/gateway.md). Those objects live as long as the process, so
    collecting them never frees anything; after the freeze a full collection walks only what requests
    and connections hold (5-11 ms of CPU with 200 connections, under load). Objects are still freed by
    reference counting as before."""
    gc.collect()
    gc.freeze()


def return_large_buffers() -> None:
    """Large allocations (request bodies and decoded bodies, up to GATEWAY_MAX_BODY_BYTES each) straight
    from mmap, and back to the system when freed.

    Why: glibc raises its mmap threshold to the size of the largest block freed (up to 32 MiB), after
    which 16 MiB bodies come from the heaps of the decoding threads and stay there, fragmented. With
    the threshold fixed (which turns the dynamic one off) the peak RSS under the hostile bodies of
    bench/gateway_bombs.py was 110-123 MiB instead of 123-157 MiB (same run). No effect where libc is not glibc."""
    import ctypes

    m_mmap_threshold = -3
    try:
        ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, 1 << 20)
    except (OSError, AttributeError):
        pass


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from services.broker.connect import sync_client_with_timeouts
    from services.gateway.app import Gateway
    from services.gateway.http import MAX_HEAD_BYTES, protocol_class
    from services.metrics.server import serve_early, write_port_file
    from services.settings import ConfigError, Settings

    settings = Settings()
    if not settings.redis_url:
        raise ConfigError("no broker configured: set GOOSE_INGEST_REDIS_URL (the gateway writes to Redis)")
    host = args.host if args.host is not None else settings.gateway_host
    port = args.port if args.port is not None else settings.gateway_port
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    tls: dict[str, str] = {}
    if settings.gateway_tls_cert_file or settings.gateway_tls_key_file:
        if not (settings.gateway_tls_cert_file and settings.gateway_tls_key_file):
            raise ConfigError("GOOSE_INGEST_GATEWAY_TLS_CERT_FILE and _KEY_FILE go together")
        _check_tls(settings.gateway_tls_cert_file, settings.gateway_tls_key_file)
        tls = {"ssl_certfile": settings.gateway_tls_cert_file, "ssl_keyfile": settings.gateway_tls_key_file}
    # /healthz (plain HTTP) on the gateway's own address from the first second, while the shard count
    # is checked against a broker that may be slow or away; handed over to uvicorn on the same port
    # (port 0: the one it got) once the check is done.
    early = serve_early(host, port, "checking the broker", settings.metrics_port_file, role="gateway")
    try:
        # socket_timeout bounds a hung broker (then 503); creating the client does not connect.
        client = sync_client_with_timeouts(settings, socket_timeout=5.0, connect_timeout=2.0)
        _check_shard_count(client, settings)
        gateway = Gateway(settings, client)
    finally:
        port = early.port
        early.close()
    sock = _bind(host, port)
    bound = sock.getsockname()
    scheme = "https" if tls else "http"
    print(f"{PROG} gateway: listening on {scheme}://{bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        gateway.app(), lifespan="off", access_log=False, log_level="warning", server_header=False,
        limit_concurrency=settings.gateway_max_connections, timeout_keep_alive=5,
        # httptools when installed (1.5-2x h11's requests/s here), its heads bounded (http.py);
        # uvloop when installed ("auto"). The request line and headers of one request: a client that
        # sends more is cut off (h11's own bound when httptools is absent)
        http=protocol_class(settings.gateway_body_timeout_s), loop="auto", h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        **tls,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    config.load()  # the protocol classes and the app, imported now: before the freeze below, not on the loop
    return_large_buffers()
    freeze_startup_heap()
    # the image's HEALTHCHECK asks /healthz on the port in this file (services/metrics/healthcheck.py):
    # the gateway serves its probes on its own port, which is then the one to check
    port_file = settings.metrics_port_file
    if port_file:
        write_port_file(port_file, bound[0], bound[1])
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again for the handler it
    # found installed: with the default one the process would end by the signal (143/130) after a
    # complete, requested stop. A no-op there makes that stop exit 0, as every other command's does.
    import signal

    from services.metrics.startup import STOP_SIGNALS

    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda _signum, _frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        client.close()
        if port_file:
            with contextlib.suppress(OSError):
                os.remove(port_file)
    return 0
