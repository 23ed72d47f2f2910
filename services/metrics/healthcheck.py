"""`python -m services.metrics.healthcheck`: the image's HEALTHCHECK (liveness of this container's process).

It asks /healthz on the port the process really bound, read from the port file the metrics server
writes (GOOSE_INGEST_METRICS_PORT_FILE; services/metrics/server.py), so `--metrics-port` and port
0 are checked right; without a file it falls back to GOOSE_INGEST_METRICS_PORT. A wildcard bind
address is asked on loopback. Exit 0 healthy, 1 not (the status line goes to stderr).
"""

from __future__ import annotations

import sys
import urllib.request

from services.metrics.server import read_port_file
from services.settings import Settings

TIMEOUT_S = 2.0


def target() -> tuple[str, int]:
    settings = Settings()
    bound = read_port_file(settings.metrics_port_file) if settings.metrics_port_file else None
    host, port = bound if bound is not None else (settings.metrics_host, settings.metrics_port)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return host, port


def main() -> int:
    host, port = target()
    url = f"http://[{host}]:{port}/healthz" if ":" in host else f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            return 0 if resp.status == 200 else 1
    except (OSError, ValueError) as exc:
        print(f"healthcheck {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
