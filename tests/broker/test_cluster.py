"""Redis Cluster mode: key slots, the shard-count check, readiness with slots missing, the
cross-slot checker. On a real local cluster (tests/support/redis_cluster.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from redis.crc import key_slot

from contracts.events import EVENT_TYPES
from contracts.keys import KeyLayout
from services.broker.cluster import (
    ShardCountMismatch,
    cluster_health,
    ensure_shard_count,
    ensure_shard_count_async,
    judge_cluster_info,
    parse_cluster_info,
)
from services.broker.connect import BrokerConfigError, async_client, sync_client
from services.broker.embedded import free_port
from services.settings import Settings
from tests.support.redis_cluster import (
    RecordedCommand,
    cross_slot_violations,
    parse_monitor_line,
    start_cluster,
)
from tests.support.redis_server import cli_env

REPO = Path(__file__).resolve().parents[2]


# --- the layout: one slot per shard -------------------------------------------------------------
@pytest.mark.parametrize("namespace", ["", "tenant-a"])
def test_every_name_of_a_shard_hashes_to_one_slot_and_shards_spread(namespace):
    layout = KeyLayout(namespace=namespace, shards=16, cluster=True)
    slots = set()
    for shard in range(layout.shards):
        run = next(f"run-{i}" for i in range(10_000) if layout.shard_of(f"run-{i}") == shard)
        names = [layout.raw_stream(shard), layout.control_stream(shard), layout.active_runs(shard),
                 layout.events_partition(shard), layout.runs_partition(shard), layout.deadletter_partition(shard),
                 layout.run_state(run), layout.import_checkpoint(run), layout.export_state("otlp", run),
                 layout.export_group_state("otlp", "goose-ingest-otlp", run),
                 layout.export_group_open_runs("otlp", "goose-ingest-otlp", shard),
                 *(layout.type_partition(t, shard) for t in EVENT_TYPES)]
        shard_slots = {key_slot(name.encode()) for name in names}
        assert len(shard_slots) == 1, (shard, names)
        slots |= shard_slots
    assert len(slots) == layout.shards  # 16 shards, 16 different slots


def test_cluster_settings_default_to_16_shards(redis_cluster):
    assert Settings(redis_url=redis_cluster.url, redis_cluster=True).shards == 16
    assert Settings(redis_url=redis_cluster.url, redis_cluster=True, shards=24).shards == 24


# --- clients -----------------------------------------------------------------------------------------
def test_sync_and_async_clients_reach_every_primary_from_one_seed(redis_cluster, cluster_settings):
    one_seed = cluster_settings.model_copy(update={"redis_url": f"redis://{redis_cluster.seeds[1]}"})
    layout = one_seed.layout
    r = sync_client(one_seed)
    for shard in range(layout.shards):
        r.xadd(layout.raw_stream(shard), {"probe": str(shard)})
    owners = {redis_cluster.primary_of_slot(key_slot(layout.raw_stream(s).encode())) for s in range(layout.shards)}
    assert len(owners) == 3  # the 16 shards spread over all three primaries

    async def read() -> int:
        client = async_client(one_seed)
        try:
            return sum([await client.xlen(layout.raw_stream(s)) for s in range(layout.shards)])
        finally:
            await client.aclose()

    assert asyncio.run(read()) == layout.shards


# --- the shard count is part of the data ---------------------------------------------------------
def test_the_first_command_records_the_shard_count_and_a_different_one_is_refused(cluster_settings):
    r = sync_client(cluster_settings)
    layout = cluster_settings.layout
    ensure_shard_count(r, layout)  # first use: records 16
    ensure_shard_count(r, layout)  # same count: fine
    assert r.hgetall(layout.meta()) == {b"shards": b"16", b"layout": b"cluster"}
    other = KeyLayout(namespace=layout.namespace, shards=8, cluster=True)
    with pytest.raises(ShardCountMismatch) as info:
        ensure_shard_count(r, other)
    message = str(info.value)
    assert isinstance(info.value, BrokerConfigError) and "\n" not in message
    assert "GOOSE_INGEST_SHARDS=8" in message and "created with 16 shards" in message
    assert r.hgetall(layout.meta())[b"shards"] == b"16"  # the refused command changed nothing

    async def check_async() -> None:
        client = async_client(cluster_settings)
        try:
            await ensure_shard_count_async(client, other)
        finally:
            await client.aclose()

    with pytest.raises(ShardCountMismatch):
        asyncio.run(check_async())


def test_a_layout_change_is_refused_too(settings):
    r = sync_client(settings)
    ensure_shard_count(r, settings.layout)  # single node, 2 shards
    as_cluster = KeyLayout(namespace=settings.namespace, shards=settings.shards, cluster=True)
    with pytest.raises(ShardCountMismatch, match="single key layout"):
        ensure_shard_count(r, as_cluster)


FIXTURE = REPO.parent / "shared" / "fixtures" / "goose" / "a-read-edit-test-finish.jsonl"


@pytest.mark.parametrize("command", [
    ["worker"],
    ["publish", "--run", "mismatch/1", str(FIXTURE)],
    ["tap", "--quiet", "--run", "mismatch/2", "--", "true"],
    ["import-sessions", "SESSIONS_DB", "--namespace", "laptop", "--no-progress"],
])
def test_commands_with_a_different_shard_count_refuse_to_start_with_one_line(cluster_settings, fixture_db,
                                                                            command, tmp_path):
    ensure_shard_count(sync_client(cluster_settings), cluster_settings.layout)
    before = {stream: sync_client(cluster_settings).xlen(stream) for stream in cluster_settings.layout.raw_streams()}
    env = cli_env(cluster_settings, GOOSE_INGEST_SHARDS="8", GOOSE_INGEST_METRICS_PORT="0")
    argv = [str(fixture_db) if a == "SESSIONS_DB" else a for a in command]
    res = subprocess.run([sys.executable, "-m", "services.cli", *argv], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if f"goose-ingest {command[0]}:" in line]
    assert len(errors) == 1 and "created with 16 shards" in errors[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr and res.stdout == ""
    after = {stream: sync_client(cluster_settings).xlen(stream) for stream in cluster_settings.layout.raw_streams()}
    assert after == before  # nothing was published


# --- readiness ---------------------------------------------------------------------------------------
def test_cluster_info_judgement():
    ok = parse_cluster_info("cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n")
    assert judge_cluster_info(ok).ok
    missing = judge_cluster_info(parse_cluster_info("cluster_state:ok\r\ncluster_slots_ok:10000\r\n"))
    assert not missing.ok and "6384 of 16384 slots not served" in missing.reason
    failed = judge_cluster_info(parse_cluster_info("cluster_state:fail\r\ncluster_slots_ok:10923\r\n"))
    assert not failed.ok and "cluster_state=fail" in failed.reason


def test_cluster_health_of_a_healthy_cluster_and_of_a_single_node(redis_cluster, cluster_settings, settings):
    async def health(s: Settings):
        client = async_client(s)
        try:
            return await cluster_health(client)
        finally:
            await client.aclose()

    assert asyncio.run(health(cluster_settings)).ok
    assert asyncio.run(health(settings)).ok  # a single node has no slots to miss


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, "no answer"  # not listening (yet)


def test_a_cluster_with_slots_missing_fails_readiness_and_the_worker_recovers(tmp_path):
    """3 primaries, no replicas: killing one leaves a third of the slots unserved (default settings)."""
    from tests.support.pipeline import stop, wait_until

    cluster = start_cluster(str(tmp_path / "cluster"), replicas=0)
    worker = None
    try:
        s = Settings(redis_url=cluster.url, redis_cluster=True, namespace="slots", spool_dir=str(tmp_path / "spool"))
        victim = cluster.nodes[2]
        log = tmp_path / "worker.log"
        victim.kill()
        wait_until(lambda: not _cluster_ok(cluster), timeout=30)
        port = free_port()  # known before the worker is ready: it serves /readyz while it waits
        worker = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "--metrics-port", str(port)],
                                  cwd=REPO, env=cli_env(s), stdout=log.open("ab"), stderr=subprocess.STDOUT)
        status, body = wait_until(lambda: (r := _readyz(port))[0] == 503 and "not serving" in r[1] and r, timeout=30)
        assert "cluster_state=fail" in body or "slots not served" in body
        time.sleep(6)  # longer than any restart back-off: still alive, still saying why
        assert worker.poll() is None, log.read_text()[-3000:]
        assert _readyz(port)[0] == 503

        victim.start()  # it comes back empty, with its slots (nodes.conf): the cluster serves all again
        wait_until(lambda: _readyz(port)[0] == 200, timeout=60)
        _publish_and_check(s, "after-outage")

        # the same outage while the worker runs: not ready (saying why), alive, and back after it
        victim.kill()
        wait_until(lambda: (r := _readyz(port))[0] == 503 and "not serving" in r[1], timeout=30)
        time.sleep(6)
        assert worker.poll() is None, log.read_text()[-3000:]
        victim.start()
        wait_until(lambda: _readyz(port)[0] == 200, timeout=60)
        _publish_and_check(s, "after-second-outage")
    except AssertionError as exc:  # say what the worker did
        raise AssertionError(f"{exc}\n--- worker log ---\n{log.read_text(errors='replace')[-4000:]}") from None
    finally:
        if worker is not None:
            stop(worker)
        cluster.stop()


def _publish_and_check(settings: Settings, run: str) -> None:
    from services.tap.publisher import Publisher
    from tests.support.pipeline import ended_runs, events_by_run, expected_events, wait_until

    with Publisher(settings, run, {"host": "t"}) as pub:
        for line in FIXTURE.read_bytes().splitlines():
            pub.add_line(line, "stdout")
        pub.add_eof(0)
    wait_until(lambda: run in ended_runs(settings), timeout=60)
    assert events_by_run(settings)[run] == expected_events(settings, run)


def _cluster_ok(cluster) -> bool:
    for n in cluster.live_nodes():
        text = cluster.client(n.port).execute_command("CLUSTER", "INFO")
        if b"cluster_state:ok" not in text:
            return False
    return True


# --- the cross-slot checker can fail -------------------------------------------------------------
def test_monitor_lines_are_parsed_with_their_escapes():
    line = b'1700000000.123456 [0 127.0.0.1:5555] "XADD" "a b" "*" "f" "q\\"x\\\\\\x01\\n"'
    assert parse_monitor_line(line) == ("client", (b"XADD", b"a b", b"*", b"f", b'q"x\\\x01\n'))
    assert parse_monitor_line(b'1.0 [0 lua] "HSET" "k" "v" "1"') == ("lua", (b"HSET", b"k", b"v", b"1"))


def test_cross_slot_checker_flags_commands_and_scripts_spanning_slots(redis_cluster):
    port = redis_cluster.primary_ports()[0]
    same = [RecordedCommand(port, "client", (b"MSET", b"{s1}a", b"1", b"{s1}b", b"2")),
            RecordedCommand(port, "client", (b"EVALSHA", b"abc", b"1", b"goose.raw.{s1}", b"x")),
            RecordedCommand(port, "lua", (b"HSET", b"goose-ingest:run:{s1}:r", b"v", b"1"))]
    assert cross_slot_violations(redis_cluster, same) == []
    across = [RecordedCommand(port, "client", (b"MSET", b"{s1}a", b"1", b"{s2}b", b"2"))]
    assert len(cross_slot_violations(redis_cluster, across)) == 1
    script_across = [RecordedCommand(port, "client", (b"EVALSHA", b"abc", b"1", b"goose.raw.{s1}", b"x")),
                     RecordedCommand(port, "lua", (b"XADD", b"harness.events.{s2}", b"*", b"f", b"v"))]
    assert len(cross_slot_violations(redis_cluster, script_across)) == 1


def test_a_sigterm_while_waiting_for_the_cluster_is_a_requested_stop(tmp_path):
    """Status 1 means "a subscriber died, restart me"; a stop asked for before consuming is not that."""
    from tests.support.pipeline import stop, wait_until

    cluster = start_cluster(str(tmp_path / "cluster"), replicas=0)
    worker = None
    log = tmp_path / "worker.log"
    try:
        s = Settings(redis_url=cluster.url, redis_cluster=True, namespace="term", spool_dir=str(tmp_path / "spool"))
        cluster.nodes[2].kill()
        wait_until(lambda: not _cluster_ok(cluster), timeout=30)
        port = free_port()
        worker = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "--metrics-port", str(port)],
                                  cwd=REPO, env=cli_env(s), stdout=log.open("ab"), stderr=subprocess.STDOUT)
        wait_until(lambda: (r := _readyz(port))[0] == 503 and "not serving" in r[1], timeout=30)
        stop(worker)
        assert worker.returncode in (0, -signal.SIGTERM), log.read_text(errors="replace")[-3000:]
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        cluster.stop()
