"""`goose-ingest up` (embedded broker + worker) and `goose-ingest demo` (fixtures through it)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from services.broker.connect import sync_client
from services.settings import Settings

DEFAULT_FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "goose"


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start a broker (embedded redis-server unless one is configured) and a worker")
    up.set_defaults(func=run_up)
    demo = sub.add_parser("demo", help="push goose transcripts through a live pipeline and show the events")
    demo.add_argument("files", nargs="*", help="transcripts (default: the shared fixtures)")
    demo.add_argument("--timeout", type=float, default=60.0)
    demo.set_defaults(func=run_demo)


def _broker(settings: Settings):
    """(settings with a URL, the embedded server or None)."""
    if settings.redis_url:
        return settings, None
    from services.broker.embedded import start_redis

    server = start_redis()
    return settings.model_copy(update={"redis_url": server.url}), server


def run_up(args: argparse.Namespace) -> int:
    from services.worker.command import configure_logging, serve_worker

    configure_logging("INFO")
    settings, server = _broker(Settings())
    if server is not None:
        print(f"goose-ingest: embedded redis-server at {server.url}\n"
              f"  in another shell: export GOOSE_INGEST_REDIS_URL={server.url}\n"
              f"  then: goose-ingest tap -- goose run --output-format stream-json ...   and   goose-ingest tail",
              file=sys.stderr, flush=True)
    try:
        return asyncio.run(serve_worker(settings))
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            server.stop()


def _wait_for_runs(settings: Settings, runs: set[str], timeout: float) -> bool:
    client = sync_client(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = {
            f[b"runId"].decode()
            for _, f in client.xrange(settings.runs_stream())
            if f[b"state"] in (b"ended", b"abandoned")
        }
        if runs <= ended:
            return True
        time.sleep(0.2)
    return False


def run_demo(args: argparse.Namespace) -> int:
    from services.tail.format import event_line, record_line
    from services.tap.publisher import Publisher

    files = [Path(f) for f in args.files] or sorted(DEFAULT_FIXTURES.glob("*.jsonl"))
    if not files:
        print(f"goose-ingest demo: no transcripts given and none in {DEFAULT_FIXTURES}", file=sys.stderr)
        return 2
    settings, server = _broker(Settings())
    env = dict(os.environ, GOOSE_INGEST_REDIS_URL=settings.redis_url, GOOSE_INGEST_METRICS_PORT="0",
               GOOSE_INGEST_SHARDS=str(settings.shards))
    worker = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "--log-level", "WARNING"], env=env)
    try:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        runs = set()
        for path in files:
            run = f"demo/{stamp}/{path.stem}"[:200]
            runs.add(run)
            with Publisher(settings, run, {"host": "demo"}) as pub:
                for raw in path.read_bytes().splitlines():
                    pub.add_line(raw, "stdout")
                pub.add_eof(0)
        if not _wait_for_runs(settings, runs, args.timeout):
            print("goose-ingest demo: timed out waiting for the worker", file=sys.stderr)
            return 1
        client = sync_client(settings)
        for run in sorted(runs):
            for _, f in client.xrange(settings.all_events_topic()):
                if f[b"runId"].decode() == run:
                    print(event_line(orjson.loads(f[b"data"])))
            for _, f in client.xrange(settings.runs_stream()):
                if f[b"runId"].decode() == run:
                    print(record_line(orjson.loads(f[b"data"])))
            print()
        print(f"goose-ingest demo: {len(runs)} runs normalized by a live worker on {'an embedded' if server else 'the configured'} broker")
        return 0
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
        if server is not None:
            server.stop()
