"""Held (out-of-order) entries: one run with 10,000 entries that arrive before its first one.

Each held entry is stored as one field of the run's state hash (services/worker/commit.py), so a
commit writes what arrived, not everything held so far. This measures it, in one run, against a
floor: the same run's entries arriving in order, through the same in-process BatchProcessor
(real commit.lua on a private redis-server, batches of 500 as the worker reads them).

Figures: seconds and µs per entry; bytes Redis received (INFO stats total_net_input_bytes) per
entry, i.e. what the commits wrote; the largest run state (`s` field) seen. Variants interleave
(floor, held, floor, held, ...) because the CPU speed here drifts.

    python bench/held_entries.py [--held 10000] [--rounds 2] [--batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from contracts.topics import RECORD, TopicEntry  # noqa: E402
from services.broker.connect import async_client  # noqa: E402
from services.broker.embedded import start_redis  # noqa: E402
from services.sequencer import Entry  # noqa: E402
from services.settings import Settings  # noqa: E402
from services.streams.groups import ensure_groups  # noqa: E402
from services.worker.commit import encode_held  # noqa: E402
from services.worker.processor import BatchProcessor  # noqa: E402
from tests.support.fixtures import TRANSCRIPTS, transcript_lines  # noqa: E402


@dataclass
class Figures:
    seconds: float
    entries: int
    bytes_in: int
    max_state: int
    max_held_fields: int

    @property
    def us_per_entry(self) -> float:
        return self.seconds / self.entries * 1e6

    @property
    def bytes_per_entry(self) -> float:
        return self.bytes_in / self.entries


def corpus(n: int) -> list[str]:
    lines = [ln for path in TRANSCRIPTS for ln in transcript_lines(path) if ln.strip()]
    if not lines:
        raise SystemExit("no transcripts found (GOOSE_INGEST_SHARED / ../shared/fixtures/goose)")
    return [lines[i % len(lines)] for i in range(n)]


def publish(client: redis.Redis, stream: str, run: str, lines: list[str], order: list[int]) -> None:
    pipe = client.pipeline(transaction=False)
    for seq in order:
        if seq == len(lines):
            entry = Entry.of_eof(run, seq, 1_790_000_000_000 + seq, 0, host="bench")
        else:
            entry = Entry.of_line(run, seq, 1_790_000_000_000 + seq, lines[seq], host="bench")
        pipe.xadd(stream, entry.to_fields())
    pipe.execute()


def net_in(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_input_bytes"])


async def consume(settings: Settings, sync: redis.Redis, run: str, batch: int) -> Figures:
    layout = settings.layout
    stream = layout.raw_stream(0)
    key = layout.run_state(run)
    client = async_client(settings)
    try:
        await ensure_groups(client, settings)
        processor = BatchProcessor(settings, client)
        seconds = 0.0
        entries = 0
        bytes_in = 0
        max_state = 0
        max_fields = 0
        while True:
            reply = sync.xreadgroup(settings.group, "bench", {stream: ">"}, count=batch)
            if not reply:
                break
            items = reply[0][1]
            before = net_in(sync)
            t0 = time.perf_counter()
            await processor.process(0, [i for i, _ in items], [f for _, f in items])
            seconds += time.perf_counter() - t0
            bytes_in += net_in(sync) - before
            entries += len(items)
            max_state = max(max_state, sync.hstrlen(key, "s"))
            max_fields = max(max_fields, sync.hlen(key) - 2)
        return Figures(seconds, entries, bytes_in, max_state, max_fields)
    finally:
        await client.aclose()


def variant(url: str, lines: list[str], held: bool, batch: int) -> Figures:
    settings = Settings(redis_url=url, namespace=f"bench{uuid.uuid4().hex[:8]}", shards=1)
    sync = redis.Redis.from_url(url)
    run = "bench/held" if held else "bench/in-order"
    n = len(lines)
    order = [*range(1, n + 1), 0] if held else list(range(n + 1))  # held: seq 0 last, eof among the held
    publish(sync, settings.layout.raw_stream(0), run, lines, order)
    figures = asyncio.run(consume(settings, sync, run, batch))
    ended = [f for _, f in sync.xrange(settings.layout.runs_partition(0)) if TopicEntry.from_fields(f, RECORD).label == "ended"]
    if len(ended) != 1:
        raise SystemExit(f"{run}: the run did not end ({len(ended)} ended records)")
    for key in sync.scan_iter(match=f"{settings.namespace}:*", count=1000):
        sync.delete(key)
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--held", type=int, default=10_000, help="entries of the run held before its first one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=500, help="entries per read, as BATCH_SIZE")
    args = ap.parse_args()
    lines = corpus(args.held)
    server = start_redis()
    try:
        floors: list[Figures] = []
        helds: list[Figures] = []
        for _ in range(args.rounds):
            floors.append(variant(server.url, lines, held=False, batch=args.batch))
            helds.append(variant(server.url, lines, held=True, batch=args.batch))
        floors.append(variant(server.url, lines, held=False, batch=args.batch))
    finally:
        server.close()
    floor_us = statistics.median(f.us_per_entry for f in floors)
    held_us = statistics.median(f.us_per_entry for f in helds)
    floor_b = statistics.median(f.bytes_per_entry for f in floors)
    held_b = statistics.median(f.bytes_per_entry for f in helds)
    size = sum(len(ln.encode()) for ln in lines)
    print(f"one run of {args.held:,} lines ({size / 1e6:.1f} MB of input), batches of {args.batch}")
    for name, figs in (("in order (floor)", floors), ("held, first entry last", helds)):
        for f in figs:
            print(f"  {name:24}: {f.seconds:6.2f} s  {f.us_per_entry:7.1f} µs/entry  "
                  f"{f.bytes_per_entry:8.0f} B to Redis/entry  largest state {f.max_state:,} B  "
                  f"held fields up to {f.max_held_fields:,}")
    # What a state holding its entries inline would have sent: every commit rewrites all held so far.
    held_json = [len(encode_held(Entry.of_line("bench/held", i + 1, 1_790_000_000_000, ln, host="bench", sid="1-0")))
                 for i, ln in enumerate(lines)]
    inline = sum(sum(held_json[:end]) for end in range(args.batch, args.held + 1, args.batch)) / args.held
    print(f"held / in order: time {held_us / floor_us:.2f}x, bytes written {held_b / floor_b:.2f}x; "
          f"held entries each written once ({held_b:,.0f} B/entry) where a state rewritten whole on every commit "
          f"would send ~{inline:,.0f} B/entry (and grow with the hold)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
