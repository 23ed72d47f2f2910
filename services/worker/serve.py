"""Serve one worker process: metrics first (so /healthz answers and /readyz says what it waits
for), then wait for the broker, then the FastStream app until SIGTERM/SIGINT. Used by `worker` and
by `up` (services/quickstart)."""

from __future__ import annotations

import logging

from services.broker.connect import wait_for_broker
from services.settings import Settings


async def serve_worker(settings: Settings) -> int:
    from services.metrics import Metrics
    from services.metrics.server import serve_early
    from services.metrics.startup import StopOnSignal
    from services.worker.app import build_app
    from services.worker.collector import tune_collector

    log = logging.getLogger("goose_ingest.worker")
    tune_collector()
    # Served before the broker is reached (a second worker on the same host fails here, exit 2), so
    # /healthz answers and /readyz says what we wait for; build_app's serve() adopts this server.
    # SIGTERM/SIGINT while waiting: exit 0 (services/metrics/startup.py).
    early = serve_early(settings.metrics_host, settings.metrics_port, "waiting for the broker", settings.metrics_port_file)
    try:
        stop = StopOnSignal().install()
        await stop.wait(wait_for_broker(settings, log, early.not_ready))
        if stop.requested:
            return 0
        app, parts = build_app(settings, Metrics(tools=settings.metric_tools))
        stop.forward(app.exit)

        @app.after_startup
        async def _announce() -> None:
            server = parts.get("server") if isinstance(parts, dict) else getattr(parts, "server", None)
            consumer = parts["consumer"] if isinstance(parts, dict) else getattr(parts, "consumer", "?")
            log.info("worker %s consuming %d shards; metrics on port %s", consumer, settings.shards,
                     server.port if server else "-")

        await app.run()
    finally:
        early.close()  # when adopted, the app closed it already (idempotent)
    return parts.exit_code  # 1 when a subscriber stopped on its own (services/worker/app.py)
