"""`goose-ingest replay [--run RUN] [--since T] [--until T] [--source S]`: rebuild events from the raw
log and report differences.

The raw log is what Redis holds, plus, when an archive is configured (GOOSE_INGEST_ARCHIVE_URL),
what the archive holds: services/archive/reader.py reads and merges both (docs/archive-replay.md,
"Replay"); the published events are then the topics' plus the event lake's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from contracts.topics import EVENT, TopicEntry
from services.archive.window import Window, window
from services.broker.connect import sync_client
from services.normalizer import Limits
from services.sequencer.rebuild import LogEntry, merge_log, rebuild
from services.settings import ConfigError, Settings

if TYPE_CHECKING:
    from services.archive.reader import Corrupt

REDIS, ARCHIVE = "redis", "archive"
SOURCES = (REDIS, ARCHIVE)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="rebuild harness events from the raw log and compare with the topics",
        description="Read every raw shard (and control stream), rebuild each run's events with the same "
        "sequencer, normalizer and redaction settings as the workers, and compare them event by event with "
        "what the topics hold. Prints the differences; exit code 1 when there is one. Needs the admin role. "
        "With GOOSE_INGEST_ARCHIVE_URL and no GOOSE_INGEST_REDIS_URL it replays the archive alone, against its "
        "event lake; a missing or empty archive is exit 2.",
    )
    p.add_argument("--run", help="only this run key")
    p.add_argument("--since", help="only runs with a raw entry at or after this time (2026-12-01, "
                   "2026-12-01T05:00:00Z, or a time ago: 90m, 3h, 2d; UTC unless an offset is given)")
    p.add_argument("--until", help="only runs with a raw entry before this time (same forms as --since)")
    p.add_argument("--source", choices=SOURCES, default=None,
                   help="where the raw log is read: 'archive' = the archive plus what Redis still holds (the "
                   "default when GOOSE_INGEST_ARCHIVE_URL is set), 'redis' = Redis only (the default otherwise)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(func=run)


def _read_all(client: Any, stream: str) -> Iterator[tuple[str, dict[bytes, bytes]]]:
    # client: sync_client's Redis or RedisCluster (bytes replies); redis-py types replies for both decode modes
    last = "-"
    while True:
        chunk = client.xrange(stream, min=last, max="+", count=5000)
        if not chunk:
            return
        for sid, fields in chunk:
            yield sid.decode(), fields
        last = "(" + chunk[-1][0].decode()


def compare(settings: Settings, run_key: str | None = None, out: TextIO = sys.stdout, quiet: bool = False,
            source: str | None = None, win: Window | None = None, err: TextIO = sys.stderr) -> int:
    """Number of differences between rebuilt and published events (0: identical); a corrupt
    archive object counts as one (it is named on `err`, the rest is still replayed)."""
    # No broker: the archive alone (its raw log against its event lake), as after `demo` or `up` ended.
    client = sync_client(settings) if settings.redis_url else None
    layout = settings.layout
    win = win or Window()
    source = source or (ARCHIVE if settings.archive_url else REDIS)
    lake: dict[str, dict[str, dict[str, Any]]] = {}
    corrupt: list[Corrupt] = []
    if source == REDIS and win.everything and client is not None:
        raw = [LogEntry(sid, fields, shard=shard)
               for shard, stream in enumerate(layout.raw_streams()) for sid, fields in _read_all(client, stream)]
        control = [LogEntry(sid, fields, control=True)
                   for stream in layout.control_streams() for sid, fields in _read_all(client, stream)]
        log = merge_log(raw, control)
    else:
        log, lake, corrupt = _archive_log(settings, client, source, win, run_key)
        raw = [e for e in log if not e.control]
    rebuilt = rebuild(log, Limits(settings.max_span_chars, settings.max_pending_tools, settings.max_pending_tool_bytes),
                      settings.max_buffered_entries, run_key, settings.max_line_bytes, settings.redactor(),
                      settings.max_held_bytes, shard_of=layout.shard_of if layout.cluster else None)
    published: dict[str, list[dict[str, Any]]] = {}
    topic = [item for stream in layout.events_partitions() for item in _read_all(client, stream)] if client else []
    for _sid, fields in topic:  # per-run order holds within a partition; a run lives in one
        entry = TopicEntry.from_fields(fields, EVENT)
        if entry.run is not None and (run_key is None or entry.run == run_key):
            published.setdefault(entry.run, []).append(entry.document())
    if lake or not win.everything:
        published = _with_lake(published, lake, set(rebuilt.events) if not win.everything else None)
    if run_key is not None and run_key not in rebuilt.events and run_key not in published:
        wanted = run_key.encode()
        if not any(e.fields.get(b"run") == wanted for e in raw):
            where = f" of namespace {settings.namespace!r}" if settings.namespace else ""
            raise ConfigError(f"--run {run_key}: no such run in the raw log or on the topics{where} "
                              "(`goose-ingest tail --no-follow` lists the runs the topics hold)")
    diffs = 0
    for rid in sorted(set(rebuilt.events) | set(published)):
        want, got = rebuilt.events.get(rid, []), published.get(rid, [])
        if want == got:
            continue
        diffs += 1
        if quiet:
            continue
        print(f"run {rid}: rebuilt {len(want)} events, published {len(got)}", file=out)
        for a, b in zip(want, got, strict=False):  # the shorter one ends the comparison
            if a != b:
                print(f"  first difference at {a.get('eventId')}:\n    rebuilt   {orjson.dumps(a).decode()[:300]}\n"
                      f"    published {orjson.dumps(b).decode()[:300]}", file=out)
                break
    for bad in corrupt:
        print(f"replay: corrupt archive object {bad.key}: {bad.reason} (skipped; the rest is replayed)", file=err)
    n = len(rebuilt.events)
    print(f"replay: {n} {'run' if n == 1 else 'runs'} rebuilt from the raw log, {diffs} differ from the published events"
          + (f" ({rebuilt.invalid} invalid raw entries skipped, as the workers dead-lettered them)" if rebuilt.invalid else "")
          + (f"; {len(corrupt)} archive objects could not be read" if corrupt else ""),
          file=out)
    return diffs + len(corrupt)


def _archive_log(settings: Settings, client: Any, source: str, win: Window, run_key: str | None
                 ) -> tuple[list[LogEntry], dict[str, dict[str, dict[str, Any]]], list[Corrupt]]:
    """The log of the window's runs from the archive (when `source` says so) merged with Redis, and
    the events the event lake holds for them."""
    from services.archive import reader

    store = None
    if source == ARCHIVE:
        from services.archive.for_reading import open_for_reading

        store = open_for_reading(settings, alone=client is None)
        if store is None:
            raise ConfigError("--source archive: set GOOSE_INGEST_ARCHIVE_URL (file:///dir or s3://bucket/prefix)")
    from services.archive.store import StoreError

    live = reader.redis_log(client, settings.layout) if client is not None else iter(())
    try:  # a store that fails mid-read: the log cannot be checked, one line (no partial verdict)
        read = reader.read_log(store, live, win)
        runs = read.runs
        if run_key is not None:
            runs = {run_key} if runs is None or run_key in runs else set()
        lake = reader.read_lake_events(store, win, runs) if store is not None else reader.LakeRead()
    except StoreError as exc:
        raise ConfigError(f"replay: {exc}") from None
    return reader.log_of(read.entries, runs), lake.events, read.corrupt + lake.corrupt


def _with_lake(published: dict[str, list[dict[str, Any]]], lake: dict[str, dict[str, dict[str, Any]]],
               runs: set[str] | None) -> dict[str, list[dict[str, Any]]]:
    """The topics' events plus the lake's (they overlap: one copy per eventId), in seq order, of `runs`."""
    out: dict[str, list[dict[str, Any]]] = {}
    for rid in set(published) | set(lake):
        if runs is not None and rid not in runs:
            continue
        by_id = dict(lake.get(rid, {}))
        by_id.update({str(e.get("eventId")): e for e in published.get(rid, [])})
        out[rid] = sorted(by_id.values(), key=lambda e: e.get("seq", 0))
    return out


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    source = args.source or (ARCHIVE if settings.archive_url else REDIS)
    if not settings.redis_url:
        if source == REDIS:
            raise ConfigError("set GOOSE_INGEST_REDIS_URL (or GOOSE_INGEST_ARCHIVE_URL to replay an archive "
                              "without a broker)")
        from services.archive.for_reading import open_for_reading

        open_for_reading(settings, alone=True)  # missing or empty: one line, before anything else is said
        print("goose-ingest replay: no broker configured: replaying the archive alone, against its event lake",
              file=sys.stderr, flush=True)
    win = window(args.since, args.until)
    return 1 if compare(settings, args.run, quiet=args.quiet, source=source, win=win) else 0
