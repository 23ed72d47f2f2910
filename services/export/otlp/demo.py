"""`goose-ingest demo --otlp URL`: run an exporter process beside the demo's worker, report the traces."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from urllib.parse import urlparse

from services.broker.connect import sync_client
from services.export.otlp.mapping import trace_id_of
from services.export.otlp.processor import EXPORTER
from services.settings import ConfigError, Settings

STOP_TIMEOUT_S = 15.0


PROBE_TIMEOUT_S = 3.0  # a collector that does not accept a connection in this long is not there


def check_endpoint(url: str) -> str:
    """A well-formed http(s) URL whose host accepts a TCP connection: the demo would otherwise wait its
    whole timeout for traces that cannot be delivered (one line, exit 2, before anything starts)."""
    import socket

    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--otlp {url!r}: expected an http(s):// OTLP endpoint, e.g. http://127.0.0.1:6006")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"--otlp {url!r}: {exc}") from None
    host = parsed.hostname or ""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"--otlp {url}: no OTLP collector answers at {host}:{port} ({reason}); start one "
                          "first (e.g. Phoenix on 6006, docs/otel.md)") from None
    return url


def start_exporter(settings: Settings, url: str) -> subprocess.Popen[bytes]:
    """An `export otlp` process sending to `url` (OTEL_EXPORTER_OTLP_ENDPOINT); its output goes to stderr."""
    env = dict(os.environ, GOOSE_INGEST_REDIS_URL=settings.redis_url or "", GOOSE_INGEST_METRICS_PORT="0",
               GOOSE_INGEST_SHARDS=str(settings.shards), OTEL_EXPORTER_OTLP_ENDPOINT=url)
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)  # the URL given wins
    return subprocess.Popen([sys.executable, "-m", "services.cli", "export", "otlp", "--log-level", "WARNING"],
                            env=env, stdout=sys.stderr.fileno())


def wait_for_traces(settings: Settings, runs: list[str], timeout: float) -> bool:
    """True once every run's root span was exported (its export state says done)."""
    client = sync_client(settings)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if all(client.hget(settings.layout.export_group_state(EXPORTER, settings.otlp_group, run), "done") for run in runs):
                return True
            time.sleep(0.2)
        return False
    finally:
        client.close()


def trace_line(run: str) -> str:
    return f"trace {trace_id_of(run):032x} {run}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
