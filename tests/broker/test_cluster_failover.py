"""A primary SIGKILLed mid-stream: its replica is promoted, taps and workers reconnect and carry on,
every run ends with exactly its events, and a consumer deduplicating by eventId sees each once.

Own cluster (3 primaries + 3 replicas, node timeout 2 s), real `goose-ingest tap` and `worker`
processes with default worker settings. The taps run with GOOSE_INGEST_REDIS_WAIT_REPLICAS=1: a
batch counts as sent only once a replica has it, which closes the one window in which a failover
loses data (docs/scaling.md, "What a failover can lose").
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import redis
from redis.crc import key_slot

from contracts.topics import TopicEntry
from services.broker.connect import sync_client
from services.settings import Settings
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import REPO, ended_runs, events_by_run, expected_events, raw_entries, stop, wait_until
from tests.support.redis_cluster import start_cluster
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

LINE_DELAY_S = 0.08  # the taps print slowly (13-41 lines: 1-3.3 s), so the kill at 1.5 s lands mid-stream
# Worker defaults, spelled out: pipeline_helpers.start_worker shortens them for other tests.
DEFAULT_WORKER_ENV = {"GOOSE_INGEST_CLAIM_IDLE_MS": "30000", "GOOSE_INGEST_SWEEP_INTERVAL_S": "5",
                      "GOOSE_INGEST_BATCH_SIZE": "500", "GOOSE_INGEST_METRICS_PORT": "0"}
SLOW_CAT = "import sys, time\nfor line in open(sys.argv[1], 'rb'):\n    sys.stdout.buffer.write(line); " \
           "sys.stdout.flush(); time.sleep(float(sys.argv[2]))\n"


class FollowingConsumer(threading.Thread):
    """Reads every partition of harness.events in one loop (XREAD per partition, never cross-slot),
    from the start, through the failover; keeps every entry it was given, duplicates included."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.seen: list[dict] = []
        self.errors = 0
        self.done = threading.Event()

    def run(self) -> None:
        client = sync_client(self.settings)
        last = {p: "0-0" for p in self.settings.layout.events_partitions()}
        while not self.done.is_set():
            for partition, after in last.items():
                try:
                    reply = client.xread({partition: after}, count=1000)
                except redis.RedisError:
                    self.errors += 1  # the partition's primary is being replaced: next round
                    continue
                for _stream, entries in reply:
                    for sid, fields in entries:
                        self.seen.append(TopicEntry.from_fields(fields).document())
                        last[partition] = sid.decode()
            time.sleep(0.1)


def tap(settings: Settings, run: str, path: Path, log: Path) -> subprocess.Popen:
    env = cli_env(settings, GOOSE_INGEST_REDIS_WAIT_REPLICAS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "tap", "--quiet", "--run", run, "--",
         sys.executable, "-c", SLOW_CAT, str(path), str(LINE_DELAY_S)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"),
    )


def worker(settings: Settings, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "services.cli", "worker"], cwd=REPO,
                            env=cli_env(settings, **DEFAULT_WORKER_ENV), stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def _diagnose(settings: Settings, runs: dict[str, Path], wlog: Path) -> str:
    """Which runs did not end, what their raw log and the group hold (for a failing run of this test)."""
    r = sync_client(settings)
    layout = settings.layout
    lines = []
    for run in sorted(set(runs) - ended_runs(settings)):
        stream = layout.raw_stream(layout.shard_of(run))
        seqs = sorted(int(f[b"seq"]) for _, f in r.xrange(stream) if f.get(b"run") == run.encode())
        pending = r.xpending(stream, settings.group)
        state = r.hgetall(layout.run_state(run))
        lines.append(f"{run}: raw seqs {seqs[:3]}..{seqs[-3:]} ({len(seqs)}), expected "
                     f"{len(runs[run].read_bytes().splitlines()) + 1}; shard pending {pending['pending']}; "
                     f"state keys {sorted(k.decode() for k in state)} v={state.get(b'v')}")
    return "\n".join(lines) + "\n" + wlog.read_text(errors="replace")[-4000:]


def _published(settings: Settings, run: str) -> int:
    r = sync_client(settings)
    stream = settings.layout.raw_stream(settings.layout.shard_of(run))
    return sum(1 for _, f in r.xrange(stream) if f.get(b"run") == run.encode())


def strip_time(event: dict) -> dict:
    return {k: v for k, v in event.items() if k not in ("timestamp", "durationMs")}


def test_sigkill_of_a_primary_mid_stream_loses_nothing(tmp_path):
    cluster = start_cluster(str(tmp_path / "cluster"))
    procs: list[subprocess.Popen] = []
    consumer = None
    try:
        s = Settings(redis_url=cluster.url, redis_cluster=True, namespace="fo",
                     spool_dir=str(tmp_path / "spool"), host_label="fo")
        runs = {f"fo/{i}/{p.stem}": p for i in range(2) for p in TRANSCRIPTS}
        # the victim: the primary that owns the most long runs (>= 30 lines: >= 2.4 s at this pace)
        def owner(run: str) -> int:
            return cluster.primary_of_slot(key_slot(s.layout.raw_stream(s.layout.shard_of(run)).encode()))

        long_runs = [r for r, p in runs.items() if len(p.read_bytes().splitlines()) >= 30]
        victim_port, _n = Counter(owner(r) for r in long_runs).most_common(1)[0]
        victim_runs = [r for r in long_runs if owner(r) == victim_port]
        wlog, tlog = tmp_path / "workers.log", tmp_path / "taps.log"
        procs += [worker(s, wlog), worker(s, wlog)]
        # both workers consuming before the taps start: the failover hits running workers
        wait_until(lambda: wlog.read_text(errors="replace").count(" consuming ") >= 2, timeout=60)
        consumer = FollowingConsumer(s)
        consumer.start()
        taps = {run: tap(s, run, path, tlog) for run, path in runs.items()}
        procs += taps.values()
        # mid-stream: a run on the victim has entries in its raw stream and no eof yet
        wait_until(lambda: any(_published(s, r) >= 3 for r in victim_runs), timeout=30, interval=0.05)
        assert any(taps[r].poll() is None for r in victim_runs), "the kill would not be mid-stream"
        cluster.node(victim_port).kill()  # SIGKILL
        wait_until(lambda: victim_port not in cluster.primary_ports() and len(cluster.primary_ports()) == 3,
                   timeout=30, interval=0.2)  # its replica was promoted
        # The promoted primary has no replica now, so taps waiting for one (WAIT 1) hold their
        # entries in the spool until the killed node is back (a supervisor restarts it; it rejoins,
        # empty, as the new primary's replica). With 2 replicas per primary they would not wait.
        time.sleep(2.0)
        cluster.restart_dead()

        for run, proc in taps.items():
            try:
                assert proc.wait(timeout=120) == 0, (run, tlog.read_text()[-3000:])
            except subprocess.TimeoutExpired:
                # a tap still retrying: its log says why (it repeats the latest reason every 30 s)
                raise AssertionError(f"tap of {run} not done 120 s after the restart\n"
                                     f"{tlog.read_text(errors='replace')[-3000:]}\n{_diagnose(s, runs, wlog)}") from None
        # the kill hit taps mid-run: they spooled, reconnected to the new primary and delivered
        assert "reachable again" in tlog.read_text(), tlog.read_text()[-3000:]
        try:
            wait_until(lambda: ended_runs(s) >= set(runs), timeout=180, interval=0.5)
        except AssertionError:
            raise AssertionError(_diagnose(s, runs, wlog)) from None
        time.sleep(1.0)  # let the consumer catch the last entries
        consumer.done.set()
        consumer.join(timeout=10)

        # 1. nothing lost: every line each tap printed is in the raw log once per seq, then its eof
        by_run: dict[str, dict[int, object]] = {}
        for e in raw_entries(s):
            by_run.setdefault(e.run, {})[e.seq] = e
        for run, path in runs.items():
            lines = path.read_text("utf-8").splitlines()
            entries = by_run[run]
            assert sorted(entries) == list(range(len(lines) + 1)), run
            assert [entries[i].line for i in range(len(lines))] == lines, run
            assert entries[len(lines)].kind == "eof"
        # 2. every run's events are exactly one normalization pass over its input
        published = events_by_run(s)
        for run, path in runs.items():
            got = published[run]
            assert [e["eventId"] for e in got] == [f"{run}:{n}" for n in range(len(got))], "gap or duplicate"
            assert got == expected_events(s, run)
            out = subprocess.run([sys.executable, "-m", "services.cli", "normalize", str(path), "--run", run],
                                 cwd=REPO, capture_output=True, check=True)
            normalized = [orjson.loads(line) for line in out.stdout.splitlines()]
            assert [strip_time(e) for e in got] == [strip_time(e) for e in normalized], run
        # 3. a consumer that deduplicates by eventId saw each event exactly once
        deduped: dict[str, dict] = {}
        for event in consumer.seen:
            deduped.setdefault(event["eventId"], event)
        assert len(consumer.seen) >= len(deduped)
        everything = {e["eventId"]: e for v in published.values() for e in v}
        assert deduped == everything
    finally:
        if consumer is not None:
            consumer.done.set()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            stop(p)
        cluster.stop()
