"""`goose-ingest replay [--run RUN]`: rebuild events from the raw log and report differences."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import orjson

from services.broker.connect import sync_client
from services.normalizer import Limits
from services.replay.rebuild import LogEntry, merge_log, rebuild
from services.settings import ConfigError, Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="rebuild harness events from the raw log and compare with the topics",
        description="Read every raw shard (and control stream), rebuild each run's events with the same "
        "sequencer, normalizer and redaction settings as the workers, and compare them event by event with "
        "what the topics hold. Prints the differences; exit code 1 when there is one. Needs the admin role.",
    )
    p.add_argument("--run", help="only this run key")
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


def compare(settings: Settings, run_key: str | None = None, out: TextIO = sys.stdout, quiet: bool = False) -> int:
    """Number of differences between rebuilt and published events (0: identical)."""
    client = sync_client(settings)
    layout = settings.layout
    raw = [LogEntry(sid, fields, shard=shard)
           for shard, stream in enumerate(layout.raw_streams()) for sid, fields in _read_all(client, stream)]
    control = [LogEntry(sid, fields, control=True)
               for stream in layout.control_streams() for sid, fields in _read_all(client, stream)]
    rebuilt = rebuild(merge_log(raw, control), Limits(settings.max_span_chars, settings.max_pending_tools, settings.max_pending_tool_bytes),
                      settings.max_buffered_entries, run_key, settings.max_line_bytes, settings.redactor(),
                      settings.max_held_bytes, shard_of=layout.shard_of if layout.cluster else None)
    published: dict[str, list[dict[str, Any]]] = {}
    topic = [item for stream in layout.events_partitions() for item in _read_all(client, stream)]
    for _sid, fields in topic:  # per-run order holds within a partition; a run lives in one
        rid = fields[b"runId"].decode()
        if run_key is None or rid == run_key:
            published.setdefault(rid, []).append(orjson.loads(fields[b"data"]))
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
    print(f"replay: {len(rebuilt.events)} runs rebuilt from the raw log, {diffs} differ from the published events"
          + (f" ({rebuilt.invalid} invalid raw entries skipped, as the workers dead-lettered them)" if rebuilt.invalid else ""),
          file=out)
    return diffs


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    if not settings.redis_url:
        print("goose-ingest replay: set GOOSE_INGEST_REDIS_URL", file=sys.stderr)
        return 2
    return 1 if compare(settings, args.run, quiet=args.quiet) else 0
