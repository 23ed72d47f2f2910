"""PostgreSQL sink throughput against a plain COPY of the same rows, measured in the same run.

Builds N harness events shaped like the pipeline's (command, read, write, agent text, errors; ~300
bytes of JSON each) as `harness.events` topic entries, then, interleaving the variants over
several rounds on a throw-away database:

- floor (bare): one `COPY ... FROM STDIN` of the same typed rows (already parsed) into a plain table with
  the same columns (no key, no index, no partition), one transaction per batch;
- table_floor: a plain COPY of the same rows into the sink's own `events` table (its partitions, key
  and generated columns): the database's own cost of exactly these rows, without the sink's parsing,
  de-duplication and bookkeeping;
- write: the sink's write path per batch: parse the entries (rows.py) and `Store.write` (COPY into the
  partitioned `events` with its key and indexes, positions, one transaction);
- sink: the whole sink (`Sink.run`, reader and writer threads) on a real Redis: XREADGROUP, parse,
  write, XACK, from the first read to the last row committed.

Prints events/s of each and the ratios to both floors (target: sink >= 0.5 of the floor).

    python bench/postgres_sink.py [--events 20000] [--batch 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.topics import EVENT, TopicEntry  # noqa: E402
from services.export.postgres.rows import EntryRef, parse_topic_batch  # noqa: E402
from services.export.postgres.store import Store  # noqa: E402

ADMIN_DSN = os.environ.get("GOOSE_INGEST_TEST_PG_ADMIN_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
HORIZON = "2000-01-01T00:00:00.000Z"


def make_entries(n: int, tag: str) -> list[tuple[str, str, dict[bytes, bytes]]]:
    out = []
    for i in range(n):
        run = f"bench-{tag}/{i // 40}"
        seq = i % 40
        ts = f"2026-11-30T{10 + (i // 360000) % 10:02d}:{(i // 6000) % 60:02d}:{(i // 100) % 60:02d}.{i % 1000:03d}Z"
        base = {"eventId": f"{run}:{seq}", "runId": run, "seq": seq, "timestamp": ts, "lines": [seq, seq]}
        kind = i % 5
        if kind == 0:
            doc = base | {"type": "command", "command": f"pytest -q tests/test_module_{i % 97}.py -k case_{i % 13}",
                          "tool": "developer__shell", "toolCallId": f"toolu_{i:012d}", "durationMs": 1000 + i % 5000,
                          "exitCode": i % 2, "isSuccess": i % 2 == 0}
        elif kind == 1:
            doc = base | {"type": "read", "path": f"/work/project/src/pkg/module_{i % 311}.py", "startLine": 1,
                          "endLine": 120, "tool": "developer__text_editor", "toolCallId": f"toolu_{i:012d}",
                          "durationMs": 12, "isSuccess": True}
        elif kind == 2:
            doc = base | {"type": "write", "path": f"/work/project/src/pkg/module_{i % 311}.py",
                          "tool": "developer__text_editor", "toolCallId": f"toolu_{i:012d}", "durationMs": 30,
                          "isSuccess": True}
        elif kind == 3:
            doc = base | {"type": "agent", "message": "I will now run the tests to check that the fix works. " * 3}
        else:
            doc = base | {"type": "warning", "message": "stderr: DeprecationWarning: pkg_resources is deprecated",
                          "code": "stderr"}
        out.append(("harness.events", f"{i + 1}-0", TopicEntry.of_event(doc).to_fields()))
    return out


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


FLOOR_COLUMNS = ("event_id", "run_key", "seq", "type", "ts", "tool", "tool_call_id", "success", "exit_code", "path",
                 "command", "duration_ms", "code", "data")


def floor_rows(entries: list) -> list[tuple]:
    """The rows of the events table (every column), computed before the clock starts."""
    out = []
    for _, _, fields in entries:
        entry = TopicEntry.from_fields(fields, EVENT)
        doc = entry.document()
        out.append((doc["eventId"], doc["runId"], doc["seq"], doc["type"], doc["timestamp"], doc.get("tool"),
                    doc.get("toolCallId"), doc.get("isSuccess"), doc.get("exitCode"), doc.get("path"),
                    doc.get("command"), doc.get("durationMs"), doc.get("code"), (entry.data or b"").decode()))
    return out


def run_floor(dsn: str, entries: list, batch: int) -> float:
    """A plain COPY of the same rows (all columns, psycopg's write_row) into a table without key or index."""
    rows = floor_rows(entries)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS floor_events")
        conn.execute("CREATE TABLE floor_events (event_id text, run_key text, seq integer, type text, ts timestamptz, "
                     "tool text, tool_call_id text, success boolean, exit_code integer, path text, command text, "
                     "duration_ms bigint, code text, data jsonb) WITH (autovacuum_enabled = false)")
        cols = sql.SQL(", ").join(map(sql.Identifier, FLOOR_COLUMNS))
        stmt = sql.SQL("COPY floor_events ({}) FROM STDIN").format(cols)
        started = time.perf_counter()
        for chunk in batches(rows, batch):
            with conn.transaction(), conn.cursor() as cur, cur.copy(stmt) as copy:
                for values in chunk:
                    copy.write_row(values)
        return len(rows) / (time.perf_counter() - started)


def run_table_floor(dsn: str, entries: list, batch: int) -> float:
    """A plain COPY of the same rows into the sink's own `events` table (same partitions, key and
    generated columns): what PostgreSQL itself charges for these rows, with no parsing, no
    de-duplication, no positions. Rows are built (psycopg's write_row of the two sent columns)
    before nothing else: the same COPY text the sink sends."""
    rows = [(r.ts, r.data.decode()) for r in parse_topic_batch(entries, [], HORIZON).events]
    Store(dsn).ensure_partitions({"2026-11"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        for chunk in batches(rows, batch):
            with conn.transaction(), conn.cursor() as cur, cur.copy("COPY events (ts, data) FROM STDIN") as copy:
                for values in chunk:
                    copy.write_row(values)
        return len(rows) / (time.perf_counter() - started)


def run_write(dsn: str, entries: list, batch: int) -> float:
    store = Store(dsn)
    store.ensure_partitions({"2026-11"})
    started = time.perf_counter()
    for chunk in batches(entries, batch):
        parsed = parse_topic_batch(chunk, [], HORIZON)
        store.write(parsed.events, [], [EntryRef(s, i) for s, i, _ in chunk])
    rate = len(entries) / (time.perf_counter() - started)
    store.close()
    return rate


def run_sink(dsn: str, redis_url: str, entries: list, batch: int) -> float:
    from services.broker.connect import sync_client
    from services.export.postgres.metrics import SinkMetrics
    from services.export.postgres.sink import Sink, SinkOptions
    from services.settings import Settings

    settings = Settings(redis_url=redis_url, namespace=f"bench{uuid.uuid4().hex[:8]}", shards=1)
    client = sync_client(settings)
    stream = settings.layout.events_partitions()[0]
    pipe = client.pipeline(transaction=False)
    for _, _, fields in entries:
        pipe.xadd(stream, fields)
    pipe.execute()
    store = Store(dsn)
    opts = SinkOptions(group="bench", consumer="bench", retention=timedelta(days=36500), batch_size=batch,
                       block_ms=10, claim_idle_ms=60_000, sweep_interval_s=3600)
    metrics = SinkMetrics()
    sink = Sink(settings, client, store, opts, metrics)
    sink.ensure_groups()
    store.ensure_partitions({"2026-11"})
    sink._setup()  # migrations check and partition maintenance happen once at start, not per batch
    sink._last_sweep = time.monotonic()  # measure reads and writes only
    started = time.perf_counter()
    thread = threading.Thread(target=sink.run)
    thread.start()
    labels = {"table": "events", "outcome": "inserted"}
    while (metrics.registry.get_sample_value("goose_ingest_postgres_rows_total", labels) or 0) < len(entries):
        time.sleep(0.005)
    rate = len(entries) / (time.perf_counter() - started)
    sink.stop()
    thread.join()
    keys = client.keys(f"{settings.namespace}:*")
    if keys:
        client.delete(*keys)
    store.close()
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()

    name = f"goose_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    redis_server = None
    try:
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            from services.broker.embedded import start_redis

            redis_server = start_redis()
            redis_url = redis_server.url
        results: dict[str, list[float]] = {"floor": [], "table_floor": [], "write": [], "sink": []}
        for r in range(args.rounds):
            # A schema per variant and round: every variant writes into empty tables.
            order = ["floor", "table_floor", "write", "sink"]
            for variant in order[r % 4:] + order[:r % 4]:  # rotate so no variant always runs first
                schema = f"{variant}_{r}"
                base = make_conninfo(ADMIN_DSN, dbname=name)
                with psycopg.connect(base, autocommit=True) as conn:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                dsn = make_conninfo(base, options=f"-csearch_path={schema}")
                store = Store(dsn)
                store.migrate()
                store.ensure_partitions({"2026-11"})
                # No autovacuum on the bench's tables: an ANALYZE started by the previous variant's
                # inserts would run beside the next variant and charge it for CPU it did not use.
                store.connect().execute("ALTER TABLE events_p202611 SET (autovacuum_enabled = false)")
                store.close()
                entries = make_entries(args.events, f"{variant}{r}")
                if variant == "floor":
                    results[variant].append(run_floor(dsn, entries, args.batch))
                elif variant == "table_floor":
                    results[variant].append(run_table_floor(dsn, entries, args.batch))
                elif variant == "write":
                    results[variant].append(run_write(dsn, entries, args.batch))
                else:
                    results[variant].append(run_sink(dsn, redis_url, entries, args.batch))
        # Other processes share these 2 cores and the CPU speed drifts: compare within a round
        # (the variants run back to back), then take the median of the per-round ratios.
        print(f"events={args.events} batch={args.batch} rounds={args.rounds}")
        for floor in ("floor", "table_floor"):
            print(f"-- ratios to {floor}")
            for variant in ("floor", "table_floor", "write", "sink"):
                ratios = [v / f for v, f in zip(results[variant], results[floor], strict=True)]
                print(f"{variant:11s} median {statistics.median(results[variant]):8.0f} events/s   ratio: median "
                      f"{statistics.median(ratios):.2f}  per round {' '.join(f'{x:.2f}' for x in ratios)}")
        for floor in ("floor", "table_floor"):
            ratio = statistics.median(v / f for v, f in zip(results["sink"], results[floor], strict=True))
            print(f"target sink/{floor} >= 0.5: {'met' if ratio >= 0.5 else 'NOT met'} ({ratio:.2f})")
    finally:
        if redis_server is not None:
            redis_server.close()
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
