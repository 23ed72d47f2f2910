"""The OTLP exporter's per-run export state as one run grows (issue 22 §3): flat past the caps.

For each size N, one run of N non-tool events (`agent`, with content capture off) and its
started/ended records go through the exporter's real handlers (`TraceExporter`, in this process)
in batches of GOOSE_INGEST_BATCH_SIZE against a real redis-server; the collector is a local OTLP
receiver. Reported per N:

- **fields** / **bytes**: HLEN and MEMORY USAGE of the run's state just before its root is read
  (the terminal record is fed last, so the whole run is in the state);
- **root read**: the Redis-side time (INFO commandstats, µs) of the commands that read the state
  for the root (HMGET; HGETALL for a legacy state) -- what blocks Redis for everyone else;
- **note/batch**: the Redis-side time per batch of the note script (EVALSHA), mean.

    python bench/otlp_state.py [--sizes 1000,10000,50000,200000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402

from contracts.topics import TopicEntry  # noqa: E402
from services.broker.connect import async_client  # noqa: E402
from services.broker.embedded import start_redis  # noqa: E402
from services.export.otlp.mapping import MappingConfig  # noqa: E402
from services.export.otlp.processor import TraceExporter  # noqa: E402
from services.export.otlp.sink import HttpSink  # noqa: E402
from services.settings import Settings  # noqa: E402
from tests.support.otlp_receiver import RunningReceiver  # noqa: E402

BASE_S = 1_764_000_000


def ts(sec: float) -> str:
    whole = int(sec)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((sec - whole) * 1000):03d}Z"


def fields_of(run: str, seq: int) -> dict[bytes, bytes]:
    e = {"eventId": f"{run}:{seq}", "runId": run, "seq": seq, "type": "agent", "timestamp": ts(BASE_S + seq / 1000),
         "lines": [seq, seq], "message": "thinking about the next step " * 3}
    return TopicEntry.of_event(e).to_fields()


def record_fields(run: str, k: int, state: str, n: int) -> dict[bytes, bytes]:
    rec = {"recordId": f"{run}:run:{k}", "runId": run, "seq": k, "state": state, "timestamp": ts(BASE_S + k),
           "counts": {"agent": n} if state == "ended" else {}}
    return TopicEntry.of_record(rec).to_fields()


def cmdstat(r: redis.Redis, name: str) -> tuple[int, int]:
    """(calls, usec) of a command since the last CONFIG RESETSTAT."""
    stats = r.info("commandstats").get(f"cmdstat_{name}") or {}
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


async def one(url: str, endpoint: str, n: int) -> dict[str, float]:
    settings = Settings(redis_url=url, namespace=f"b{uuid.uuid4().hex[:8]}", shards=1)
    r = redis.Redis.from_url(url)
    exporter = TraceExporter(settings, async_client(settings), HttpSink(OTLPSpanExporter(endpoint=endpoint)),
                             MappingConfig(), consumer="bench")
    run = "bench/long-run"
    events, runs = settings.layout.events_partition(0), settings.layout.runs_partition(0)
    await exporter.handle_runs(runs, ["0-1"], [record_fields(run, 0, "started", 0)])
    r.config_resetstat()
    batch = settings.batch_size
    for start in range(0, n, batch):
        seqs = range(start, min(n, start + batch))
        await exporter.handle_events(events, [f"{s + 1}-0" for s in seqs], [fields_of(run, s) for s in seqs])
    note_calls, note_usec = cmdstat(r, "evalsha")
    key = exporter.state_key(run)
    hlen, mem = r.hlen(key), r.memory_usage(key) or 0
    r.config_resetstat()
    await exporter.handle_runs(runs, ["0-2"], [record_fields(run, 1, "ended", n)])
    hmget_calls, hmget_usec = cmdstat(r, "hmget")
    _, hgetall_usec = cmdstat(r, "hgetall")
    done = r.hget(key, "done")
    await exporter.client.aclose()
    assert done == b"ended", f"root not exported for N={n}"
    return {"n": n, "fields": hlen, "bytes": mem, "read_us": hmget_usec + hgetall_usec, "hmget_calls": hmget_calls,
            "note_us": note_usec / max(1, note_calls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000,200000")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    srv = start_redis()
    try:
        with RunningReceiver() as rx:
            rx.keep = False
            print(f"{'events':>8} {'fields':>7} {'bytes':>9} {'root read µs':>13} {'note µs/batch':>14}")
            for n in sizes:
                row = asyncio.run(one(srv.url, rx.endpoint, n))
                print(f"{row['n']:>8} {row['fields']:>7} {row['bytes']:>9} {row['read_us']:>13} {row['note_us']:>14.0f}",
                      flush=True)
    finally:
        srv.close()


if __name__ == "__main__":
    main()
