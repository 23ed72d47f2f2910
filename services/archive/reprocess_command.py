"""`goose-ingest reprocess --since T [--until T]`: the command line of services/archive/reprocess.py."""

from __future__ import annotations

import argparse
import sys

from services.settings import ConfigError, Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reprocess",
        help="rebuild the events of a time window from the archive with the current settings and publish them",
        description="Read the raw log of the runs with an entry in [--since, --until) from the archive "
        "(GOOSE_INGEST_ARCHIVE_URL) and Redis, rebuild their events and run records with THIS process's "
        "normalizer and redaction settings, and publish them to <EVENTS_TOPIC>.reprocessed and "
        "<RUNS_TOPIC>.reprocessed; point an exporter at those topics (docs/archive-replay.md, \"Reprocessing\"). "
        "Needs the admin role. Exit 1 when a corrupt archive object stopped it (nothing published). Without "
        "GOOSE_INGEST_REDIS_URL it rebuilds from the archive alone and publishes nothing (as --dry-run); a missing "
        "or empty archive is exit 2.",
    )
    p.add_argument("--since", required=True, help="start of the window: 2026-12-01, 2026-12-01T05:00:00Z, or a time ago (24h, 2d)")
    p.add_argument("--until", help="end of the window (exclusive; same forms); default: now")
    p.add_argument("--events-topic", help="events topic to publish to (default: <EVENTS_TOPIC>.reprocessed)")
    p.add_argument("--runs-topic", help="runs topic to publish to (default: <RUNS_TOPIC>.reprocessed)")
    p.add_argument("--allow-corrupt", action="store_true",
                   help="publish even when an archive object cannot be read (its runs may come out incomplete)")
    p.add_argument("--dry-run", action="store_true", help="rebuild and count, publish nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.archive.for_reading import open_for_reading
    from services.archive.reprocess import reprocess
    from services.archive.window import window
    from services.broker.connect import sync_client

    settings = Settings()
    alone = not settings.redis_url
    if alone and not settings.archive_url:
        raise ConfigError("set GOOSE_INGEST_REDIS_URL (where it reads and publishes) and/or GOOSE_INGEST_ARCHIVE_URL")
    win = window(args.since, args.until)
    from services.archive.store import StoreError

    store = open_for_reading(settings, alone=alone)
    dry_run = args.dry_run or alone
    if alone and not args.dry_run:  # nowhere to publish: the rebuild alone still checks the archive
        print("reprocess: no broker configured (GOOSE_INGEST_REDIS_URL): rebuilding from the archive only, "
              "nothing published", file=sys.stderr)
    try:  # the store unreachable or failing mid-read: nothing was published yet; one line, exit 2
        if store is None:
            print("reprocess: no archive configured (GOOSE_INGEST_ARCHIVE_URL): reading what Redis holds only",
                  file=sys.stderr)
        elif not alone:
            store.check()
        report = reprocess(settings, win, None if alone else sync_client(settings), store,
                           events_topic=args.events_topic, runs_topic=args.runs_topic,
                           allow_corrupt=args.allow_corrupt, dry_run=dry_run)
    except StoreError as exc:
        raise ConfigError(f"reprocess: {exc}") from None
    if report.corrupt and not args.allow_corrupt:
        print(f"reprocess: {len(report.corrupt)} archive object(s) could not be read: nothing published "
              "(--allow-corrupt publishes the other runs)", file=sys.stderr)
        return 1
    verb = "would publish" if dry_run else "published"
    print(f"reprocess {win.describe()}: {report.runs} {'run' if report.runs == 1 else 'runs'} rebuilt from {report.entries_read} log entries "
          f"({report.segments} archive segments); {verb} {report.events} events to {report.events_topic} "
          f"and {report.records} run records to {report.runs_topic}"
          + (f"; {len(report.failed)} runs failed to rebuild: {', '.join(report.failed[:5])}" if report.failed else ""))
    if report.partial:
        print(f"reprocess: {len(report.partial)} runs skipped, their first entry is not in what was read (they began "
              f"more than a day before --since, or their start is lost): {', '.join(report.partial[:5])}"
              + (" ..." if len(report.partial) > 5 else ""), file=sys.stderr)
    return 1 if report.corrupt or report.failed or report.partial else 0
