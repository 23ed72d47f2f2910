"""Retention that trusts the archive (issue 23, Deliver 2): with ARCHIVE_URL set, the workers' raw
trim is also bounded by the archive group's committed position, so RAW_RETENTION_HOURS can be
minutes (here 0.0001 h) without ever trimming what is not archived.

Real parts: redis-server with the shipped ACL roles (the trim runs as `goose-worker`, the archive
as `goose-archive`), the archive as a real process, moto's S3 server made to hang (SIGSTOP) for
longer than several sweep intervals and store timeouts.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.archive.test_archive import Objects, archive_done, expected_raw, http, publish, start_archive, stop
from tests.archive.test_archive import trim_as_worker as _trim
from tests.archive.test_archive import worker_committed_everything as _worker_committed_everything
from tests.broker.test_acl import AclBroker, acl_broker  # noqa: F401 (fixture)
from tests.support.pipeline import wait_until
from tests.support.s3_server import TEST_BUCKET as BUCKET
from tests.support.s3_server import S3Server


def _ids(r, streams: list[str]) -> set[tuple[str, bytes]]:
    return {(s, i) for s in streams for i, _ in r.xrange(s)}


def test_store_down_nothing_unarchived_is_trimmed_then_all_archived_once(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    b = acl_broker
    r = b.root()
    r.config_set("stream-node-max-entries", 1)  # XTRIM MINID ~ then trims entry by entry: the test sees each one
    layout = b.settings.layout
    streams = [*layout.raw_streams(), *layout.control_streams()]
    publish(r, b, 60, tag="a")
    proc, port_file = start_archive(b, tmp_path, f"s3://{BUCKET}", GOOSE_INGEST_ARCHIVE_STORE_TIMEOUT_S="1", **s3.env())
    try:
        wait_until(lambda: archive_done(r, b), timeout=90)
        archived_a = _ids(r, streams)
        s3.pause()  # the store hangs: requests time out
        publish(r, b, 40, tag="b")
        everything = expected_raw(r, b)
        not_archived = _ids(r, streams) - archived_a
        _worker_committed_everything(b)
        wait_until(lambda: "archive store failing" in http(port_file, "/readyz")[1], timeout=60)
        time.sleep(3)  # several sweep intervals (0.5 s) and store timeouts (1 s) with the store down
        status, reason = http(port_file, "/readyz")
        assert status == 503 and "archive store failing" in reason
        lag = [line for line in http(port_file, "/metrics")[1].splitlines()
               if line.startswith('goose_ingest_archive_lag_seconds{dataset="raw"}')]
        assert lag and float(lag[0].split()[-1]) >= 1.0, lag  # the second round waits, and the gauge says so
        time.sleep(0.5)  # entries of the second round must be older than the 0.36 s retention
        _trim(b, f"s3://{BUCKET}")
        left = _ids(r, streams)
        assert not_archived <= left, "an entry that was not archived was trimmed"
        assert archived_a - left, "the archived entries past the retention were not trimmed"
        assert proc.poll() is None
        s3.resume()
        wait_until(lambda: archive_done(r, b), timeout=120)
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=30)
        # The frontier is in whole milliseconds (XTRIM MINID <ms>-0): entries in the committed
        # position's own millisecond stay. A later round moves it past the second round's.
        time.sleep(0.01)
        publish(r, b, 5, tag="c")
        everything += [e for e in expected_raw(r, b) if e not in everything]
        wait_until(lambda: archive_done(r, b), timeout=90)
        _worker_committed_everything(b)
        time.sleep(0.5)
        _trim(b, f"s3://{BUCKET}")
        assert not (not_archived & _ids(r, streams)), "archived entries past the retention stay"
    finally:
        if s3.paused:
            s3.resume()
        assert stop(proc) == 0, (tmp_path / "archive.log").read_text()[-3000:]
    # 0 lost: every entry of both rounds is in the archive exactly once, byte-exact
    got = Objects(s3=s3).raw_entries()
    key = lambda e: (e.shard, e.stream, e.id)  # noqa: E731
    assert len({key(e) for e in got}) == len(got)
    assert sorted(got, key=key) == sorted(everything, key=key)


def test_archive_group_missing_keeps_everything(acl_broker: AclBroker):  # noqa: F811
    """ARCHIVE_URL set but the archive never started (its group does not exist yet): the trim keeps
    everything rather than guess; without an archive configured, the same trim removes them."""
    b = acl_broker
    r = b.root()
    r.config_set("stream-node-max-entries", 1)
    streams = [*b.settings.layout.raw_streams(), *b.settings.layout.control_streams()]
    publish(r, b, 10)
    time.sleep(0.01)
    publish(r, b, 2, tag="later")  # the committed position's own millisecond is kept: move past the first round
    _worker_committed_everything(b)
    time.sleep(0.5)
    before = _ids(r, streams)
    _trim(b, "file:///nonexistent-archive")
    assert _ids(r, streams) == before
    _trim(b, None)
    assert len(_ids(r, streams)) < len(before)


def test_an_idle_control_stream_does_not_hold_back_the_raw_trim(acl_broker: AclBroker):  # noqa: F811
    """A control entry from long ago, archived: the archive has read everything there, so the raw
    shard trims up to the retention, not to that old entry's time."""
    b = acl_broker
    r = b.root()
    r.config_set("stream-node-max-entries", 1)
    layout = b.settings.layout
    group = b.settings.archive_group
    for shard in range(b.settings.shards):
        r.xadd(layout.control_stream(shard), {"kind": "abandon"}, id=f"{int(time.time() * 1000) - 3_600_000}-0")
        for _ in range(10):
            r.xadd(layout.raw_stream(shard), {"run": "r", "kind": "line"})
        time.sleep(0.01)
        r.xadd(layout.raw_stream(shard), {"run": "r", "kind": "line"})  # past the committed position's own ms
    # the archive (and the workers) read and acknowledged everything
    for stream in [*layout.raw_streams(), *layout.control_streams()]:
        for g in (group, b.settings.group):
            try:
                r.xgroup_create(stream, g, id="0")
            except Exception:
                pass
            got = r.xreadgroup(g, "c", {stream: ">"}, count=10_000)
            if got:
                r.xack(stream, g, *[sid for sid, _ in got[0][1]])
    time.sleep(0.5)
    before = len(_ids(r, layout.raw_streams()))
    _trim(b, "file:///archive")
    assert len(_ids(r, layout.raw_streams())) < before
