"""The log of record never loses or doubles an entry (issue 32): the archive under a broker that
comes back from an older snapshot, a second archive process on the same group, a lost group whose
head was trimmed already, another deployment's store, and the runbook's "the trim goes on without
the archive" procedure as docs/archive.md writes it.

Real parts only: a real redis-server with the shipped ACL roles (the archive runs as
`goose-archive`), SIGKILLed and restarted from its own RDB snapshot; the archive as real processes;
the store a local directory (file://) read back by the project's reader (`read_raw`, which keeps one
copy per stream id) AND object by object (no entry may be in two objects where the archive could
know better).
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import redis

from services.archive import segments as sg
from services.archive.reader import read_raw
from services.archive.store import open_store
from services.archive.window import Window
from services.metrics.server import read_port_file
from services.settings import Settings
from tests.archive.test_archive import (
    Objects,
    archive_done,
    http,
    publish,
    start_archive,
    stop,
    trim_as_worker,
    worker_committed_everything,
)
from tests.broker.test_acl import ROOT_PASSWORD, ROOT_USER, AclBroker, acl_broker  # noqa: F401 (fixture)
from tests.support.pipeline import wait_until
from tests.support.redis_snapshot import restart_from_its_snapshot as restart


def restart_from_its_snapshot(b: AclBroker) -> None:
    """SIGKILL the broker and start it again from its last RDB snapshot (tests/support/redis_snapshot.py)."""
    restart(b.server, b.root)


def raw_objects(root: Path) -> dict[str, list[sg.ArchivedEntry]]:
    store = open_store(Settings(archive_url=root.as_uri()))
    assert store is not None
    return {key: sg.decode_raw_segment(store.get(key)) for key in store.list("raw/")}


def read_back(root: Path) -> list[sg.ArchivedEntry]:
    """What `replay --source archive` / `reprocess` read: every entry once."""
    store = open_store(Settings(archive_url=root.as_uri()))
    assert store is not None
    got = read_raw(store, Window())
    assert not got.corrupt
    return [sg.ArchivedEntry(e.shard, e.stream, e.sid, e.fields) for e in got.entries]


def in_two_objects(objects: dict[str, list[sg.ArchivedEntry]]) -> list[tuple[str, int, str]]:
    seen: dict[tuple[str, int, str], str] = {}
    twice = []
    for key, entries in objects.items():
        for e in entries:
            ident = (e.stream, e.shard, e.id)
            if ident in seen:
                twice.append(ident)
            seen[ident] = key
    return twice


def metric(port_file: Path, name: str) -> float:
    _, port = read_port_file(str(port_file)) or ("", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def raw_line(i: int, tag: str = "rb") -> dict[str, str | bytes]:
    return {"run": f"run-{tag}", "seq": str(i), "kind": "line", "line": b'{"i":' + str(i).encode() + b"}"}


def all_archived(r: redis.Redis, b: AclBroker) -> bool:
    """archive_done, also where Redis cannot tell the lag (a group created at an id of its choice, a
    trimmed stream: XINFO's lag is nil): delivered up to the stream's last id, nothing pending."""
    if not archive_done(r, b):
        return False
    layout = b.settings.layout
    for stream in [*layout.raw_streams(), *layout.control_streams(), *layout.events_partitions(), *layout.runs_partitions()]:
        last = r.xinfo_stream(stream)["last-generated-id"]
        info = next(g for g in r.xinfo_groups(stream) if g["name"].decode() == b.settings.archive_group)
        if sg.id_parts(info["last-delivered-id"].decode()) < sg.id_parts(last.decode()):
            return False
    return True


def pending(r: redis.Redis, stream: str, group: str) -> int:
    try:
        return int(r.xpending(stream, group)["pending"])
    except redis.ResponseError:
        return -1


def test_redis_back_from_an_older_snapshot_loses_and_doubles_nothing(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """Issue 32 finding 1: 20 entries archived in one object; Redis SIGKILLed and restarted from an
    RDB snapshot holding the first 10 (pending in the archive's group). The running archive notices
    (run_id), reports the 10 Redis lost (metric + one line), acknowledges the 10 that are pending
    again without writing them twice, so the trim is not held; a restart of the archive rewrites
    nothing; 20 archived entries readable once each, then new entries archived as usual."""
    b = acl_broker
    r = b.root()
    raw0, group = b.settings.layout.raw_stream(0), b.settings.archive_group
    root = tmp_path / "archive"
    log = tmp_path / "archive.log"
    proc, port_file = start_archive(b, tmp_path, root.as_uri(), GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="8")
    try:
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=90)
        first = [r.xadd(raw0, raw_line(i)) for i in range(10)]
        wait_until(lambda: pending(r, raw0, group) == 10, timeout=30)  # read, in the open segment
        r.save()  # the snapshot: 10 entries, pending in the archive's group
        rest = [r.xadd(raw0, raw_line(i)) for i in range(10, 20)]
        wait_until(lambda: all_archived(r, b), timeout=60)
        objects = raw_objects(root)
        assert [len(v) for v in objects.values()] == [20]  # one object of 20
        the_object = dict(objects)

        restart_from_its_snapshot(b)  # SIGKILL: everything after the snapshot is gone from Redis
        assert r.xlen(raw0) == 10 and pending(r, raw0, group) == 10
        wait_until(lambda: "went back in time" in log.read_text(), timeout=60)
        wait_until(lambda: pending(r, raw0, group) == 0, timeout=60)  # the trim is not held by them
        assert metric(port_file, 'goose_ingest_archive_broker_lost_entries_total{dataset="raw"}') == 10
        assert metric(port_file, 'goose_ingest_archive_already_archived_total{dataset="raw"}') == 10
        lines = [line for line in log.read_text().splitlines() if "went back in time" in line]
        assert len(lines) == 1 and "(10 entries)" in lines[0], lines
        later = [r.xadd(raw0, raw_line(i)) for i in range(20, 25)]
        wait_until(lambda: all_archived(r, b), timeout=60)
    finally:
        assert stop(proc) == 0, log.read_text()[-3000:]
    # Its next start: nothing rewritten, nothing replaced.
    proc, port_file = start_archive(b, tmp_path, root.as_uri(), log_name="archive-2.log")
    try:
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=90)
        time.sleep(2)
        assert archive_done(r, b)
    finally:
        assert stop(proc) == 0
    objects = raw_objects(root)
    for key, entries in the_object.items():
        assert objects[key] == entries  # the object of 20 is still whole
    assert not in_two_objects(objects)
    ids = [e.id for e in read_back(root) if e.stream == "raw"]
    want = [i.decode() for i in first + rest + later]
    assert sorted(ids, key=sg.id_parts) == want  # 25 entries, each once


def test_a_restart_that_lost_nothing_after_a_trim_reports_no_loss(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """The other side of the rollback check: 20 entries archived, the workers' trim takes the first 15
    (XTRIM leaves no max-deleted-entry-id), Redis restarted from a snapshot taken after that trim
    (nothing lost). The archive notices the restart and reports no loss: no "went back in time"
    line, the lost-entries counter at 0, although 15 archived ids are no longer in Redis."""
    b = acl_broker
    r = b.root()
    raw0 = b.settings.layout.raw_stream(0)
    root = tmp_path / "archive"
    log = tmp_path / "archive.log"
    proc, port_file = start_archive(b, tmp_path, root.as_uri(), GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="8")
    try:
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=90)
        ids = [r.xadd(raw0, raw_line(i, "trim")) for i in range(20)]
        wait_until(lambda: all_archived(r, b), timeout=60)
        assert r.xtrim(raw0, minid=ids[15].decode(), approximate=False) == 15
        r.save()  # the snapshot holds everything Redis holds: the restart loses nothing
        restart_from_its_snapshot(b)
        wait_until(lambda: "broker check (" in log.read_text(), timeout=60)
        later = [r.xadd(raw0, raw_line(i, "trim")) for i in range(20, 25)]
        wait_until(lambda: all_archived(r, b), timeout=60)
        assert metric(port_file, 'goose_ingest_archive_broker_lost_entries_total{dataset="raw"}') == 0
    finally:
        assert stop(proc) == 0, log.read_text()[-3000:]
    assert "went back in time" not in log.read_text(), log.read_text()[-3000:]
    read = [e.id for e in read_back(root) if e.stream == "raw"]
    assert sorted(read, key=sg.id_parts) == [i.decode() for i in ids + later]


def test_a_second_archive_is_refused_and_kills_lose_and_double_nothing(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """Issue 32 finding 2: a second archive on the same group exits 2 with one line while the first
    runs; each is SIGKILLed and restarted in turn while entries arrive (per-process consumer names,
    the lease taken over from a dead holder): every entry archived, none in two objects."""
    b = acl_broker
    r = b.root()
    root = tmp_path / "archive"
    url = root.as_uri()
    a, port_a = start_archive(b, tmp_path, url, log_name="a.log")
    procs = [a]
    try:
        wait_until(lambda: http(port_a, "/readyz")[0] == 200, timeout=90)
        publish(r, b, 30, tag="one")
        second = b.cli("archive", "archive", timeout=90, GOOSE_INGEST_ARCHIVE_URL=url, GOOSE_INGEST_METRICS_PORT="0")
        assert second.returncode == 2, second.stderr
        refusals = [line for line in second.stderr.splitlines() if "another archive is running" in line]
        assert len(refusals) == 1 and "Traceback" not in second.stderr, second.stderr
        for round_ in range(3):
            publish(r, b, 20, tag=f"r{round_}")
            time.sleep(0.3 * round_)  # killed at different moments of its segments
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait(timeout=30)
            publish(r, b, 10, tag=f"k{round_}")
            nxt, port = start_archive(b, tmp_path, url, log_name=f"p{round_}.log")
            procs.append(nxt)
            wait_until(lambda port=port: http(port, "/readyz")[0] == 200, timeout=90)
        wait_until(lambda: all_archived(r, b), timeout=90)
    finally:
        for p in procs:
            if p.poll() is None:
                stop(p)
    objects = raw_objects(root)
    assert not in_two_objects(objects)
    want = {(kind, shard, i.decode()) for shard in range(b.settings.shards)
            for kind, stream in (("raw", b.settings.layout.raw_stream(shard)), ("control", b.settings.layout.control_stream(shard)))
            for i, _ in r.xrange(stream)}
    got = [(e.stream, e.shard, e.id) for e in read_back(root)]
    assert len(got) == len(set(got)) and set(got) == want
    events = Objects(root=root).event_ids()
    assert set(events) == {f"run-{tag}-{i % 3}:{i}" for tag, n in
                           [("one", 30)] + [(f"r{k}", 20) for k in range(3)] + [(f"k{k}", 10) for k in range(3)]
                           for i in range(n)}
    consumers = {row["name"].decode() for row in r.xinfo_consumers(b.settings.layout.raw_stream(0), b.settings.archive_group)}
    assert len(consumers) == 1  # the dead processes' names were taken over and removed


def test_a_lost_group_resumes_from_what_the_archive_holds(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """Issue 32 finding 3: 100 archived, the head trimmed, the group destroyed (as the old runbook
    said) while the archive runs, 50 added: the group comes back after what the store holds, so the
    70 retained entries are not archived again: 150 entries, each in one object."""
    b = acl_broker
    r = b.root()
    raw0, group = b.settings.layout.raw_stream(0), b.settings.archive_group
    root = tmp_path / "archive"
    proc, port_file = start_archive(b, tmp_path, root.as_uri())
    try:
        ids = [r.xadd(raw0, raw_line(i, "lost")) for i in range(100)]
        wait_until(lambda: all_archived(r, b), timeout=90)
        r.xtrim(raw0, minid=ids[30].decode())
        r.xgroup_destroy(raw0, group)
        ids += [r.xadd(raw0, raw_line(i, "lost")) for i in range(100, 150)]
        wait_until(lambda: all_archived(r, b), timeout=90)
        assert metric(port_file, 'goose_ingest_archive_already_archived_total{dataset="raw"}') == 0
    finally:
        assert stop(proc) == 0
    objects = raw_objects(root)
    assert not in_two_objects(objects)
    assert sorted((e.id for e in read_back(root) if e.stream == "raw"), key=sg.id_parts) == [i.decode() for i in ids]


def test_another_deployments_archive_url_exits_2_with_one_line(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """Two deployments, one archive URL: the second one's archive is refused (one line, exit 2),
    whether its broker has an archive id of its own or none; the store is untouched by it."""
    b = acl_broker
    root = tmp_path / "archive"
    url = root.as_uri()
    proc, port_file = start_archive(b, tmp_path, url)
    try:
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=90)
    finally:
        assert stop(proc) == 0
    before = sorted(p.name for p in root.rglob("*"))
    r = b.root()
    other = b.settings.model_copy(update={"namespace": b.settings.namespace + "x"})  # its keys: another deployment
    as_root = {"GOOSE_INGEST_REDIS_USERNAME": ROOT_USER, "GOOSE_INGEST_REDIS_PASSWORD": ROOT_PASSWORD}
    # a broker with no archive id (a new deployment) ...
    done = b.cli("admin", "archive", timeout=60, GOOSE_INGEST_ARCHIVE_URL=url, GOOSE_INGEST_METRICS_PORT="0",
                 GOOSE_INGEST_NAMESPACE=other.namespace, **as_root)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if "belongs to deployment" in line], done.stderr
    # ... and one whose archive has written elsewhere already
    r.set(other.layout.archive_identity(other.archive_group), "f" * 32)
    done = b.cli("admin", "archive", timeout=60, GOOSE_INGEST_ARCHIVE_URL=url, GOOSE_INGEST_METRICS_PORT="0",
                 GOOSE_INGEST_NAMESPACE=other.namespace, **as_root)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "another deployment" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in root.rglob("*")) == before


def test_the_runbook_lets_the_trim_go_on_without_the_archive(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """docs/archive.md "When the archive is down or behind", the last resort, as written: stop the
    archive, move its group past everything (`XGROUP DESTROY` + `XGROUP CREATE ... $` on every raw
    and control stream, as the admin user); the next trim goes on; the archive started again later
    archives what arrives from then on, archives nothing twice, and says what it skipped."""
    b = acl_broker
    r = b.root()
    admin = b.client("admin")
    layout, group = b.settings.layout, b.settings.archive_group
    root = tmp_path / "archive"
    r.config_set("stream-node-max-entries", 1)  # XTRIM MINID ~ then trims entry by entry: the test sees each one
    proc, port_file = start_archive(b, tmp_path, root.as_uri())
    try:
        publish(r, b, 20, tag="before")
        wait_until(lambda: all_archived(r, b), timeout=90)
    finally:
        assert stop(proc) == 0  # 1. stop the archive (its store is down: it could not write)
    publish(r, b, 20, tag="stuck")  # what it would never get to
    time.sleep(0.01)
    publish(r, b, 2, tag="late")  # the committed position's own millisecond stays: move past the stuck ones
    for stream in [*layout.raw_streams(), *layout.control_streams()]:  # 2. as written in the runbook
        admin.xgroup_destroy(stream, group)
        admin.xgroup_create(stream, group, id="$")
    worker_committed_everything(b)
    time.sleep(0.5)
    trim_as_worker(b, root.as_uri())  # 3. the trim goes on
    left = {f[b"run"] for s in layout.raw_streams() for _, f in r.xrange(s)}
    assert not any(run.startswith(b"run-stuck") for run in left), left
    publish(r, b, 5, tag="after")
    log = tmp_path / "archive-again.log"
    proc, port_file = start_archive(b, tmp_path, root.as_uri(), log_name="archive-again.log")  # 4. later
    try:
        wait_until(lambda: all_archived(r, b), timeout=90)
    finally:
        assert stop(proc) == 0
    objects = raw_objects(root)
    assert not in_two_objects(objects)
    runs = {e.fields[b"run"].decode().rsplit("-", 1)[0] for e in read_back(root) if e.stream == "raw"}
    assert runs == {"run-before", "run-after"}  # the skipped ones (stuck, late) are not in the archive
    assert "past what the archive holds" in log.read_text()


def test_the_archive_credential_is_what_the_table_says(acl_broker: AclBroker):  # noqa: F811
    """docs/operations.md "What each credential can destroy", the archive's row, against the shipped
    users: it cannot delete, trim, rewind or destroy what it archives, nor write keys outside its
    own; it CAN acknowledge in the workers' group (Redis ACLs cannot name groups: the table says so)."""
    b = acl_broker
    r = b.root()
    layout = b.settings.layout
    raw0 = layout.raw_stream(0)
    entry = r.xadd(raw0, raw_line(0, "acl"))
    r.xgroup_create(raw0, b.settings.group, id="0")
    archive = b.client("archive")
    refused = {
        "XADD": lambda: archive.xadd(raw0, {"run": "x"}),
        "XTRIM": lambda: archive.xtrim(raw0, maxlen=0),
        "XDEL": lambda: archive.xdel(raw0, entry),
        "DEL": lambda: archive.delete(raw0),
        "XGROUP DESTROY": lambda: archive.xgroup_destroy(raw0, b.settings.group),
        "XGROUP SETID": lambda: archive.xgroup_setid(raw0, b.settings.group, "$"),
        "SET elsewhere": lambda: archive.set(layout.meta(), "x"),
        "FLUSHALL": lambda: archive.flushall(),
    }
    for what, call in refused.items():
        try:
            call()
        except redis.exceptions.NoPermissionError:
            continue
        raise AssertionError(f"the archive's user may {what}")
    assert r.xlen(raw0) == 1
    # What the table says it can do to another group: read through it and acknowledge there.
    got = archive.xreadgroup(b.settings.group, "intruder", {raw0: ">"}, count=1)
    assert got and archive.xack(raw0, b.settings.group, entry) == 1
    lease = layout.archive_lease(b.settings.archive_group)
    assert archive.set(lease, "t", px=1000) and archive.delete(lease) == 1


def test_a_cluster_primary_sigkilled_mid_batch_loses_and_doubles_nothing(cluster_settings, redis_cluster, tmp_path: Path):
    """Issue 32 item 6 on the 3+3 Redis Cluster: the archive (a real process, default settings but a
    3 s segment age) holds an open segment of a shard when that shard's primary is SIGKILLed (its
    entries replicated first: the case is the consumer's, not an unreplicated write); its replica
    takes over, entries keep arriving: every entry archived, none in two objects."""
    from redis.cluster import RedisCluster

    from contracts.keys import KeyLayout
    from services.broker.connect import sync_client
    from tests.support.redis_server import cli_env

    settings = cluster_settings.model_copy(update={"shards": 4})
    layout: KeyLayout = settings.layout
    client: RedisCluster = sync_client(settings)
    root = tmp_path / "archive"
    log = tmp_path / "archive.log"
    port_file = tmp_path / "archive.port"
    env = cli_env(settings, GOOSE_INGEST_ARCHIVE_URL=root.as_uri(), GOOSE_INGEST_METRICS_PORT="0",
                  GOOSE_INGEST_METRICS_PORT_FILE=str(port_file), GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="3")
    import sys

    from tests.broker.test_acl import REPO

    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "archive"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)
    want: set[tuple[int, str]] = set()

    def publish_round(tag: str, n: int = 20) -> None:
        for shard in range(settings.shards):
            for i in range(n):
                for _ in range(100):  # through the failover: the cluster refuses until the replica took over
                    try:
                        sid = client.xadd(layout.raw_stream(shard), raw_line(i, f"{tag}-{shard}"))
                        break
                    except (redis.ConnectionError, redis.ResponseError, redis.exceptions.ClusterError,
                            redis.TimeoutError):
                        time.sleep(0.2)
                else:
                    raise AssertionError("the cluster did not take writes again")
                want.add((shard, sid.decode()))

    def synced(port: int) -> bool:
        info = redis_cluster.client(port).info("replication")
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return bool(replicas) and all(int(r["offset"]) >= int(info["master_repl_offset"]) for r in replicas)

    def archived() -> set[tuple[int, str]]:
        return {(e.shard, e.id) for e in read_back(root) if e.stream == "raw"} if root.exists() else set()

    try:
        wait_until(lambda: http(port_file, "/readyz")[0] == 200, timeout=90)
        publish_round("a")
        wait_until(lambda: want <= archived(), timeout=90)
        publish_round("b")  # read at once, held in open segments for 3 s
        raw0 = layout.raw_stream(0)
        victim_port = redis_cluster.primary_of_slot(client.keyslot(raw0))
        wait_until(lambda: synced(victim_port) and int(client.xpending(raw0, settings.archive_group)["pending"]) > 0,
                   timeout=30)
        redis_cluster.node(victim_port).kill()  # mid-batch: the shard's open segment read, not acknowledged
        publish_round("c")
        wait_until(lambda: want <= archived(), timeout=120)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            stop(proc)
        redis_cluster.restart_dead()
    objects = raw_objects(root)
    assert not in_two_objects(objects)
    assert archived() == want


def test_a_rollback_while_no_archive_ran_is_reported_at_its_start(acl_broker: AclBroker, tmp_path: Path):  # noqa: F811
    """The archive stopped, Redis restarted from a snapshot older than what the archive holds (its
    group and the deployment id not in it yet). The archive started as usual is refused (the broker
    has no id, the store has one: one line, exit 2); started once with --adopt-store, as that line
    says: one line names what Redis lost, the metric counts it, the group is created after what the
    store holds, new entries are archived, none twice."""
    b = acl_broker
    r = b.root()
    raw0 = b.settings.layout.raw_stream(0)
    root = tmp_path / "archive"
    first = [r.xadd(raw0, raw_line(i, "cold")) for i in range(10)]
    r.save()
    rest = [r.xadd(raw0, raw_line(i, "cold")) for i in range(10, 20)]
    proc, _ = start_archive(b, tmp_path, root.as_uri())
    try:
        wait_until(lambda: all_archived(r, b), timeout=90)
    finally:
        assert stop(proc) == 0
    restart_from_its_snapshot(b)
    refused = b.cli("archive", "archive", timeout=90, GOOSE_INGEST_ARCHIVE_URL=root.as_uri(), GOOSE_INGEST_METRICS_PORT="0")
    assert refused.returncode == 2 and "--adopt-store" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    log = tmp_path / "again.log"
    proc, port_file = start_archive(b, tmp_path, root.as_uri(), log_name="again.log", args=("--adopt-store",))
    try:
        wait_until(lambda: "went back in time" in log.read_text(), timeout=90)
        assert metric(port_file, 'goose_ingest_archive_broker_lost_entries_total{dataset="raw"}') == 10
        later = [r.xadd(raw0, raw_line(i, "cold")) for i in range(20, 25)]
        wait_until(lambda: all_archived(r, b), timeout=90)
    finally:
        assert stop(proc) == 0
    lines = [line for line in log.read_text().splitlines() if "went back in time" in line]
    assert len(lines) == 1 and "at start" in lines[0] and "(10 entries)" in lines[0], lines
    assert not in_two_objects(raw_objects(root))
    ids = [e.id for e in read_back(root) if e.stream == "raw"]
    assert sorted(ids, key=sg.id_parts) == [i.decode() for i in first + rest + later]


def test_positions_come_from_the_record_and_the_objects_written_after_it(settings, tmp_path: Path):
    """load_positions: a stream in the positions record, with an object created after the record
    was written (a crash between the two), and a stream not in the record at all (its first
    segment's object exists, the record was never written for it): both positions are the last ids
    those objects hold, found by listing only from the record's dates on."""
    import orjson

    from services.archive.consumer import POSITIONS_PREFIX, Archiver
    from services.archive.metrics import ArchiveMetrics
    from services.broker.connect import sync_client

    settings = settings.model_copy(update={"archive_url": (tmp_path / "archive").as_uri()})
    client = sync_client(settings)
    store = open_store(settings)
    assert store is not None
    layout = settings.layout
    raw0, raw1 = layout.raw_stream(0), layout.raw_stream(1)
    ids0 = [client.xadd(raw0, raw_line(i)).decode() for i in range(6)]
    ids1 = [client.xadd(raw1, raw_line(i)).decode() for i in range(4)]

    def segment(shard: int, stream: str, ids: list[str]) -> None:
        entries = [sg.ArchivedEntry(shard, "raw", i, dict(client.xrange(stream, min=i, max=i)[0][1])) for i in ids]
        assert store.create(sg.raw_segment_key("raw", shard, ids[0], ids[-1]), sg.encode_raw_segment(entries))

    segment(0, raw0, ids0[:3])
    store.put(f"{POSITIONS_PREFIX}{settings.archive_group}.json", orjson.dumps({"streams": {raw0: ids0[2]}}))
    segment(0, raw0, ids0[3:])  # after the record: it was never updated (killed in between)
    segment(1, raw1, ids1)  # a stream the record does not know
    archiver = Archiver(settings, client, store, ArchiveMetrics())
    archiver.load_positions()
    assert archiver.positions[raw0] == sg.id_parts(ids0[-1])
    assert archiver.positions[raw1] == sg.id_parts(ids1[-1])
    assert layout.control_stream(0) not in archiver.positions


def test_a_lease_lost_to_a_successor_fences_the_first_before_its_next_acknowledgement(settings, tmp_path: Path):
    """Two processes' leases on one group (a short TTL): the second is refused while the first
    renews; the first is cut off (renews nothing) past the TTL, the second takes the lease; the
    first's next renewal finds the other token: fenced. Its archiver then writes its segment (a
    create: harmless) but acknowledges nothing."""
    from services.archive.consumer import Archiver, Fenced
    from services.archive.fence import ArchiveBusy, Lease
    from services.archive.metrics import ArchiveMetrics
    from services.broker.connect import sync_client

    settings = settings.model_copy(update={"archive_url": (tmp_path / "archive").as_uri(), "archive_segment_max_age_s": 0.1})
    client = sync_client(settings)
    key = settings.layout.archive_lease(settings.archive_group)
    first = Lease(client, key, "first", ttl_ms=900)
    first.acquire(settings.archive_group)
    first.start()
    second = Lease(client, key, "second", ttl_ms=900)
    try:
        second.acquire(settings.archive_group)
        raise AssertionError("a second archive took a lease its holder renews")
    except ArchiveBusy as exc:
        assert "another archive is running" in str(exc) and "first" in str(exc)
    first._stop.set()  # cut off: it renews nothing any more
    second.acquire(settings.archive_group)  # the TTL runs out: taken
    store = open_store(settings)
    assert store is not None
    archiver = Archiver(settings, client, store, ArchiveMetrics(), consumer="first")
    archiver.lease = first
    archiver.ensure_groups()
    raw0 = settings.layout.raw_stream(0)
    client.xadd(raw0, raw_line(0, "fenced"))
    assert first.renew() == 0 and first.fenced.is_set()
    try:
        for _ in range(50):
            archiver.step()
            time.sleep(0.05)
        raise AssertionError("the fenced archive went on")
    except Fenced:
        pass
    assert pending(client, raw0, settings.archive_group) == 1  # written, never acknowledged by it
    assert len(raw_objects(tmp_path / "archive")) == 1
