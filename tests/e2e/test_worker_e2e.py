"""The service end to end: real worker processes on a real Redis, killed and restarted."""

from __future__ import annotations

import random
import signal
import threading
from collections import Counter

import pytest
import redis

from contracts import harness_event_adapter, run_record_adapter
from contracts.events import EVENT_TYPES
from services.replay.command import compare
from services.tap.publisher import Publisher
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import (
    ended_runs,
    events_by_run,
    expected_events,
    start_worker,
    stop,
    topic,
    wait_until,
)

pytestmark = pytest.mark.e2e


def _publish_runs(settings, copies: int) -> set[str]:
    """Every transcript `copies` times, as concurrent interleaved runs (one thread per run)."""
    runs: dict[str, list[bytes]] = {}
    for i in range(copies):
        for path in TRANSCRIPTS:
            runs[f"e2e/{i}/{path.stem}"] = path.read_bytes().splitlines()

    def publish(run: str, lines: list[bytes]) -> None:
        with Publisher(settings, run, {"host": "e2e"}) as pub:
            for line in lines:
                pub.add_line(line, "stdout")
            pub.add_eof(0)

    threads = [threading.Thread(target=publish, args=item) for item in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return set(runs)


def _assert_exact(settings, runs: set[str]) -> None:
    published = events_by_run(settings)
    assert set(published) == runs
    for run in runs:
        got = published[run]
        assert [e["eventId"] for e in got] == [f"{run}:{n}" for n in range(len(got))], "gap or duplicate"
        assert got == expected_events(settings, run)
    total = sum(len(v) for v in published.values())
    per_type = {t: len(topic(settings, settings.layout.type_partition(t, 0))) for t in EVENT_TYPES}
    assert sum(per_type.values()) == total
    assert {t: n for t, n in per_type.items() if n} == dict(Counter(e["type"] for v in published.values() for e in v))
    for event in (e for v in published.values() for e in v):
        harness_event_adapter.validate_python(event)
    records = topic(settings, settings.layout.runs_partition(0))
    for record in records:
        run_record_adapter.validate_python(record)
    states = Counter((r["runId"], r["state"]) for r in records)
    for run in runs:
        assert states[(run, "started")] == 1 and states[(run, "ended")] == 1
    # Every raw entry was acknowledged by the commit that consumed it.
    r = redis.Redis.from_url(settings.redis_url)
    assert sum(r.xpending(s, settings.group)["pending"] for s in settings.layout.raw_streams()) == 0


def test_three_workers_one_killed_one_restarted_nothing_lost_nothing_doubled(settings, tmp_path):
    log = tmp_path / "workers.log"
    workers = [start_worker(settings, log) for _ in range(3)]
    try:
        publisher = threading.Thread(target=lambda: runs.update(_publish_runs(settings, 4)))
        runs: set[str] = set()
        publisher.start()
        # Kill one worker mid-stream, without any chance to clean up.
        wait_until(lambda: len(topic(settings, settings.layout.events_partition(0))) > 20, timeout=60)
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        # Restart another one gracefully.
        stop(workers[1])
        workers[1] = start_worker(settings, log)
        publisher.join()
        wait_until(lambda: runs and ended_runs(settings) >= runs, timeout=120)
    finally:
        for w in workers:
            stop(w)
    _assert_exact(settings, runs)
    assert compare(settings) == 0


def test_entries_read_by_a_worker_that_died_before_acknowledging_are_reclaimed(settings, tmp_path):
    import redis as _redis

    from services.streams.groups import ensure_groups  # noqa: F401  (the worker creates them too)

    r = _redis.Redis.from_url(settings.redis_url)
    for stream in settings.layout.raw_streams():
        r.xgroup_create(stream, settings.group, id="0", mkstream=True)
    runs = _publish_runs(settings, 1)
    # A consumer reads everything and vanishes: all entries are pending on it.
    for stream in settings.layout.raw_streams():
        r.xreadgroup(settings.group, "dead-consumer", {stream: ">"}, count=100_000)
    assert sum(r.xpending(s, settings.group)["pending"] for s in settings.layout.raw_streams()) > 0
    worker = start_worker(settings, tmp_path / "w.log")
    try:
        wait_until(lambda: ended_runs(settings) >= runs, timeout=60)
    finally:
        stop(worker)
    _assert_exact(settings, runs)
    assert sum(r.xpending(s, settings.group)["pending"] for s in settings.layout.raw_streams()) == 0


def test_out_of_order_and_duplicated_delivery_gives_the_one_pass_events(settings, tmp_path):
    import redis as _redis

    from contracts.keys import shard_of

    rng = random.Random(7)
    r = _redis.Redis.from_url(settings.redis_url)
    runs = set()
    entries = []
    for path in TRANSCRIPTS:
        run = f"ooo/{path.stem}"
        runs.add(run)
        lines = path.read_bytes().splitlines()
        for seq, line in enumerate(lines):
            entries.append((run, {"run": run, "seq": seq, "ts": 1_790_000_000_000 + seq, "line": line}))
        entries.append((run, {"run": run, "seq": len(lines), "ts": 1_790_000_000_000 + len(lines), "kind": "eof"}))
    dupes = rng.sample(entries, len(entries) // 4)
    shuffled = entries + dupes
    rng.shuffle(shuffled)
    for run, fields in shuffled:
        r.xadd(settings.layout.raw_stream(shard_of(run, settings.shards)), fields)
    workers = [start_worker(settings, tmp_path / "w.log", GOOSE_INGEST_BATCH_SIZE="7") for _ in range(2)]
    try:
        wait_until(lambda: ended_runs(settings) >= runs, timeout=60)
    finally:
        for w in workers:
            stop(w)
    _assert_exact(settings, runs)
