"""Serve one worker process: metrics first (so /healthz answers and /readyz says what it waits
for), then wait for the broker, then the FastStream app until SIGTERM/SIGINT. Used by `worker` and
by `up` (services/quickstart)."""

from __future__ import annotations

import logging

from services.settings import Settings


async def serve_worker(settings: Settings) -> int:
    from services.metrics import Metrics
    from services.streams.app_shell import serve_app
    from services.worker.app import build_app
    from services.worker.collector import tune_collector

    tune_collector()
    # the shell's start sequence (services/streams/app_shell.py): /healthz before the broker is
    # reached (a second worker on the same host fails there, exit 2), SIGTERM/SIGINT while waiting: exit 0
    return await serve_app(settings, logging.getLogger("goose_ingest.worker"),
                           lambda: build_app(settings, Metrics(tools=settings.metric_tools)),
                           lambda rt: f"worker {rt.consumer} consuming {settings.shards} shards")
