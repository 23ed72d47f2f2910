"""`goose-ingest archive` on real parts (issue 23): a real redis-server with the shipped ACL roles, the
archive as a real process under its own user `goose-archive`, and the object store as a local
directory and as the S3 HTTP API on loopback (moto_server), through the same client code.

What is checked is the archive's promise: every entry of every raw shard and control stream is in
exactly one raw segment, byte-exact, in stream-id order (no gap, no duplicate), also across a
SIGKILL between writing a segment and acknowledging it; the events and run records are in the
event lake; a store that is down keeps Redis from trimming what is not archived.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
import redis
from pydantic import SecretStr

from services.archive import segments as sg
from services.broker.connect import async_client
from services.metrics.server import read_port_file
from services.settings import Settings
from services.worker.housekeeping import Housekeeper
from tests.broker.test_acl import REPO, AclBroker, acl_broker  # noqa: F401 (fixture)
from tests.support.pipeline import wait_until
from tests.support.s3_proxy import S3Proxy
from tests.support.s3_server import TEST_BUCKET as BUCKET
from tests.support.s3_server import S3Server


# ------------------------------------------------------------------------------------------ helpers
def publish(r: redis.Redis, b: AclBroker, n: int, tag: str = "a") -> None:
    """n raw entries per shard (odd bytes included), one control entry per shard, n events and
    n/5 run records on the topics: written by the test's superuser, as a tap and a worker would."""
    layout = b.settings.layout
    pipe = r.pipeline(transaction=False)
    for shard in range(b.settings.shards):
        for i in range(n):
            pipe.xadd(layout.raw_stream(shard), {
                "run": f"run-{tag}-{shard}", "seq": str(i), "ts": str(int(time.time() * 1000)), "kind": "line",
                "stream": "stdout", "line": b'{"i":' + str(i).encode() + b',"bytes":"\xff\x00\xfe"}',
            })
        pipe.xadd(layout.control_stream(shard), {"run": f"run-{tag}-{shard}", "kind": "abandon", "through": str(n - 1)})
    for i in range(n):
        run = f"run-{tag}-{i % 3}"
        doc = {"eventId": f"{run}:{i}", "runId": run, "seq": i, "type": ("agent", "command", "read")[i % 3],
               "timestamp": "2026-12-03T10:00:00.000Z", "tool": "shell" if i % 3 == 1 else None}
        pipe.xadd(layout.events_partition(0), {"eventId": doc["eventId"], "runId": run, "seq": str(i),
                                               "type": doc["type"], "data": orjson.dumps(doc)})
    for k in range(n // 5):
        run = f"run-{tag}-{k}"
        doc = {"recordId": f"{run}:run:1", "runId": run, "state": "ended", "timestamp": "2026-12-03T10:00:01.000Z",
               "seq": 1, "counts": {"agent": 1}, "host": "h"}
        pipe.xadd(layout.runs_partition(0), {"recordId": doc["recordId"], "runId": run, "seq": "1", "state": "ended",
                                             "data": orjson.dumps(doc)})
    pipe.execute()


def expected_raw(r: redis.Redis, b: AclBroker) -> list[sg.ArchivedEntry]:
    layout = b.settings.layout
    out = []
    for shard in range(b.settings.shards):
        for kind, stream in (("raw", layout.raw_stream(shard)), ("control", layout.control_stream(shard))):
            out += [sg.ArchivedEntry(shard, kind, i.decode(), f) for i, f in r.xrange(stream)]
    return out


class Objects:
    """The test's own view of the store (boto3 for S3, the file system for file://)."""

    def __init__(self, s3: S3Server | None = None, root: Path | None = None, prefix: str = "") -> None:
        self.s3, self.root, self.prefix = s3, root, prefix

    def keys(self, under: str = "") -> list[str]:
        if self.s3 is not None:
            full = self.s3.keys(BUCKET, f"{self.prefix}/{under}" if self.prefix else under)
            return [k[len(self.prefix) + 1:] if self.prefix else k for k in full]
        assert self.root is not None
        # obstore's listing, as every reader of the archive sees it: it skips the staging files
        # (`<name>#<n>`) a write killed halfway leaves behind.
        from services.archive.store import open_store
        from services.settings import Settings

        store = open_store(Settings(archive_url=self.root.as_uri()))
        assert store is not None
        return store.list(under)

    def get(self, key: str) -> bytes:
        if self.s3 is not None:
            return self.s3.get(BUCKET, f"{self.prefix}/{key}" if self.prefix else key)
        assert self.root is not None
        return (self.root / key).read_bytes()

    def raw_entries(self) -> list[sg.ArchivedEntry]:
        out: list[sg.ArchivedEntry] = []
        for key in self.keys("raw"):
            parsed = sg.parse_raw_segment_key(key)
            entries = sg.decode_raw_segment(self.get(key))
            assert entries and entries[0].id == parsed.first_id, key  # the name follows from the first id
            assert {(e.shard, e.stream) for e in entries} == {(parsed.shard, parsed.stream)}
            out += entries
        return out

    def event_ids(self) -> list[str]:
        return [row["event_id"] for key in self.keys("events") for row in sg.decode_event_rows(self.get(key))]

    def record_ids(self) -> list[str]:
        return [row["record_id"] for key in self.keys("runs") for row in sg.decode_run_rows(self.get(key))]


def assert_exactly_once(objects: Objects, r: redis.Redis, b: AclBroker, events: int, records: int) -> None:
    want = expected_raw(r, b)
    got = objects.raw_entries()
    order = {(e.shard, e.stream, sg.id_parts(e.id)) for e in got}
    assert len(order) == len(got), "an entry is in two segments"
    key = lambda e: (e.shard, e.stream, sg.id_parts(e.id))  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)  # byte-exact, fields in order: ArchivedEntry equality
    event_ids = objects.event_ids()
    assert len(event_ids) == len(set(event_ids)) == events
    record_ids = objects.record_ids()
    assert len(record_ids) == len(set(record_ids)) == records


def archive_done(r: redis.Redis, b: AclBroker, group: str = "goose-ingest-archive") -> bool:
    layout = b.settings.layout
    streams = [*layout.raw_streams(), *layout.control_streams(), *layout.events_partitions(), *layout.runs_partitions()]
    for stream in streams:
        info = next((g for g in r.xinfo_groups(stream) if g["name"].decode() == group), None)
        if info is None or info["pending"] or info["lag"]:
            return False
    return True


def trim_as_worker(b: AclBroker, archive_url: str | None) -> None:
    """One retention pass of a worker (Housekeeper.trim) under the worker's ACL user."""
    settings: Settings = b.settings.model_copy(update={
        "redis_username": b.user("worker"), "redis_password": SecretStr(b.passwords["worker"]),
        "raw_retention_hours": 0.0001, "archive_url": archive_url})

    async def go() -> None:
        client = async_client(settings)
        try:
            await Housekeeper(settings, client, processor=None, consumer="t").trim()  # type: ignore[arg-type]
        finally:
            await client.aclose()

    asyncio.run(go())


def worker_committed_everything(b: AclBroker) -> None:
    """The workers' group has processed every raw entry (so only the archive can hold the trim back)."""
    r = b.root()
    for stream in b.settings.layout.raw_streams():
        try:
            r.xgroup_create(stream, b.settings.group, id="$", mkstream=True)
        except Exception:
            r.xgroup_setid(stream, b.settings.group, "$")


def start_archive(b: AclBroker, tmp_path: Path, url: str, log_name: str = "archive.log", args: tuple[str, ...] = (),
                  **env: str) -> tuple[subprocess.Popen, Path]:
    port_file = tmp_path / f"{log_name}.port"
    port_file.unlink(missing_ok=True)
    full = b.env("archive", **{"GOOSE_INGEST_ARCHIVE_URL": url, "GOOSE_INGEST_METRICS_PORT": "0",
                               "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file),
                               "GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S": "0.5", "GOOSE_INGEST_SWEEP_INTERVAL_S": "0.5",
                               **env})
    log = tmp_path / log_name
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "archive", *args], cwd=REPO, env=full, stdout=out,
                                stderr=subprocess.STDOUT)
    return proc, port_file


def http(port_file: Path, path: str) -> tuple[int, str]:
    wait_until(lambda: read_port_file(str(port_file)) is not None, timeout=60)
    _, port = read_port_file(str(port_file)) or ("", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------ tests
def test_archive_on_s3_under_its_acl_user_writes_every_entry_once(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    b = acl_broker
    r = b.root()
    publish(r, b, 200)
    proc, port_file = start_archive(b, tmp_path, f"s3://{BUCKET}/fleet", **s3.env())
    try:
        wait_until(lambda: archive_done(r, b), timeout=90)
        assert http(port_file, "/readyz")[0] == 200
        publish(r, b, 50, tag="b")  # a second round: new segments after the first ones
        wait_until(lambda: archive_done(r, b), timeout=90)
        metrics = http(port_file, "/metrics")[1]
    finally:
        assert stop(proc) == 0, (tmp_path / "archive.log").read_text()[-3000:]
    objects = Objects(s3=s3, prefix="fleet")
    assert_exactly_once(objects, r, b, events=250, records=50)
    assert 'goose_ingest_archive_entries_total{dataset="raw"} 500.0' in metrics
    assert 'goose_ingest_archive_entries_total{dataset="events"} 250.0' in metrics
    assert "goose_ingest_archive_segment_write_seconds_count" in metrics
    # no NOPERM: the archive did everything under its own least-privilege user
    assert not [d for d in b.denials() if d["username"] == b.user("archive")]
    log = (tmp_path / "archive.log").read_text()
    assert b.passwords["archive"] not in log and "goose-test-secret" not in log


def test_archive_to_a_local_directory_is_the_same_dataset(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    b = acl_broker
    r = b.root()
    publish(r, b, 120)
    root = tmp_path / "archive"
    proc, _ = start_archive(b, tmp_path, f"file://{root}")
    try:
        wait_until(lambda: archive_done(r, b), timeout=90)
    finally:
        assert stop(proc) == 0, (tmp_path / "archive.log").read_text()[-3000:]
    assert_exactly_once(Objects(root=root), r, b, events=120, records=24)
    # no staging file left behind by a clean run; outside the datasets only the archive's own records:
    # the write check, the deployment record and the positions record (docs/archive.md "Guarantees")
    others = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and not p.name.endswith(".parquet"))
    assert others == [Path("_goose-ingest/deployment.json"), Path("_goose-ingest/positions/goose-ingest-archive.json"),
                      Path("_goose-ingest/write-check")]


def test_sigkill_between_write_and_ack_leaves_no_gap_and_no_duplicate(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    """Killed after the objects of a segment exist but before its entries are acknowledged; new
    entries arrive meanwhile. The next start reads its pending entries again (same first id, and
    more) and rewrites the same objects: every entry archived exactly once."""
    b = acl_broker
    r = b.root()
    publish(r, b, 100)
    log = tmp_path / "archive.log"
    proc, _ = start_archive(b, tmp_path, f"s3://{BUCKET}", GOOSE_INGEST_TEST_ARCHIVE_HOLD_BEFORE_ACK_S="30", **s3.env())
    try:
        wait_until(lambda: "holding" in log.read_text(), timeout=90)
        wait_until(lambda: len(s3.keys(BUCKET, "raw")) >= 1, timeout=30)
        written_before = s3.keys(BUCKET)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not archive_done(r, b)  # nothing acknowledged yet
    publish(r, b, 40, tag="b")
    proc, _ = start_archive(b, tmp_path, f"s3://{BUCKET}", **s3.env())
    try:
        wait_until(lambda: archive_done(r, b), timeout=90)
    finally:
        assert stop(proc) == 0, log.read_text()[-3000:]
    objects = Objects(s3=s3)
    assert set(written_before) <= set(objects.keys())  # rewritten under the same names
    assert_exactly_once(objects, r, b, events=140, records=28)


def pending_by_consumer(r: redis.Redis, b: AclBroker, group: str = "goose-ingest-archive") -> dict[str, dict[str, list[bytes]]]:
    """{consumer: {stream: [pending ids]}} of the archive's group on every stream it reads."""
    layout = b.settings.layout
    out: dict[str, dict[str, list[bytes]]] = {}
    for stream in [*layout.raw_streams(), *layout.control_streams(), *layout.events_partitions(), *layout.runs_partitions()]:
        for row in r.xpending_range(stream, group, min="-", max="+", count=100_000):
            out.setdefault(row["consumer"].decode(), {}).setdefault(stream, []).append(row["message_id"])
    return out


def test_a_dead_consumer_names_pending_entries_are_taken_over_by_another_name(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """Issue 20/23 (the bug: the archive never took over another consumer name's pending entries, so
    they were never archived and held back the raw trim for good). `archive --consumer first` is
    SIGKILLed after writing a segment's object and before acknowledging it, with more entries read
    and pending; new entries arrive; `archive` (the default name) starts. At defaults for
    CLAIM_IDLE_MS (30 s) and SWEEP_INTERVAL_S (5 s): everything is archived exactly once (the
    killed segment rewritten under its own name), nothing stays pending under `first`, and the raw
    trim then removes what `first` had left pending."""
    b = acl_broker
    r = b.root()
    r.config_set("stream-node-max-entries", 1)  # exact trims: the test sees each entry go
    root = tmp_path / "archive"
    url = f"file://{root}"
    defaults = {"GOOSE_INGEST_SWEEP_INTERVAL_S": "5"}  # start_archive shortens it; CLAIM_IDLE_MS is never set
    publish(r, b, 100)
    first, _ = start_archive(b, tmp_path, url, "first.log", ("--consumer", "first"),
                             GOOSE_INGEST_TEST_ARCHIVE_HOLD_BEFORE_ACK_S="60", **defaults)
    try:
        wait_until(lambda: "holding" in (tmp_path / "first.log").read_text(), timeout=90)
        written_before = Objects(root=root).keys("raw")
        assert written_before
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    left = pending_by_consumer(r, b).get("first", {})
    raw_left = {s: ids for s, ids in left.items() if s in b.settings.layout.raw_streams()}
    assert raw_left, left  # the written segment, at least, is pending under the dead name
    worker_committed_everything(b)
    time.sleep(0.5)  # past the 0.36 s retention of trim_as_worker
    trim_as_worker(b, url)
    assert all(r.xrange(s, min=ids[0], max=ids[0]) for s, ids in raw_left.items())  # held back: not archived
    publish(r, b, 40, tag="b")
    second, _ = start_archive(b, tmp_path, url, "second.log", **defaults)
    try:
        wait_until(lambda: archive_done(r, b), timeout=120)
        assert pending_by_consumer(r, b) == {}
        objects = Objects(root=root)
        assert set(written_before) <= set(objects.keys("raw"))  # rewritten under the same names
        assert_exactly_once(objects, r, b, events=140, records=28)
        assert "took over" in (tmp_path / "second.log").read_text()
        # the trim proceeds: the archive's position moves past `first`'s entries (the frontier is in
        # whole milliseconds, so a later round moves it past the last one archived)
        time.sleep(0.01)
        publish(r, b, 2, tag="c")
        wait_until(lambda: archive_done(r, b), timeout=60)
    finally:
        assert stop(second) == 0, (tmp_path / "second.log").read_text()[-3000:]
    worker_committed_everything(b)
    time.sleep(0.5)
    trim_as_worker(b, url)
    assert not any(r.xrange(s, min=i, max=i) for s, ids in raw_left.items() for i in ids)


@pytest.mark.parametrize("url,extra,expect", [
    ("s3://goose-ingest-no-such-bucket/x", {}, "bucket not found"),  # a fixed name: pytest-xdist needs one collection
    ("ftp://somewhere/x", {}, "unsupported scheme"),
    ("file://relative/dir", {}, "absolute path"),
])
def test_bad_store_exits_2_with_one_line(acl_broker: AclBroker, s3: S3Server, tmp_path: Path, url, extra, expect):  # noqa: F811
    b = acl_broker
    done = b.cli("archive", "archive", timeout=60, GOOSE_INGEST_ARCHIVE_URL=url, GOOSE_INGEST_METRICS_PORT="0", **s3.env(), **extra)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "goose-ingest" in line and "error" in line.lower() or expect in line]
    assert len(lines) == 1 and expect in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "goose-test-secret" not in done.stderr


def test_endpoint_that_is_not_s3_exits_2(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """An HTTP server that answers, but not as S3 (a web page): one line, exit 2."""
    (tmp_path / "www").mkdir()
    web = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(tmp_path / "www")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = web.stdout.readline() if web.stdout else ""
        port = line.split("port ")[1].split(" ")[0]
        done = acl_broker.cli("archive", "archive", GOOSE_INGEST_ARCHIVE_URL=f"s3://{BUCKET}/x", GOOSE_INGEST_METRICS_PORT="0",
                              AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s",
                              AWS_REGION="us-east-1")
    finally:
        web.terminate()
        web.wait(timeout=10)
    assert done.returncode == 2, done.stderr
    assert "not an S3 endpoint" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_no_archive_configured_exits_2(acl_broker: AclBroker):  # noqa: F811
    done = acl_broker.cli("archive", "archive", GOOSE_INGEST_METRICS_PORT="0")
    assert done.returncode == 2 and "GOOSE_INGEST_ARCHIVE_URL" in done.stderr and "Traceback" not in done.stderr


def test_permission_refused_while_running_is_one_line_not_ready_and_no_crash_loop(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    """The store lists (start-up check passes) but refuses writes (a bucket policy, an IAM policy):
    the process stays up, says why on /readyz, logs the reason once, acknowledges nothing; when the
    permission comes back it archives everything."""
    b = acl_broker
    r = b.root()
    proxy = S3Proxy(s3.port)
    proc, port_file = start_archive(b, tmp_path, f"s3://{BUCKET}", **s3.env(AWS_ENDPOINT_URL=proxy.endpoint))
    try:
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=60)  # started: it could write then
        proxy.deny_writes = True  # the policy changes under it
        publish(r, b, 30)
        wait_until(lambda: "credentials refused or not allowed" in http(port_file, "/readyz")[1], timeout=60)
        status, body = http(port_file, "/readyz")
        assert status == 503 and "AccessDenied" in body
        time.sleep(3)  # several retries
        assert proc.poll() is None, "the archive exited instead of waiting for the permission"
        assert not archive_done(r, b) and [k for k in s3.keys(BUCKET) if not k.startswith("_goose-ingest/")] == []
        log = (tmp_path / "archive.log").read_text()
        assert log.count("AccessDenied") == 1, log  # one line, not one per retry
        assert 'goose_ingest_archive_write_failures_total{kind="store"}' in http(port_file, "/metrics")[1]
        proxy.deny_writes = False
        wait_until(lambda: archive_done(r, b), timeout=90)
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=30)
    finally:
        assert stop(proc) == 0
        proxy.close()
    assert_exactly_once(Objects(s3=s3), r, b, events=30, records=6)


def test_writes_refused_at_start_exit_2_with_one_line(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    """A credential that may list but not write (read-only key, a policy without s3:PutObject):
    found at start by the write check, not minutes later at the first cut."""
    proxy = S3Proxy(s3.port)
    proxy.deny_writes = True
    try:
        done = acl_broker.cli("archive", "archive", GOOSE_INGEST_ARCHIVE_URL=f"s3://{BUCKET}/x", GOOSE_INGEST_METRICS_PORT="0",
                              **s3.env(AWS_ENDPOINT_URL=proxy.endpoint))
    finally:
        proxy.close()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "writing refused (AccessDenied" in lines[0], done.stderr


def test_slow_store_still_archives_everything_once(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    b = acl_broker
    r = b.root()
    proxy = S3Proxy(s3.port)
    proxy.delay_s = 0.4  # every request
    publish(r, b, 60)
    proc, port_file = start_archive(b, tmp_path, f"s3://{BUCKET}", **s3.env(AWS_ENDPOINT_URL=proxy.endpoint))
    try:
        wait_until(lambda: archive_done(r, b), timeout=120)
        metrics = http(port_file, "/metrics")[1]
    finally:
        assert stop(proc) == 0
        proxy.close()
    assert_exactly_once(Objects(s3=s3), r, b, events=60, records=12)
    # the latency histogram saw the slow writes: none of the raw segments took under 0.25 s
    assert 'goose_ingest_archive_segment_write_seconds_bucket{dataset="raw",le="0.25"} 0.0' in metrics


def test_up_archives_to_a_local_folder_beside_the_spool(settings, tmp_path: Path):
    """`goose-ingest up` runs the archive beside its worker (docs/archive.md "Locally"): a run's raw
    entries and events land under <state>/archive, and the process still stops cleanly."""
    import re

    from tests.e2e.test_commands_live import TRANSCRIPTS, _publish
    from tests.support.pipeline import ended_runs

    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update(GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "state" / "spool"),
               GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="0.5")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up"], cwd=REPO, env=env, stderr=subprocess.PIPE,
                            text=True)
    root = tmp_path / "state" / "archive"
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            match = re.search(r"export GOOSE_INGEST_REDIS_URL=(\S+)", proc.stderr.readline() if proc.stderr else "")
            url = match.group(1) if match else None
        assert url, "`up` did not print the broker URL"
        local = settings.model_copy(update={"redis_url": url, "namespace": ""})
        _publish(local, "up/archived", TRANSCRIPTS[0])
        wait_until(lambda: "up/archived" in ended_runs(local), timeout=60)
        objects = Objects(root=root)
        wait_until(lambda: any(e.fields.get(b"run") == b"up/archived" for e in objects.raw_entries())
                   and objects.keys("events") and objects.keys("runs"), timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    lines = [e for e in Objects(root=root).raw_entries() if e.fields.get(b"run") == b"up/archived"]
    assert len(lines) == len({e.id for e in lines}) > 0


def test_archive_on_a_redis_cluster_reads_each_shard_in_its_slot(cluster_settings, tmp_path: Path):
    """On a cluster the streams of a shard share a slot ({s<i>}): one XREADGROUP per shard and one
    MULTI per acknowledgement work there. In-process (the loop is the same code the command runs)."""
    from services.archive.consumer import Archiver
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import open_store
    from services.broker.connect import sync_client

    settings = cluster_settings.model_copy(update={"archive_url": f"file://{tmp_path / 'archive'}",
                                                   "archive_segment_max_age_s": 0.2, "shards": 4})
    layout = settings.layout
    client = sync_client(settings)
    want = []
    for shard in range(settings.shards):
        for i in range(30):
            sid = client.xadd(layout.raw_stream(shard), {"run": f"r{shard}", "seq": str(i), "line": bytes([i, 255])})
            want.append((shard, "raw", sid.decode()))
        for stream in (layout.events_partition(shard), layout.runs_partition(shard)):
            client.xadd(stream, {"junk": "not a topic entry"})  # no lake row, still acknowledged
    store = open_store(settings)
    assert store is not None
    archiver = Archiver(settings, client, store, ArchiveMetrics())
    archiver.ensure_groups()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        archiver.step()
        if all(not info["pending"] and not info["lag"] for src in archiver.all
               for info in client.xinfo_groups(src.stream) if info["name"].decode() == settings.archive_group):
            break
        time.sleep(0.1)
    got = Objects(root=tmp_path / "archive").raw_entries()
    assert sorted((e.shard, e.stream, e.id) for e in got) == sorted(want)
    assert archiver.metrics.lake_rejected._value.get() == 2 * settings.shards


def test_repeated_sigkill_at_random_moments_while_entries_arrive(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """Killed (SIGKILL) three times at random moments while entries keep arriving and segments are
    cut every 0.2 s: reading, writing, acknowledging. Every object in the store is a whole segment,
    and every entry is in exactly one."""
    import random
    import threading

    b = acl_broker
    r = b.root()
    root = tmp_path / "archive"
    stop_publishing = threading.Event()
    rounds = [0]

    def keep_publishing() -> None:
        while not stop_publishing.is_set():
            publish(r, b, 20, tag=f"p{rounds[0]}")
            rounds[0] += 1
            time.sleep(0.05)

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    rng = random.Random(23)
    try:
        for _ in range(3):
            proc, _ = start_archive(b, tmp_path, f"file://{root}", GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="0.2")
            time.sleep(2.0 + rng.random() * 2.0)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        stop_publishing.set()
        publisher.join(timeout=30)
    proc, _ = start_archive(b, tmp_path, f"file://{root}", GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="0.2")
    try:
        wait_until(lambda: archive_done(r, b), timeout=120)
    finally:
        assert stop(proc) == 0, (tmp_path / "archive.log").read_text()[-3000:]
    assert rounds[0] > 5
    assert_exactly_once(Objects(root=root), r, b, events=20 * rounds[0], records=4 * rounds[0])


@pytest.mark.parametrize("role", ["consumer", "worker"])
def test_the_wrong_redis_user_exits_2_with_one_line(acl_broker: AclBroker, tmp_path: Path, role: str):  # noqa: F811
    """Under a user without the archive's permissions (the read-only consumer may not create a group)
    or with a wrong password: one line naming the problem, exit 2."""
    b = acl_broker
    env = b.env(role, GOOSE_INGEST_ARCHIVE_URL=f"file://{tmp_path / 'a'}", GOOSE_INGEST_METRICS_PORT="0")
    if role == "worker":
        env["GOOSE_INGEST_REDIS_PASSWORD"] = "wrong"
    done = subprocess.run([sys.executable, "-m", "services.cli", "archive"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "goose-ingest archive:" in line]
    assert len(lines) == 1 and ("NOPERM" in lines[0] or "refused the credentials" in lines[0]), done.stderr
    assert "Traceback" not in done.stderr and "wrong" not in lines[0]


def test_memory_budget_turns_held_entries_into_row_groups_not_small_segments(settings, tmp_path: Path):
    """ARCHIVE_BUFFER_MAX_BYTES bounds what the open segments hold as Python objects: with an hour's
    age cut and a 1 MiB budget, 4 MiB of lines are held as compressed row groups of still-open
    segments (no early, small segment), then written whole, each entry once."""
    import pyarrow.parquet as pq

    from services.archive.consumer import Archiver
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import open_store
    from services.broker.connect import sync_client

    settings = settings.model_copy(update={"archive_url": f"file://{tmp_path / 'archive'}", "archive_segment_max_age_s": 3600,
                                           "archive_buffer_max_bytes": 1024 * 1024, "batch_size": 50})
    client = sync_client(settings)
    line = b"x" * 4000
    pipe = client.pipeline(transaction=False)
    for i in range(1000):
        pipe.xadd(settings.layout.raw_stream(i % settings.shards), {"run": "big", "seq": str(i), "line": line})
    pipe.execute()
    archiver = Archiver(settings, client, open_store(settings), ArchiveMetrics())  # type: ignore[arg-type]
    archiver.ensure_groups()
    peak = 0
    for _ in range(100):
        archiver.step()
        peak = max(peak, sum(src.size for src in archiver.all))
    assert Objects(root=tmp_path / "archive").keys("raw") == []  # nothing cut early
    assert peak <= 1024 * 1024 + settings.shards * settings.batch_size * 4100  # the budget plus one read per stream
    archiver.flush_on_stop()  # as on SIGTERM: the open segments, whole
    objects = Objects(root=tmp_path / "archive")
    assert sorted(int(e.fields[b"seq"]) for e in objects.raw_entries()) == list(range(1000))
    keys = objects.keys("raw")
    assert len(keys) == settings.shards
    assert all(pq.read_metadata(tmp_path / "archive" / k).num_row_groups > 1 for k in keys)


def test_memory_budget_cuts_the_largest_lake_segment_early(settings, tmp_path: Path):
    """The event lake is split by (date, type) at the cut, so it is not encoded incrementally: past
    the budget its largest open segment is cut early. Every event is still in the lake once."""
    from services.archive.consumer import Archiver
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import open_store
    from services.broker.connect import sync_client

    settings = settings.model_copy(update={"archive_url": f"file://{tmp_path / 'archive'}", "archive_segment_max_age_s": 3600,
                                           "archive_buffer_max_bytes": 1024 * 1024, "batch_size": 50})
    client = sync_client(settings)
    pipe = client.pipeline(transaction=False)
    for i in range(600):
        doc = {"eventId": f"r:{i}", "runId": "r", "seq": i, "type": "agent", "timestamp": "2026-12-03T10:00:00.000Z",
               "text": "y" * 4000}
        pipe.xadd(settings.layout.events_partition(0), {"eventId": doc["eventId"], "runId": "r", "seq": str(i),
                                                        "type": "agent", "data": orjson.dumps(doc)})
    pipe.execute()
    archiver = Archiver(settings, client, open_store(settings), ArchiveMetrics())  # type: ignore[arg-type]
    archiver.ensure_groups()
    for _ in range(100):
        archiver.step()
    assert len(Objects(root=tmp_path / "archive").keys("events")) >= 2  # cut by the budget, not by the hour
    archiver.flush_on_stop()
    ids = Objects(root=tmp_path / "archive").event_ids()
    assert sorted(ids, key=lambda e: int(e.split(":")[1])) == [f"r:{i}" for i in range(600)]


def test_two_dead_consumers_each_rewritten_under_its_own_objects_name_poison_archived(settings, tmp_path: Path, caplog):
    """Two archives died one after the other under their own names, each after writing the object
    of its segment and before acknowledging it; the first one's entries were delivered more than
    MAX_DELIVERIES times (poison, for a consumer with a dead-letter stream). The successor, with
    entries of its own open, takes them over one consumer at a time, each as a segment of its own
    under the dead consumer's object's name: every entry archived exactly once (the poison too,
    with a warning), no two segments of the stream overlapping in id range, nothing left pending."""
    from types import SimpleNamespace

    from services.archive.consumer import Archiver
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import open_store
    from services.broker.connect import sync_client

    root = tmp_path / "archive"
    settings = settings.model_copy(update={"archive_url": f"file://{root}", "claim_idle_ms": 200,
                                           "sweep_interval_s": 0.1, "archive_segment_max_age_s": 3600})
    client = sync_client(settings)
    store = open_store(settings)
    assert store is not None
    group, raw0 = settings.archive_group, settings.layout.raw_stream(0)
    archiver = Archiver(settings, client, store, ArchiveMetrics())  # type: ignore[arg-type]
    archiver.ensure_groups()
    dead_objects = []
    for name in ("dead-1", "dead-2"):
        for i in range(10):
            client.xadd(raw0, {"run": name, "seq": str(i), "line": b"\xff" + name.encode()})
        [[_, read]] = client.xreadgroup(group, name, {raw0: ">"}, count=10)
        entries = [sg.ArchivedEntry(0, "raw", i.decode(), f) for i, f in read]
        writer = sg.RawSegmentWriter()
        writer.add(entries)
        dead_objects.append(sg.raw_segment_key("raw", 0, entries[0].id, entries[-1].id))
        store.put(dead_objects[-1], writer.finish())  # written, never acknowledged: then it died
        if name == "dead-1":
            for _ in range(settings.max_deliveries + 1):
                client.xclaim(raw0, group, name, 0, [e.id for e in entries])
    for i in range(5):
        client.xadd(raw0, {"run": "own", "seq": str(i), "line": b"own"})
    b = SimpleNamespace(settings=settings)
    deadline = time.monotonic() + 60
    while set(pending_by_consumer(client, b, group)) - {"archive"} and time.monotonic() < deadline:  # type: ignore[arg-type]
        for i in range(2):  # own entries keep arriving: its segment is open when a takeover starts
            client.xadd(raw0, {"run": "own", "seq": f"late-{time.monotonic()}-{i}", "line": b"own"})
        archiver.step()
        time.sleep(0.05)
    for _ in range(5):  # read what is left (the age cut is an hour: the open segments stay open)
        archiver.step()
    archiver.flush_on_stop()  # as on SIGTERM: the open segments, whole
    assert pending_by_consumer(client, b, group) == {}  # type: ignore[arg-type]
    objects = Objects(root=root)
    assert set(dead_objects) <= set(objects.keys("raw"))  # rewritten under the same names
    assert_exactly_once(objects, client, b, events=0, records=0)  # type: ignore[arg-type]
    ranges = sorted((sg.id_parts(es[0].id), sg.id_parts(es[-1].id))
                    for es in (sg.decode_raw_segment(objects.get(k)) for k in objects.keys("raw") if "shard=000/raw-" in k))
    assert len(ranges) >= 3 and all(a[1] < b_[0] for a, b_ in zip(ranges, ranges[1:], strict=False)), ranges  # no overlap
    assert any("delivered more than" in r.getMessage() for r in caplog.records)
