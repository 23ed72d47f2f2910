"""`goose-ingest tail [--type TYPE] [--run RUN]`: follow harness events (and run records)."""

from __future__ import annotations

import argparse
import sys

import orjson

from contracts.events import EVENT_TYPES
from services.broker.connect import sync_client
from services.settings import Settings
from services.tail.format import event_line, record_line


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tail", help="follow harness events and run records, printed for a human")
    p.add_argument("--type", choices=EVENT_TYPES, help="only this event type (reads its own topic)")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--from-start", action="store_true", help="print what the topics already hold first")
    p.add_argument("--json", action="store_true", help="print the events as JSON lines")
    p.add_argument("--no-runs", action="store_true", help="leave out run lifecycle records")
    p.add_argument("--count", type=int, help="stop after this many lines")
    p.add_argument("--no-follow", action="store_true", help="print what the topics hold now and exit")
    p.set_defaults(func=run)


def follow(settings: Settings, args: argparse.Namespace, out=sys.stdout) -> int:
    client = sync_client(settings)
    topic = settings.topic_for(args.type) if args.type else settings.all_events_topic()
    streams = {topic: "0-0" if args.from_start else "$"}
    if not args.no_runs and not args.type:
        streams[settings.runs_stream()] = "0-0" if args.from_start else "$"
    printed = 0
    while True:
        reply = client.xread(streams, block=None if args.no_follow else 1000, count=500)
        if not reply and args.no_follow:
            return 0
        for stream, entries in reply or []:
            name = stream.decode()
            for sid, fields in entries:
                streams[name] = sid.decode()
                if args.run and fields.get(b"runId", b"").decode() != args.run:
                    continue
                data = orjson.loads(fields[b"data"])
                if args.json:
                    line = orjson.dumps(data).decode()
                elif name == settings.runs_stream():
                    line = record_line(data)
                else:
                    line = event_line(data)
                print(line, file=out, flush=True)
                printed += 1
                if args.count and printed >= args.count:
                    return 0


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    if not settings.redis_url:
        print("goose-ingest tail: set GOOSE_INGEST_REDIS_URL (as `goose-ingest up` prints)", file=sys.stderr)
        return 2
    try:
        return follow(settings, args)
    except KeyboardInterrupt:
        return 0
