"""`goose-ingest archive`: the raw log and the topics into object storage (docs/archive.md).

The command: settings and the start-up checks (one line and exit 2 for a bad URL, a bucket that does
not exist, credentials refused, an endpoint that is not S3). The metrics server, the broker check,
signals and the watch of the loop are the thread consumers' shell (services/streams/thread_shell.py);
the loop itself is services/archive/consumer.py.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from services.settings import ConfigError, Settings

log = logging.getLogger("goose_ingest.archive")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "archive",
        help="archive the raw log and the topics to object storage (file:// or s3://) as Parquet",
        description="Read every raw shard, control stream and topic partition with a consumer group of its own and "
        "write them, in stream-id order, as immutable Parquet segments to GOOSE_INGEST_ARCHIVE_URL (file:///dir or "
        "s3://bucket/prefix; S3 settings from the standard AWS_* variables): the raw log byte-exact, the events and "
        "run records as an event lake. Run one replica. See docs/archive.md.",
    )
    p.add_argument("--url", default=None, help="override GOOSE_INGEST_ARCHIVE_URL")
    p.add_argument("--consumer", default=None, help="consumer name (default: archive-<host>-<pid>, one per process)")
    p.add_argument("--adopt-store", action="store_true",
                   help="the broker lost its archive id (restarted empty) and the store is this deployment's: adopt its id")
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.logs import configure_logging

    configure_logging(args.log_level)
    settings = Settings().for_command("archive")
    if args.url:
        settings = settings.model_copy(update={"archive_url": args.url})
    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if not settings.archive_url:
        raise ConfigError("no archive configured (GOOSE_INGEST_ARCHIVE_URL or --url: file:///dir or s3://bucket/prefix)")
    if not settings.redis_url:
        raise ConfigError("no broker configured (GOOSE_INGEST_REDIS_URL)")

    from redis.exceptions import AuthenticationError, NoPermissionError
    from redis.exceptions import ConnectionError as RedisConnectionError

    from services.archive.consumer import Archiver
    from services.archive.fence import Lease, check_deployment, process_name
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import StoreError, open_store
    from services.streams import thread_shell

    store = open_store(settings)
    assert store is not None  # archive_url is set
    consumer = args.consumer or process_name()
    leases: list[Lease] = []

    def build(client: Any) -> Archiver:
        archiver = Archiver(settings, client, store, ArchiveMetrics(), consumer)
        leases.append(Lease(client, settings.layout.archive_lease(archiver.group), f"{consumer}/{os.urandom(4).hex()}"))
        return archiver

    def prepare(archiver: Archiver) -> bool:
        """One archive per group (a second one: one line, exit 2), the store is this deployment's
        (another's: one line, exit 2), what the store holds, the group after it. Refused credentials
        or a user without the archive's permissions: one line, exit 2 (the CLI reports them). An
        unreachable broker or store is waited for; a stop meanwhile is exit 0."""
        lease, warned = leases[0], False
        while not archiver.stopping.is_set():
            try:
                lease.acquire(archiver.group)
                store.check()  # ConfigError: the CLI prints it as one line and exits 2
                deployment = check_deployment(archiver.client, store, settings.layout.archive_identity(archiver.group),
                                              settings.namespace, archiver.group, adopt=args.adopt_store)
                archiver.start(lease, deployment)
                archiver.ensure_groups()
                return True
            except (AuthenticationError, NoPermissionError):
                raise
            except (RedisConnectionError, OSError, StoreError) as exc:
                if not warned:
                    log.warning("broker or store unreachable at start (%s); will keep trying",
                                exc if isinstance(exc, StoreError) else type(exc).__name__)
                    warned = True
                archiver.stopping.wait(1.0)
        lease.release()  # only ours, if it was taken; a broker still away is no error here
        return False

    layout = settings.layout
    # /healthz from the first second (the checks wait on the broker and the store, and a black-holed
    # host costs its connect timeout: no reason for a liveness probe to restart the process); a
    # fenced archive (another took its lease over) ends its loop with `fault()`: exit 1.
    return thread_shell.serve(
        "archive", settings, log, awaiting="checking the broker and the archive store",
        streams=[f"{layout.raw_prefix}.*", f"{layout.control_prefix}.*", layout.events_topic, layout.runs_topic],
        build=build, prepare=prepare, metrics=lambda archiver: archiver.metrics,
        describe=lambda archiver: f"to {store.describe()}, group {archiver.group}, consumer {archiver.consumer}",
        stopping="writing what was read, then stopping")
