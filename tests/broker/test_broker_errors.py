"""Broker error replies read by their code, never by redis-py's message (services/broker/errors.py),
and a tap whose slot map went stale on a cluster finding the stream's primary again.

The stale map is what a SIGKILLed primary leaves behind when it restarts: for a moment it still
claims its old slots, a tap's slot-map refresh can read that claim, and the tap then writes to a
node that is a replica a second later. Before the fix every retry got MOVED (redis-py's MovedError,
whose message lacks the word MOVED), the map was never re-read, and the tap retried forever
(tests/broker/test_cluster_failover.py hung on it one run in two).
"""

from __future__ import annotations

import logging

import pytest
import redis
from redis.cluster import ClusterNode
from redis.crc import key_slot

from services.broker.cluster import xadd_batch
from services.broker.connect import sync_client
from services.broker.errors import (
    TOPOLOGY_CODES,
    TRANSIENT_CODES,
    describe,
    is_outage,
    is_transient,
    reply_code,
    server_message,
)
from services.tap.publisher import STILL_FAILING_REPORT_S, Publisher

SECRET_LINE = '{"type":"message","text":"token ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"}'
SECRET = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"


def _pipeline_error(client: redis.Redis, key: str, line: str) -> redis.ResponseError:
    pipe = client.pipeline(transaction=False)
    pipe.xadd(key, {"run": "r", "line": line})
    with pytest.raises(redis.ResponseError) as info:
        pipe.execute()
    return info.value


# --- reading a reply (real errors from a real Redis) ----------------------------------------------
def test_a_pipeline_error_is_read_by_its_code_and_described_without_the_quoted_command(settings):
    client = sync_client(settings)
    key = f"{settings.namespace}:wrongtype"
    client.set(key, "a string, not a stream")
    short_run_line = SECRET  # the quoted command is shortened to 100 characters: put the secret early
    exc = _pipeline_error(client, key, short_run_line)
    assert SECRET[:12] in str(exc)  # the hazard: redis-py quotes the command, line included
    assert reply_code(exc) == "WRONGTYPE"
    assert server_message(exc).startswith("WRONGTYPE")
    assert SECRET[:12] not in describe(exc) and "ResponseError: WRONGTYPE" in describe(exc)
    assert not is_transient(exc)


def test_a_line_that_contains_the_annotation_cannot_pass_for_the_servers_text(settings):
    client = sync_client(settings)
    key = f"{settings.namespace}:wrongtype2"
    client.set(key, "x")
    exc = _pipeline_error(client, key, "caused error: MOVED 1 h:1 " + SECRET)
    assert reply_code(exc) == "WRONGTYPE"
    assert SECRET[:8] not in describe(exc)


def test_codes_redis_py_strips_are_read_from_the_class():
    moved = redis.exceptions.MovedError("3999 127.0.0.1:7002")  # as the parser builds it, without status_code
    assert reply_code(moved) == "MOVED" and "MOVED 3999" in describe(moved)
    down = redis.exceptions.ClusterDownError("The cluster is down")
    assert reply_code(down) == "CLUSTERDOWN" and is_transient(down)
    assert reply_code(redis.ResponseError("NOREPLICAS Not enough good replicas")) == "NOREPLICAS"
    assert reply_code(redis.ResponseError("ERR unknown command")) == "ERR"
    assert TOPOLOGY_CODES <= TRANSIENT_CODES
    assert describe(redis.ConnectionError("Error 111 connecting to 127.0.0.1:1.")) == \
        "ConnectionError: Error 111 connecting to 127.0.0.1:1."
    assert describe(redis.ResponseError()) == "ResponseError"


def test_an_outage_is_a_lost_connection_or_a_reply_about_the_brokers_state_never_a_refusal():
    outages = [redis.ConnectionError("Error 111"), redis.TimeoutError("Timeout reading"), ConnectionResetError(),
               redis.exceptions.ClusterDownError("The cluster is down"), redis.exceptions.MovedError("1 h:1"),
               redis.exceptions.SlotNotCoveredError("slot 3 not covered"), redis.ResponseError("TRYAGAIN x"),
               redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
               redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
               redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")]
    refusals = [redis.ResponseError("ERR Error running script"), redis.ResponseError("WRONGTYPE Operation"),
                redis.exceptions.NoPermissionError("NOPERM no permissions"), ValueError("OOM in a message"),
                redis.exceptions.DataError("Invalid input")]
    assert [type(e).__name__ for e in outages if not is_outage(e)] == []
    assert [type(e).__name__ for e in refusals if is_outage(e)] == []


# --- a stale slot map on a real cluster --------------------------------------------------------------
def _replica_of(cluster, primary_port: int) -> int:
    for n in cluster.live_nodes():
        info = cluster.client(n.port).info("replication")
        if info.get("role") == "slave" and int(info["master_port"]) == primary_port:
            return n.port
    raise AssertionError(f"no replica of {primary_port}")


def _point_slot_at_its_replica(client, cluster, key: str) -> None:
    """What a refresh that read a restarted primary's stale claim leaves: the slot routed to a node
    that is a replica now."""
    slot = key_slot(key.encode())
    port = _replica_of(cluster, cluster.primary_of_slot(slot))
    stale = ClusterNode("127.0.0.1", port, server_type="primary", redis_connection=redis.Redis(port=port))
    client.nodes_manager.slots_cache[slot] = [stale]
    assert client.get_node_from_key(key) is stale


def test_a_moved_reply_refreshes_the_slot_map_so_the_retry_reaches_the_primary(redis_cluster, cluster_settings):
    client = sync_client(cluster_settings)
    stream = cluster_settings.layout.raw_stream(0)
    _point_slot_at_its_replica(client, redis_cluster, stream)
    entries = [{"run": "r", "seq": str(i), "line": SECRET_LINE} for i in range(3)]
    with pytest.raises(redis.ResponseError) as info:
        xadd_batch(client, stream, entries, wait_replicas=1, wait_timeout_ms=1000)
    assert reply_code(info.value) == "MOVED"
    assert SECRET not in describe(info.value)
    xadd_batch(client, stream, entries, wait_replicas=1, wait_timeout_ms=1000)  # the retry: primary
    assert client.xlen(stream) == 3  # the refused batch wrote nothing


def test_a_tap_on_a_stale_slot_map_delivers_and_logs_no_line(redis_cluster, cluster_settings, caplog):
    """Default publisher settings; the tap's own cluster client, its map made stale before it sends."""
    run = "stale-map-run"
    caplog.set_level(logging.WARNING, logger="goose_ingest.tap")
    pub = Publisher(cluster_settings, run, {"host": "t"})
    try:
        _point_slot_at_its_replica(pub._transport.client, redis_cluster, pub.stream_key)
        for _ in range(5):
            pub.add_line(SECRET_LINE.encode(), "stdout")
        pub.add_eof(0)
        assert pub.flush(timeout=30), caplog.text
    finally:
        pub.close(timeout=5)
    assert "broker unreachable" in caplog.text and "MovedError: MOVED" in caplog.text  # it did meet the stale map
    assert "reachable again" in caplog.text
    assert SECRET[:8] not in caplog.text
    client = sync_client(cluster_settings)
    seqs = [int(f[b"seq"]) for _, f in client.xrange(pub.stream_key) if f[b"run"] == run.encode()]
    assert sorted(seqs) == list(range(6))  # five lines and the eof, once each


def test_a_tap_that_keeps_failing_says_so_again_with_the_latest_reason(tmp_path, caplog, monkeypatch):
    """No broker at all: the first failure is logged at once, then one line per STILL_FAILING_REPORT_S
    (shortened here: the cadence of a log line, not a timeout that guards a race)."""
    from services.broker.embedded import free_port
    from services.settings import Settings

    assert STILL_FAILING_REPORT_S == 30.0
    monkeypatch.setattr("services.tap.publisher.STILL_FAILING_REPORT_S", 0.5)
    caplog.set_level(logging.WARNING, logger="goose_ingest.tap")
    s = Settings(redis_url=f"redis://127.0.0.1:{free_port()}", spool_dir=str(tmp_path / "spool"))
    pub = Publisher(s, "nobody-listens", {"host": "t"})
    try:
        pub.add_line(b"{}", "stdout")
        assert not pub.flush(timeout=3)
    finally:
        pub.close(timeout=0)
    assert caplog.text.count("broker unreachable") == 1
    still = [r.getMessage() for r in caplog.records if "still not delivered" in r.getMessage()]
    assert still and "attempts (latest: ConnectionRefusedError" in still[-1], caplog.text


def test_an_os_error_is_described_by_its_whole_text():
    assert describe(ConnectionRefusedError(111, "Connection refused")) == \
        "ConnectionRefusedError: [Errno 111] Connection refused"
