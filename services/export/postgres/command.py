"""`goose-ingest export postgres`: the harness topics into PostgreSQL (docs/analytics.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from typing import Any

from pydantic import SecretStr, ValidationError

from services.settings import Settings

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


def serve(settings: Settings, dsn: str, group: str | None, consumer: str | None) -> int:
    """The sink on the thread consumers' shell (services/streams/thread_shell.py: /healthz at once,
    the broker's PING -- refused credentials or a TLS misconfiguration are one line, exit 2, a broker
    that is down is waited for --, signals, the reader thread watched). Its two threads are its own:
    a thread that fails on an error no retry fixes ends `run` with `fault()` set, and the shell exits
    1 so the supervisor restarts the process instead of leaving it up with nothing exported."""
    from services.export.postgres.metrics import SinkMetrics
    from services.export.postgres.sink import Sink, SinkOptions, redact_dsn
    from services.export.postgres.store import Store
    from services.streams import thread_shell
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
    stores: list[Store] = []

    def build(client: Any) -> Sink:
        stores.append(Store(dsn))
        return Sink(settings, client, stores[0], options, SinkMetrics())

    def close() -> None:
        for store in stores:
            store.close()

    layout = settings.layout
    return thread_shell.serve(
        "export postgres", settings, log, awaiting="connecting to the broker and the database",
        streams=[layout.events_topic, layout.runs_topic], build=build,
        metrics=lambda sink: sink.metrics,  # the server reads `.registry` only: the sink's own families
        describe=lambda sink: f"to {redact_dsn(dsn)}, group {options.group}, consumer {options.consumer}",
        stopping="finishing the current batch", close=close)
