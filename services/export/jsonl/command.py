"""`goose-ingest export jsonl --path DIR`: every topic entry once as a line of a JSON-lines file."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

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
    from services.export.batch_sink import serve
    from services.export.jsonl.sink import target
    from services.logs import configure_logging
    from services.streams.names import stable_consumer

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
    files = target(Path(directory), s.layout.events_partitions(), s.layout.runs_partitions())
    log.info("export jsonl to %s", directory)
    return serve(ROW, s, files, args.group or s.jsonl_group, args.consumer or stable_consumer(JSONL), log)
