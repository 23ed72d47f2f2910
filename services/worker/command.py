"""`goose-ingest worker`: run one worker process (FastStream app + metrics endpoint).

Logs go to stderr, never stdout (the worker promises nothing on stdout), in one plain format
without ANSI colour: FastStream's own loggers are re-pointed at our handler.
"""

from __future__ import annotations

import argparse
import asyncio

from services.logs import configure_logging, stdout_to_stderr
from services.settings import ConfigError, Settings
from services.worker.serve import serve_worker


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="consume raw goose lines and publish harness events (needs a broker)",
        description="Run one worker process: consume the raw shard streams in a consumer group, normalize and "
        "redact every run, commit events, run records and dead letters atomically, serve /metrics, /healthz "
        "and /readyz. Needs GOOSE_INGEST_REDIS_URL; logs go to stderr. Stop it with SIGTERM or Ctrl-C.",
    )
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stdout_to_stderr()
    configure_logging(args.log_level)
    settings = Settings()
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {args.metrics_port}: must be 0..65535")
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if not settings.redis_url:
        raise ConfigError("no broker configured (GOOSE_INGEST_REDIS_URL); `goose-ingest up` starts an embedded "
                          "redis-server with a worker")
    try:
        return asyncio.run(serve_worker(settings))
    except KeyboardInterrupt:
        return 0


