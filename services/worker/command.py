"""`goose-ingest worker`: run one worker process (FastStream app + metrics endpoint)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from services.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="consume raw goose lines and publish harness events (needs a broker)")
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    settings = Settings()
    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if not settings.redis_url:
        print(
            "goose-ingest worker: no broker configured (GOOSE_INGEST_REDIS_URL); "
            "`goose-ingest up` starts an embedded one with a worker",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(serve_worker(settings))


async def serve_worker(settings: Settings) -> int:
    from services.metrics import Metrics
    from services.worker.app import build_app

    app, parts = build_app(settings, Metrics())
    log = logging.getLogger("goose_ingest.worker")

    @app.after_startup
    async def _announce() -> None:
        server = parts.get("server")
        log.info(
            "worker %s consuming %d shards; metrics on port %s",
            parts["consumer"],
            settings.shards,
            server.port if server else "-",
        )

    await app.run()
    return 0
