"""The pipeline on a real Redis Cluster (3 primaries + 3 replicas): end to end with a kill -9,
no cross-slot command anywhere, replay, tail, import-sessions and retention.

The single-node versions of these scenarios live in test_worker_e2e.py, test_worker_resilience.py,
test_commands_live.py and test_import_sessions.py; these run the same checks through the cluster
layout (hash tag per shard, topics partitioned by shard) with the same helpers.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from contracts.events import EVENT_TYPES
from services.broker.connect import sync_client
from services.tap.publisher import Publisher
from services.worker.housekeeping import RETENTION_EVERY_S
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import (
    REPO,
    ended_runs,
    events_by_run,
    expected_events,
    start_worker,
    stop,
    topic,
    wait_until,
)
from tests.support.redis_cluster import MonitorRecorder, cross_slot_violations
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e


def publish_runs(settings, runs: dict[str, list[bytes]], delay_s: float = 0.0) -> None:
    """Each run from its own thread (interleaved, like concurrent taps)."""

    def publish(run: str, lines: list[bytes]) -> None:
        with Publisher(settings, run, {"host": "cluster"}) as pub:
            for line in lines:
                pub.add_line(line, "stdout")
                if delay_s:
                    time.sleep(delay_s)
            pub.add_eof(0)

    threads = [threading.Thread(target=publish, args=item) for item in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def transcripts(prefix: str, copies: int) -> dict[str, list[bytes]]:
    return {f"{prefix}/{i}/{p.stem}": p.read_bytes().splitlines() for i in range(copies) for p in TRANSCRIPTS}


def assert_exact(settings, runs: set[str]) -> None:
    """Every run's events == one normalizer pass over its raw entries; partitions consistent; all acked."""
    published = events_by_run(settings)
    assert set(published) == runs
    for run in runs:
        got = published[run]
        assert [e["eventId"] for e in got] == [f"{run}:{n}" for n in range(len(got))], "gap or duplicate"
        assert got == expected_events(settings, run)
    layout = settings.layout
    per_type = {t: len(topic(settings, layout.type_partitions(t))) for t in EVENT_TYPES}
    assert {t: n for t, n in per_type.items() if n} == dict(
        Counter(e["type"] for v in published.values() for e in v))
    states = Counter((r["runId"], r["state"]) for r in topic(settings, layout.runs_partitions()))
    for run in runs:
        assert states[(run, "started")] == 1 and states[(run, "ended")] == 1
    # a run's events all sit in its own shard's partition
    r = sync_client(settings)
    for shard in range(layout.shards):
        for _, fields in r.xrange(layout.events_partition(shard)):
            assert layout.shard_of(fields[b"runId"].decode()) == shard
    assert sum(r.xpending(s, settings.group)["pending"] for s in layout.raw_streams()) == 0


def error_counts(cluster) -> dict[str, int]:
    """`INFO errorstats` summed over the live nodes: error replies by their prefix (CROSSSLOT, ERR...)."""
    total: Counter[str] = Counter()
    for node in cluster.live_nodes():
        stats = cluster.client(node.port).info("errorstats")
        for name, value in stats.items():
            total[name] += int(value["count"]) if isinstance(value, dict) else 0
    return dict(total)


def test_e2e_on_a_cluster_with_a_kill_9_and_no_cross_slot_command(redis_cluster, cluster_settings, tmp_path):
    s = cluster_settings
    runs = transcripts("c-e2e", 3)
    log = tmp_path / "workers.log"
    errors_before = error_counts(redis_cluster)
    recorder = MonitorRecorder(redis_cluster)
    workers = [start_worker(s, log, GOOSE_INGEST_REDIS_CLUSTER="true") for _ in range(3)]
    try:
        publisher = threading.Thread(target=publish_runs, args=(s, runs, 0.002))
        publisher.start()
        time.sleep(1.5)
        workers[0].send_signal(signal.SIGKILL)  # mid-stream: its pending entries must be reclaimed
        workers[0].wait()
        workers.append(start_worker(s, log, GOOSE_INGEST_REDIS_CLUSTER="true"))
        publisher.join()
        wait_until(lambda: ended_runs(s) >= set(runs), timeout=120)
    finally:
        for w in workers:
            stop(w)
        commands = recorder.stop()
    assert_exact(s, set(runs))
    names = Counter(c.args[0].upper() for c in commands if c.args)
    # the recording saw the real traffic: reads, the commit script, and what it ran inside
    assert names[b"XREADGROUP"] and names[b"EVALSHA"] and names[b"XADD"] and names[b"XACK"], names.most_common(12)
    assert any(c.source == "lua" for c in commands)
    assert cross_slot_violations(redis_cluster, commands) == []
    errors_after = error_counts(redis_cluster)
    assert errors_after.get("errorstat_CROSSSLOT", 0) == errors_before.get("errorstat_CROSSSLOT", 0)


def test_replay_and_tail_read_every_partition_of_a_cluster(redis_cluster, cluster_settings, tmp_path):
    s = cluster_settings
    runs = transcripts("c-replay", 1)
    worker = start_worker(s, tmp_path / "w.log", GOOSE_INGEST_REDIS_CLUSTER="true")
    try:
        publish_runs(s, runs)
        wait_until(lambda: ended_runs(s) >= set(runs), timeout=90)
    finally:
        stop(worker)
    assert len({s.layout.shard_of(r) for r in runs}) > 1  # the runs really span partitions
    recorder = MonitorRecorder(redis_cluster)  # replay and tail must not issue a cross-slot command either
    replay = subprocess.run([sys.executable, "-m", "services.cli", "replay"], cwd=REPO, env=cli_env(s),
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert re.search(r"\b0 differ", replay.stdout + replay.stderr), replay.stdout + replay.stderr

    tail = subprocess.run([sys.executable, "-m", "services.cli", "tail", "--from-start", "--no-follow", "--json"],
                          cwd=REPO, env=cli_env(s), capture_output=True, text=True, timeout=60)
    assert tail.returncode == 0, tail.stderr
    import orjson

    commands = recorder.stop()
    assert any(c.args and c.args[0].upper() in (b"XRANGE", b"XREAD", b"XREVRANGE") for c in commands)
    assert cross_slot_violations(redis_cluster, commands) == []
    tailed = [orjson.loads(line) for line in tail.stdout.splitlines() if line.startswith("{")]
    event_ids = {e["eventId"] for e in tailed if "eventId" in e}
    assert event_ids == {e["eventId"] for v in events_by_run(s).values() for e in v}


def test_import_sessions_on_a_cluster(cluster_settings, fixture_db, tmp_path):
    s = cluster_settings
    ns = "laptop"
    res = subprocess.run([sys.executable, "-m", "services.cli", "import-sessions", str(fixture_db), "--namespace", ns,
                          "--no-progress", "--now", "2030-01-01T00:00:00Z"],
                         cwd=REPO, env=cli_env(s), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    conn = sqlite3.connect(fixture_db)
    sid = conn.execute("SELECT id FROM sessions ORDER BY id LIMIT 1").fetchone()[0]
    conn.close()
    run = f"{ns}/{sid}"
    r = sync_client(s)
    raw_before = sum(r.xlen(x) for x in s.layout.raw_streams())
    assert raw_before > 0
    worker = start_worker(s, tmp_path / "w.log", GOOSE_INGEST_REDIS_CLUSTER="true")
    try:
        wait_until(lambda: run in ended_runs(s), timeout=90)
    finally:
        stop(worker)
    assert events_by_run(s)[run] == expected_events(s, run)
    checkpoint = s.layout.import_checkpoint(run)
    assert sync_client(s).exists(checkpoint)  # in the run's shard slot, written by the import
    again = subprocess.run([sys.executable, "-m", "services.cli", "import-sessions", str(fixture_db), "--namespace",
                            ns, "--no-progress", "--now", "2030-01-01T00:00:00Z"],
                           cwd=REPO, env=cli_env(s), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert sum(r.xlen(x) for x in s.layout.raw_streams()) == raw_before  # a re-import publishes nothing


def test_retention_on_a_cluster_never_trims_uncommitted_entries(cluster_settings, tmp_path):
    """Raw retention ~0.4 s: committed entries go, entries pending at a dead consumer stay."""
    s = cluster_settings
    r = sync_client(s)
    layout = s.layout
    for stream in layout.raw_streams():
        r.xgroup_create(stream, s.group, id="0", mkstream=True)
    keep = "keep/pending"
    with Publisher(s, keep, {"host": "t"}) as pub:
        for i in range(5):
            pub.add_line(f'{{"type":"message","n":{i}}}', "stdout")
    stream = layout.raw_stream(layout.shard_of(keep))
    r.xreadgroup(s.group, "dead-consumer", {stream: ">"})  # read, never committed
    # ... by a worker that still holds the shard's lease (a live worker would take its entries over
    # as soon as it got the lease: services/worker/leases.py)
    r.set(layout.shard_lease(layout.shard_of(keep)), "dead-consumer", px=600_000)
    done = next(f"done/{i}" for i in range(1000) if layout.shard_of(f"done/{i}") != layout.shard_of(keep))
    # 300 entries: XTRIM MINID is approximate (whole stream nodes of 100 entries), a few would stay.
    lines = [b'{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"x"}]}}'] * 300
    env = {"GOOSE_INGEST_REDIS_CLUSTER": "true", "GOOSE_INGEST_RAW_RETENTION_HOURS": "0.0001",
           "GOOSE_INGEST_CLAIM_IDLE_MS": "600000"}
    worker = start_worker(s, tmp_path / "w.log", **env)
    try:
        publish_runs(s, {done: lines})
        wait_until(lambda: done in ended_runs(s), timeout=60)
        # Trimmed at a retention tick: the first one runs as the worker starts, possibly before the run
        # is committed; the next comes RETENTION_EVERY_S later, then one tick's work (a loaded 2-core
        # machine under pytest-xdist once took longer than a flat 90 s: the margin is a tick's own).
        deadline = time.monotonic() + 2 * RETENTION_EVERY_S + 30
        while not _committed_trimmed(s, done) and time.monotonic() < deadline:
            time.sleep(0.5)
        trimmed = _committed_trimmed(s, done)
    finally:
        stop(worker)
    assert trimmed, _why_not_trimmed(s, done, tmp_path / "w.log")
    assert r.xlen(stream) >= 5, "pending (uncommitted) entries were trimmed"
    assert r.xpending(stream, s.group)["pending"] == 5


def _why_not_trimmed(settings, run: str, log) -> str:
    """What a failure needs to be understood: the stream and group as the worker left them, the spread
    of the run's entry ids over milliseconds (MINID keeps a whole stream node), the worker's log tail."""
    r = sync_client(settings)
    stream = settings.layout.raw_stream(settings.layout.shard_of(run))
    ids = [i.decode() for i, f in r.xrange(stream) if f.get(b"run") == run.encode()]
    groups = [{k: v for k, v in g.items() if k in ("name", "pending", "last-delivered-id", "lag")}
              for g in r.xinfo_groups(stream)]
    ms = Counter(i.split("-")[0] for i in ids)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    return (f"{len(ids)} of the run's entries still on {stream}; groups {groups}; entries per ms (top 5) "
            f"{ms.most_common(5)}; redis now {r.time()}; worker log tail:\n{tail}")


def _committed_trimmed(settings, run: str) -> bool:
    """At least 200 of the run's 301 entries are gone (trimming drops whole stream nodes of 100)."""
    r = sync_client(settings)
    stream = settings.layout.raw_stream(settings.layout.shard_of(run))
    return sum(f.get(b"run") == run.encode() for _, f in r.xrange(stream)) <= 101
