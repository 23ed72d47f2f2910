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
    try:
        return asyncio.run(serve_worker(settings))
    except KeyboardInterrupt:
        return 0


async def wait_for_broker(settings: Settings, log: logging.Logger) -> None:
    """Wait until the broker answers, instead of crashing: a worker usually starts before Redis."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from services.broker.connect import async_client
    from services.broker.helpers import redact_url

    delay = 0.2
    while True:
        client = async_client(settings)
        try:
            await client.ping()
            return
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            log.warning("broker %s unreachable (%s); retrying in %.1fs", redact_url(settings.redis_url),
                        type(exc).__name__, delay)
        finally:
            await client.aclose()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def serve_worker(settings: Settings) -> int:
    from services.metrics import Metrics
    from services.worker.app import build_app

    log = logging.getLogger("goose_ingest.worker")
    await wait_for_broker(settings, log)
    app, parts = build_app(settings, Metrics())

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
