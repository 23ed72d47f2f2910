"""`goose-ingest export postgres`: the harness topics into PostgreSQL (docs/analytics.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from typing import Any, cast

from pydantic import SecretStr, ValidationError

from services.settings import ConfigError, Settings

log = logging.getLogger("goose_ingest.export.postgres")


def register(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = targets.add_parser(
        "postgres",
        help="write harness events and run records to PostgreSQL (fleet analytics views)",
        description="Consume every partition of harness.events and harness.runs with a consumer group of "
        "its own and write them to PostgreSQL, effectively once. See docs/analytics.md.",
    )
    p.add_argument("--dsn", help="libpq DSN or postgresql:// URL (default: GOOSE_INGEST_POSTGRES_DSN; prefer the "
                   "environment, a command line is visible to every local user)")
    p.add_argument("--migrate", action="store_true", help="apply pending schema migrations, print them, and exit")
    p.add_argument("--group", default=None, help="consumer group on the topics (default: GOOSE_INGEST_POSTGRES_GROUP, goose-ingest-postgres)")
    p.add_argument("--consumer", default=None,
                   help="consumer name (default: postgres-<hostname>; keep it stable across restarts so a restarted "
                   "sink re-reads what it had not acknowledged at once)")
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


_MAX_REASON = 200


def server_reason(exc: BaseException, dsn: str) -> str | None:
    """What the PostgreSQL server answered (`FATAL:  database "x" does not exist`), without the DSN's
    password; None when no server answered (refused, timed out: "unreachable" says it all)."""
    import re

    from psycopg.conninfo import conninfo_to_dict

    match = re.search(r"\b(FATAL|ERROR):\s+(.*)", str(exc))
    if match is None:
        return None
    reason = " ".join(match.group(2).split())[:_MAX_REASON]
    try:
        password = str(conninfo_to_dict(dsn).get("password") or "")
    except Exception:  # unparseable: checked before connecting, so not expected here
        password = ""
    if password:
        reason = reason.replace(password, "***")
    return reason


def _fail(message: str) -> int:
    print(f"goose-ingest export postgres: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from services.logs import configure_logging

    configure_logging(args.log_level)
    try:
        settings = Settings().for_command("export postgres")  # 9466 unless set: beside a worker on one host
    except ValidationError as exc:
        return _fail(f"invalid settings: {exc.errors()[0].get('loc')} {exc.errors()[0].get('msg')}")
    if args.dsn:
        settings = settings.model_copy(update={"postgres_dsn": SecretStr(args.dsn)})
    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if settings.postgres_dsn is None or not settings.postgres_dsn.get_secret_value().strip():
        return _fail("no database configured (--dsn or GOOSE_INGEST_POSTGRES_DSN)")
    dsn = settings.postgres_dsn.get_secret_value()

    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from services.export.postgres.sink import redact_dsn
    from services.export.postgres.store import Store

    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return _fail("the DSN cannot be parsed (libpq key=value or postgresql:// URL expected)")

    if args.migrate:
        store = Store(dsn)
        try:
            applied = store.migrate()
        except psycopg.OperationalError as exc:
            reason = server_reason(exc, dsn)
            if reason:  # the server answered: a missing database or role, refused credentials...
                return _fail(f"database {redact_dsn(dsn)} refused the connection: {reason}")
            return _fail(f"database {redact_dsn(dsn)} unreachable ({type(exc).__name__})")
        except Exception as exc:  # a migration that fails is reported, not dumped as a traceback
            return _fail(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            store.close()
        for name in applied:
            print(name)
        return 0

    if not settings.redis_url:
        return _fail("no broker configured (GOOSE_INGEST_REDIS_URL)")
    return serve(settings, dsn, args.group, args.consumer)


def check_broker(client: Any) -> None:
    """One PING before the sink starts. The sink retries what looks like an outage forever (a TLS
    failure mid-run too: a certificate rotated back recovers) and exits EXIT_THREAD_FAILED on
    anything else, so a broker that can never work as configured -- a TLS failure (BrokerTLSError),
    refused credentials, a database number out of range -- must surface here, where the CLI prints it as one line, exit 2. A broker that is merely down is not an error:
    the sink waits for it, as it does mid-run."""
    from redis.exceptions import AuthenticationError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    try:
        client.ping()
    except AuthenticationError:
        raise
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        log.warning("broker unreachable at start (%s); waiting for it", type(exc).__name__)


def serve(settings: Settings, dsn: str, group: str | None, consumer: str | None) -> int:
    from services.broker.connect import sync_client
    from services.export.postgres.metrics import SinkMetrics
    from services.export.postgres.sink import EXIT_THREAD_FAILED, Sink, SinkOptions, redact_dsn
    from services.export.postgres.store import Store
    from services.metrics.server import serve as serve_metrics
    from services.metrics.startup import stop_on_signals
    from services.streams.names import stable_consumer

    options = SinkOptions(
        group=group or settings.postgres_group,  # the flag overrides the setting
        consumer=consumer or stable_consumer("postgres"),
        retention=timedelta(days=settings.postgres_retention_days),
        batch_size=settings.batch_size,
        block_ms=settings.block_ms,
        claim_idle_ms=settings.claim_idle_ms,
        sweep_interval_s=settings.sweep_interval_s,
    )
    metrics = SinkMetrics()
    client = sync_client(settings)
    check_broker(client)
    store = Store(dsn)
    sink = Sink(settings, client, store, options, metrics)
    # The server reads `.registry` only; SinkMetrics has its own families, not the worker's.
    try:
        server = serve_metrics(cast(Any, metrics), settings.metrics_host, settings.metrics_port, sink.readiness,
                               port_file=settings.metrics_port_file)
    except ConfigError:  # the port is taken (MetricsPortUnavailable): one line, exit 2
        store.close()
        raise
    log.info("export postgres to %s, group %s, consumer %s; metrics on %s:%d",
             redact_dsn(dsn), options.group, options.consumer, server.host, server.port)

    stop_on_signals(log, "finishing the current batch", sink.stop)
    try:
        sink.run()
    finally:
        server.close()
        store.close()
    # A thread failed on an error no retry fixes (logged as one line): not a clean stop, so the
    # supervisor restarts the process instead of leaving it up with nothing exported.
    return EXIT_THREAD_FAILED if sink.failure is not None else 0
