"""`goose-ingest export jsonl --path DIR`: every topic entry once as a line of a JSON-lines file."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, cast

from contracts.consumers import BY_NAME, JSONL
from services.settings import ConfigError, Settings

ROW = BY_NAME[JSONL]
log = logging.getLogger("goose_ingest.export.jsonl")


def register(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = targets.add_parser("jsonl", help="append harness events and run records to JSON-lines files, once each",
                           description="Consume every partition of harness.events and harness.runs with the group "
                           "GOOSE_INGEST_JSONL_GROUP and append each entry once to DIR/<day>/<stream>.jsonl.")
    p.add_argument("--path", help="directory of the files (default: GOOSE_INGEST_JSONL_DIR)")
    p.add_argument("--group", help="consumer group on the topics (default: GOOSE_INGEST_JSONL_GROUP)")
    p.add_argument("--consumer", help="consumer name (default: jsonl-<hostname>, stable across restarts)")
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from redis.exceptions import AuthenticationError

    from services.broker.connect import sync_client
    from services.export.batch_sink import BatchSink
    from services.export.jsonl.sink import target
    from services.logs import configure_logging
    from services.metrics.server import serve, serve_early
    from services.metrics.startup import stop_on_signals
    from services.streams.names import stable_consumer
    from services.streams.reader import BROKER_ERRORS

    configure_logging(args.log_level)
    s = Settings().for_command(ROW.command)
    s = s if args.metrics_port is None else s.model_copy(update={"metrics_port": args.metrics_port})
    directory = args.path or s.jsonl_dir
    if not directory:
        raise ConfigError("no directory configured (--path or GOOSE_INGEST_JSONL_DIR)")
    if not s.redis_url:
        raise ConfigError("no broker configured (GOOSE_INGEST_REDIS_URL)")
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)  # at start only: later, a missing one is an outage
    except OSError as exc:
        raise ConfigError(f"cannot create {directory}: {exc.strerror or exc}") from None
    server = serve_early(s.metrics_host, s.metrics_port, "connecting to the broker", port_file=s.metrics_port_file)
    client = sync_client(s)
    try:
        client.ping()
    except AuthenticationError as exc:
        raise ConfigError(f"the broker refused the credentials: {exc}") from None
    except BROKER_ERRORS:
        pass  # down: the loop waits for it
    files = target(Path(directory), s.layout.events_partitions(), s.layout.runs_partitions())
    sink = BatchSink(ROW, s, client, files, args.group or s.jsonl_group, args.consumer or stable_consumer(JSONL), log)
    server = serve(cast(Any, sink.metrics), s.metrics_host, s.metrics_port, sink.is_ready, port_file=s.metrics_port_file)
    log.info("export jsonl to %s, group %s; metrics on %s:%d", directory, sink.reader.group, server.host, server.port)
    stop_on_signals(log, "finishing the current batch", sink.stop)
    try:
        sink.run()
    finally:
        server.close()
        files.close()
    return 0
