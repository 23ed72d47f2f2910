"""`goose-ingest tail [--type TYPE] [--class CLASS] [--run RUN]`: follow harness events (and run records) for a human.

Events and run records live on different streams (and, on a cluster, on one partition per shard).
They are printed merged in the order they were committed: runs interleave by stream-id time, and
each run's own entries are in the run's order -- stream ids of two streams are not comparable
within a commit (a script's XADDs may straddle a millisecond). An event's `seq` is its index in the
run; a record's `counts` say how many events the run had when it was written, so a record goes right
before the event with that index (STARTED first, ENDED after the exit error it caused). A page that
came back full may have more of the same commit behind it, so entries near or after the oldest
"full" point wait for the next read.

`--class C` prints the events that carry error class C (`error` events and retry `warning`s: what
the error-class alerts count) with their run's host, which tail learns from the run records it reads
(a run that started before a follow began shows none); the records themselves are not printed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, TextIO

import orjson

from contracts.events import ERROR_CLASSES, EVENT_TYPES
from contracts.stream_ids import StreamId
from contracts.topics import EVENT, RECORD, TopicEntry, TopicEntryError
from services.broker.connect import sync_client
from services.broker.url import redact_url
from services.settings import ConfigError, Settings
from services.tail.format import event_line, record_line
from services.tail.order import Followed, commit_order

PAGE = 500  # entries per stream per read
FOLLOW_BLOCK_MS = 1000  # one stream group: how long a read waits for news
POLL_INTERVAL_S = 0.2  # several groups (cluster partitions): pause between rounds of non-blocking reads
HOLD_MARGIN_MS = 1000  # entries this close to an unfinished page wait for it (a commit takes far less)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tail",
        help="follow harness events and run records, printed for a human",
        description="Print harness events and run lifecycle records as they are published (one line each, "
        "with date and time), merged in commit order. --no-follow prints what the topics hold now and exits; "
        "--from-start prints the history first and then follows.",
    )
    p.add_argument("--type", choices=EVENT_TYPES, help="only this event type (reads its own topic)")
    p.add_argument("--class", dest="error_class", choices=ERROR_CLASSES, metavar="CLASS",
                   help="only events carrying this error class (errors and retry warnings), with their run's host; "
                   f"one of: {', '.join(ERROR_CLASSES)}")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--from-start", action="store_true", help="print what the topics already hold first")
    p.add_argument("--json", action="store_true", help="print the events and records as JSON lines")
    p.add_argument("--no-runs", action="store_true", help="leave out run lifecycle records")
    p.add_argument("--count", type=int, help="stop after this many lines")
    p.add_argument("--no-follow", action="store_true", help="print what the topics hold now and exit")
    p.set_defaults(func=run)


def stream_groups(settings: Settings, args: argparse.Namespace) -> list[tuple[list[str], set[str]]]:
    """(streams one XREAD may read together, which of them carry run records), per hash slot group.

    A single node has one group of every stream; a cluster one group per shard (a multi-stream read
    must stay in one slot). `--run` reads only the run's own partition."""
    layout = settings.layout
    shards = [layout.shard_of(args.run)] if args.run else list(range(layout.shards))
    groups: dict[str, tuple[list[str], set[str]]] = {}
    for s in shards:
        tag = layout.tag(s)  # "" on a single node: everything in one group
        streams, records = groups.setdefault(tag, ([], set()))
        topic = layout.type_partition(args.type, s) if args.type else layout.events_partition(s)
        wanted = [topic]
        # --class reads the run records for the hosts (even with --type: a class's event names its run)
        if getattr(args, "error_class", None) or (not args.no_runs and not args.type):
            wanted.append(layout.runs_partition(s))
            records.add(layout.runs_partition(s))
        for name in wanted:
            if name not in streams:
                streams.append(name)
    return list(groups.values())


def _last_id(client: Any, stream: str) -> str:
    newest = client.xrevrange(stream, count=1)
    return newest[0][0].decode() if newest else "0-0"


def follow(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout,
           stopping: threading.Event | None = None) -> int:
    """Print until --count lines, the end of the topics (--no-follow), or `stopping` is set (checked
    after every read, so at most FOLLOW_BLOCK_MS after it is set)."""
    stopping = stopping if stopping is not None else threading.Event()
    client = sync_client(settings)
    groups = stream_groups(settings, args)
    from_start = args.from_start or args.no_follow
    # Resolve "now" to concrete ids once: re-sending `$` with every read would skip what arrives in between.
    last = {s: "0-0" if from_start else _last_id(client, s) for streams, _ in groups for s in streams}
    records = set().union(*(r for _, r in groups))
    pending: list[Followed] = []
    printed = 0
    wanted_class = getattr(args, "error_class", None)
    hosts: dict[str, str] = {}  # run -> host, from the run records read (--class)
    block = None if args.no_follow or len(groups) > 1 else FOLLOW_BLOCK_MS
    if not args.no_follow:  # once: a quiet terminal is a tail waiting, not a tail stuck
        print(f"goose-ingest tail: waiting for events on {redact_url(settings.redis_url or '')} "
              "(Ctrl-C to stop)", file=sys.stderr, flush=True)
    while not stopping.is_set():
        horizon: int | None = None  # entries from this ms on may have more of their commit unread
        got = 0
        woken = False  # a blocking read returned: Redis (< 7.2) answers with the one stream that woke it
        for streams, _ in groups:
            wait = None if pending else block
            reply = client.xread({s: last[s] for s in streams}, count=PAGE, block=wait)
            woken = woken or (wait is not None and bool(reply))
            for raw_stream, entries in reply or []:
                stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
                got += len(entries)
                for sid, fields in entries:
                    sid_text = sid.decode()
                    last[stream] = sid_text
                    decoded = TopicEntry.from_fields(fields, RECORD if stream in records else EVENT)
                    if args.run and decoded.run != args.run:
                        continue
                    try:
                        doc = decoded.document()
                    except TopicEntryError as exc:  # not what a worker writes: say so, keep following
                        print(f"skipped {stream} {sid_text}: {exc}", file=sys.stderr)
                        continue
                    pending.append(Followed(stream, sid_text, stream in records, doc))
                if len(entries) == PAGE:
                    ms = StreamId.parse(last[stream]).ms
                    horizon = ms if horizon is None else min(horizon, ms)
        if woken and pending:
            continue  # the rest of that commit is on the other streams: read them (without waiting) first
        cut = None if horizon is None else horizon - HOLD_MARGIN_MS
        ready = [e for e in pending if cut is None or e.ms < cut]
        pending = [e for e in pending if not (cut is None or e.ms < cut)]
        for entry in commit_order(ready):
            if wanted_class is not None:
                if entry.is_record:
                    host = entry.data.get("host")
                    if isinstance(host, str) and host:
                        hosts[str(entry.data.get("runId"))] = host
                    continue
                if entry.data.get("errorClass") != wanted_class or entry.data.get("type") not in ("error", "warning"):
                    continue
            if args.json:
                line = orjson.dumps(entry.data).decode()
            else:
                line = (record_line(entry.data) if entry.is_record
                        else event_line(entry.data, hosts.get(str(entry.data.get("runId")))))
            print(line, file=out, flush=True)
            printed += 1
            if args.count and printed >= args.count:
                return 0
        if got == 0 and not pending:
            if args.no_follow:
                return 0
            if block is None:
                stopping.wait(POLL_INTERVAL_S)
    return 0


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    if not settings.redis_url:
        raise ConfigError("no broker configured: set GOOSE_INGEST_REDIS_URL (as `goose-ingest up` prints)")
    if args.count is not None and args.count < 1:
        raise ConfigError("--count must be at least 1")
    if args.error_class and args.type not in (None, "error", "warning"):
        raise ConfigError(f"--class selects error and warning events, not --type {args.type}")
    # SIGINT (Ctrl-C) and SIGTERM end the follow after the read in progress, exit 0. A flag, not
    # KeyboardInterrupt thrown wherever the signal lands (inside the broker client's read, whose
    # cleanup then runs under it); a second signal interrupts at once.
    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return follow(settings, args, stopping=stopping)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `tail | head`: the reader is gone, which is not an error
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
