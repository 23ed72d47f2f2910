"""A failover stalls nothing (issue 20, finding 11): after a primary is SIGKILLed, the workers keep
committing the entries of shards whose primary survived, within seconds, and those of the killed
primary's shards as soon as its replica is promoted, instead of leaving entries pending until
CLAIM_IDLE_MS (30 s) when a read or commit failed on the topology change (it raised out of the
handler). The failed read or commit is now sent again at once on the new topology
(services/worker/processor.py, `through_outage`).

Own cluster (3 primaries + 3 replicas, node timeout 2 s), two real worker processes with default
settings, entries published to every shard by this process every 10 ms throughout the kill.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.crc import key_slot

from contracts.raw import stream_id_ms
from services.broker.connect import sync_client
from services.settings import Settings
from tests.support.pipeline import REPO, stop, wait_until
from tests.support.redis_cluster import start_cluster
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

DEFAULT_WORKER_ENV = {"GOOSE_INGEST_CLAIM_IDLE_MS": "30000", "GOOSE_INGEST_SWEEP_INTERVAL_S": "5",
                      "GOOSE_INGEST_BATCH_SIZE": "500", "GOOSE_INGEST_METRICS_PORT": "0"}
WATCH_S = 18.0  # how long after the kill the shards are watched (well below CLAIM_IDLE_MS)
MAX_AGE_S = 10.0  # the oldest uncommitted entry of a surviving shard may be this old, no older
# ... and of every shard at the end of the watch: the promotion takes ~4 s (node timeout 2 s +
# election), so an entry read before the kill is committed ~5 s after it, not 30 s.
LINE = b'{"type":"message","message":{"id":"m","role":"assistant","content":[{"type":"text","text":"tick"}]}}'


class Feeder:
    """One line to one run of every shard each 10 ms, from before the kill to the end: a thread per
    shard, so XADDs to the killed primary (each waiting out its connection timeout) never slow the
    surviving primaries' shards (one thread for all once fed them 96 lines in the whole watch)."""

    def __init__(self, settings: Settings, runs: dict[int, str]) -> None:
        self.settings, self.runs = settings, runs
        self.done = threading.Event()
        self.seq = dict.fromkeys(runs, 0)
        self.threads = [threading.Thread(target=self._feed, args=(shard,), daemon=True) for shard in runs]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _feed(self, shard: int) -> None:
        client = sync_client(self.settings)
        stream = self.settings.layout.raw_stream(shard)
        run = self.runs[shard].encode()
        while not self.done.is_set():
            fields = {b"run": run, b"seq": str(self.seq[shard]).encode(),
                      b"ts": str(int(time.time() * 1000)).encode(), b"line": LINE}
            try:
                client.xadd(stream, fields)
                self.seq[shard] += 1
            except (redis.RedisError, redis.exceptions.RedisClusterException):
                pass  # the victim's shards while its replica is promoted: sent again next round
            time.sleep(0.01)


def _tails(logs: list) -> str:
    return "\n".join(f"--- {log.name}\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "")
                     for log in logs)


def _oldest_uncommitted_age_s(client: object, settings: Settings, shard: int) -> float:
    """Age of the shard's oldest entry not yet committed by the group: pending, or not yet delivered."""
    stream = settings.layout.raw_stream(shard)
    oldest: list[int] = []
    summary = client.xpending(stream, settings.group)  # type: ignore[attr-defined]
    if summary["pending"]:
        oldest.append(stream_id_ms(summary["min"]))
    group = next(g for g in client.xinfo_groups(stream) if g["name"].decode() == settings.group)  # type: ignore[attr-defined]
    after = client.xrange(stream, min="(" + group["last-delivered-id"].decode(), count=1)  # type: ignore[attr-defined]
    if after:
        oldest.append(stream_id_ms(after[0][0]))
    return max(0.0, time.time() - min(oldest) / 1000) if oldest else 0.0


# Issue 20 finding 11, the intermittent once seen in a full run: a shard handed over between the
# workers (a lease rebalance) right before the kill stalled 18.5 s. The worker giving a shard back
# had a read in flight; the entries it delivered could not be committed (the lease had moved) and
# waited for CLAIM_IDLE_MS, and the new owner's takeover failed on the failover. `handover` makes
# that moment happen every time: the second worker starts after the first, and the primary is
# killed as soon as it takes its first shard.
@pytest.mark.parametrize("start", ["together", "handover"])
def test_after_a_primary_is_killed_the_surviving_primaries_shards_commit_within_seconds(tmp_path, start):
    cluster = start_cluster(str(tmp_path / "cluster"))
    workers: list[subprocess.Popen] = []
    feeder = None
    try:
        s = Settings(redis_url=cluster.url, redis_cluster=True, namespace="stall",
                     spool_dir=str(tmp_path / "spool"), host_label="stall")
        layout = s.layout
        primary = {shard: cluster.primary_of_slot(key_slot(layout.raw_stream(shard).encode()))
                   for shard in range(s.shards)}
        victim = primary[0]
        surviving = [shard for shard, port in primary.items() if port != victim]
        assert surviving and len(surviving) < s.shards
        names = (f"stall/{i}" for i in range(100_000))
        runs: dict[int, str] = {}
        for name in names:
            runs.setdefault(layout.shard_of(name), name)
            if len(runs) == s.shards:
                break
        logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]

        def spawn(log):
            return subprocess.Popen([sys.executable, "-m", "services.cli", "worker"], cwd=REPO,
                                    env=cli_env(s, **DEFAULT_WORKER_ENV), stdout=log.open("ab"),
                                    stderr=subprocess.STDOUT)

        def text(log) -> str:
            return log.read_text(errors="replace") if log.exists() else ""

        workers.append(spawn(logs[0]))
        if start == "together":
            workers.append(spawn(logs[1]))
            wait_until(lambda: all(" consuming " in text(log) for log in logs), timeout=60)
        else:
            wait_until(lambda: " consuming " in text(logs[0]), timeout=60)
        feeder = Feeder(s, runs)
        feeder.start()
        client = sync_client(s)
        # steady state first: every shard's entries are committed as they come
        wait_until(lambda: all(_oldest_uncommitted_age_s(client, s, shard) < 2.0 for shard in range(s.shards))
                   and min(feeder.seq.values()) > 20, timeout=60, interval=0.2)
        if start == "handover":  # the first worker gives half its shards back as the second one joins
            workers.append(spawn(logs[1]))
            wait_until(lambda: "took the lease" in text(logs[1]), timeout=60, interval=0.02)
        cluster.node(victim).kill()  # SIGKILL
        killed = time.monotonic()
        worst: dict[int, float] = dict.fromkeys(surviving, 0.0)
        while time.monotonic() - killed < WATCH_S:
            for shard in surviving:
                try:
                    worst[shard] = max(worst[shard], _oldest_uncommitted_age_s(client, s, shard))
                except (redis.RedisError, redis.exceptions.RedisClusterException):
                    continue  # this test's own client re-reading the slot map
            time.sleep(0.25)
        assert max(feeder.seq[shard] for shard in surviving) > 100  # entries kept coming meanwhile
        stalled = {shard: round(age, 1) for shard, age in worst.items() if age > MAX_AGE_S}
        assert not stalled, (f"shards of surviving primaries stalled after the kill (oldest uncommitted "
                             f"entry age, s): {stalled}\n{_tails(logs)}")
        client = sync_client(s)  # a fresh slot map: the victim's replica serves its shards now
        now = {shard: round(_oldest_uncommitted_age_s(client, s, shard), 1) for shard in range(s.shards)}
        late = {shard: age for shard, age in now.items() if age > MAX_AGE_S}
        assert not late, (f"{WATCH_S:.0f} s after the kill, shards still hold old uncommitted entries "
                          f"(age, s): {late}\n{_tails(logs)}")
    finally:
        if feeder is not None:
            feeder.done.set()
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            stop(worker)
        cluster.stop()
