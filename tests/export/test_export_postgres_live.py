"""PostgreSQL sink as real processes: `goose-ingest publish` -> worker -> `export postgres`, on the real
Redis and PostgreSQL; kill -9 of the sink, a PostgreSQL restart, an unreachable database, dead letters."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import psycopg
import pytest
import redis

from contracts.topics import TopicEntry
from services.export.postgres.sink import DEFAULT_GROUP
from services.settings import Settings
from tests.support import postgres as pg_support
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import REPO, start_worker, stop
from tests.support.postgres import free_port, wait_for
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

# The PostgreSQL fixtures (tests/support/postgres.py), made visible to this module.
pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn
private_postgres = pg_support.private_postgres


# ---------------------------------------------------------------------------------- helpers


def sink_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", "export", "postgres", *args]


def start_sink(settings: Settings, dsn: str, log: Path, **env: str) -> subprocess.Popen:
    base = {"GOOSE_INGEST_POSTGRES_DSN": dsn, "GOOSE_INGEST_METRICS_PORT": "0"}
    base.update(env)
    return subprocess.Popen(sink_cmd(), cwd=REPO, env=cli_env(settings, **base), stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def metrics_port(log: Path, after: int = 0) -> int:
    """The port the n-th (after=n) sink started in this log announced."""
    def find():
        found = re.findall(r"metrics on [^ ]+:(\d+)", log.read_text(errors="replace"))
        return int(found[after]) if len(found) > after else None
    return wait_for(find, timeout=30)


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def publish(settings: Settings, runs: dict[str, Path]) -> None:
    """Each run through the real `goose-ingest publish` CLI (which ends it with an eof)."""
    procs = [subprocess.Popen([sys.executable, "-m", "services.cli", "publish", "--run", run, str(path)], cwd=REPO,
                              env=cli_env(settings), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for run, path in runs.items()]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode(errors="replace")


def runs_of(prefix: str, copies: int) -> dict[str, Path]:
    return {f"{prefix}/{i}/{path.stem}": path for i in range(copies) for path in TRANSCRIPTS}


def topic_events(settings: Settings) -> dict[str, dict]:
    r = redis.Redis.from_url(settings.redis_url)
    out = {}
    for stream in settings.layout.events_partitions():
        for _, fields in r.xrange(stream):
            event = TopicEntry.from_fields(fields).document()
            out[event["eventId"]] = event
    return out


def topic_last_records(settings: Settings) -> dict[str, dict]:
    r = redis.Redis.from_url(settings.redis_url)
    out: dict[str, dict] = {}
    for stream in settings.layout.runs_partitions():
        for _, fields in r.xrange(stream):
            rec = TopicEntry.from_fields(fields).document()
            k = int(rec["recordId"].rsplit(":", 1)[1])
            if rec["runId"] not in out or k > int(out[rec["runId"]]["recordId"].rsplit(":", 1)[1]):
                out[rec["runId"]] = rec
    return out


def topics_complete(settings: Settings, runs: set[str]):
    """The worker has published every run's end (so the topics hold everything)."""
    last = topic_last_records(settings)
    return runs <= {r for r, rec in last.items() if rec["state"] in ("ended", "abandoned")}


def db_events(dsn: str) -> dict[str, dict]:
    with psycopg.connect(dsn) as conn:
        return {eid: data for eid, data in conn.execute("SELECT event_id, data FROM events")}


def db_count(dsn: str, table: str = "events") -> int:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    except (psycopg.errors.UndefinedTable, psycopg.OperationalError):
        return 0


def group_state(settings: Settings) -> tuple[int, int]:
    """(lag, pending) of the sink's group summed over every topic partition."""
    r = redis.Redis.from_url(settings.redis_url)
    lag = pending = 0
    for stream in settings.layout.events_partitions() + settings.layout.runs_partitions():
        try:
            groups = r.xinfo_groups(stream)
        except redis.ResponseError:  # the stream does not exist yet (the sink creates it with its group)
            return -1, -1
        for info in groups:
            if info["name"].decode() == DEFAULT_GROUP:
                lag += int(info["lag"] or 0)
                pending += int(info["pending"])
    return lag, pending


def assert_db_equals_topics(settings: Settings, dsn: str) -> None:
    expected = topic_events(settings)
    got = db_events(dsn)
    assert set(got) == set(expected)
    assert got == expected  # the jsonb is the event as published
    last = topic_last_records(settings)
    with psycopg.connect(dsn) as conn:
        rows = {k: (s, c, h) for k, s, c, h in conn.execute("SELECT run_key, state, event_counts, host FROM runs")}
        per_run = dict(conn.execute("SELECT run_key, count(*) FROM events GROUP BY run_key").fetchall())
    assert set(rows) == set(last)
    for run, rec in last.items():
        assert rows[run] == (rec["state"], rec["counts"], rec.get("host"))
        assert per_run.get(run, 0) == sum(rec["counts"].values())


# ---------------------------------------------------------------------------------- CLI


def test_cli_usage_errors_are_one_line_and_exit_2(settings, tmp_path):
    env = cli_env(settings)
    p = subprocess.run(sink_cmd(), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines()[-1].startswith("goose-ingest export postgres: no database configured")
    assert "Traceback" not in p.stderr
    port = free_port()  # nothing listens there
    secret_dsn = f"postgresql://postgres:hunter2secret@127.0.0.1:{port}/x?connect_timeout=2"
    p = subprocess.run(sink_cmd("--migrate"), cwd=REPO, env=cli_env(settings, GOOSE_INGEST_POSTGRES_DSN=secret_dsn),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    assert f"127.0.0.1:{port}/x unreachable" in p.stderr and "hunter2secret" not in p.stderr
    p = subprocess.run(sink_cmd("--dsn", "host='unterminated"), cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "cannot be parsed" in p.stderr and "Traceback" not in p.stderr


def test_migrate_flag_applies_then_reports_nothing_more(settings, pg_dsn):
    env = cli_env(settings, GOOSE_INGEST_POSTGRES_DSN=pg_dsn)
    first = subprocess.run(sink_cmd("--migrate"), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["0001_tables", "0002_model_format_views", "0003_error_classes",
                                    "0004_errors_by_class_format", "0005_class_failures"]
    again = subprocess.run(sink_cmd("--migrate"), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == ""


# ---------------------------------------------------------------------------------- end to end


def test_publish_worker_sink_end_to_end(settings, pg_dsn, tmp_path):
    log = tmp_path / "procs.log"
    worker = start_worker(settings, log)
    sink = start_sink(settings, pg_dsn, log)
    try:
        runs = runs_of("pg-e2e", 2)
        publish(settings, runs)
        wait_for(lambda: topics_complete(settings, set(runs)), timeout=120)
        total = len(topic_events(settings))
        wait_for(lambda: db_count(pg_dsn) == total and db_count(pg_dsn, "runs") == len(runs), timeout=120)
        wait_for(lambda: group_state(settings) == (0, 0), timeout=60)
        assert_db_equals_topics(settings, pg_dsn)
        assert readyz(metrics_port(log)) == 200
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port(log)}/metrics", timeout=5).read().decode()
        assert f'goose_ingest_postgres_rows_total{{outcome="inserted",table="events"}} {float(total)}' in body
        assert "hunter2" not in log.read_text() and "password" not in log.read_text().lower()

        # Re-delivery of everything (the group rewound to 0): the same rows, every one a duplicate.
        r = redis.Redis.from_url(settings.redis_url)
        for stream in settings.layout.events_partitions() + settings.layout.runs_partitions():
            r.xgroup_setid(stream, DEFAULT_GROUP, "0")
        dup = f'goose_ingest_postgres_rows_total{{outcome="duplicate",table="events"}} {float(total)}'
        wait_for(lambda: dup in urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port(log)}/metrics", timeout=5).read().decode(), timeout=60)
        wait_for(lambda: group_state(settings) == (0, 0), timeout=60)
        assert_db_equals_topics(settings, pg_dsn)
    finally:
        stop(sink)
        stop(worker)
    assert sink.returncode == 0, log.read_text()[-3000:]


def test_kill_9_mid_batch_then_restart_gives_the_same_rows(settings, pg_dsn, tmp_path):
    runs = runs_of("pg-kill", 12)
    log = tmp_path / "procs.log"
    worker = start_worker(settings, log)
    try:
        publish(settings, runs)
        wait_for(lambda: topics_complete(settings, set(runs)), timeout=180)
    finally:
        stop(worker)
    total = len(topic_events(settings))
    # Small batches so the sink is caught between batches and inside one.
    sink = start_sink(settings, pg_dsn, log, GOOSE_INGEST_BATCH_SIZE="10")
    try:
        wait_for(lambda: db_count(pg_dsn) > total // 4, timeout=120, interval=0.01)
        os.kill(sink.pid, signal.SIGKILL)
        sink.wait(timeout=30)
        written = db_count(pg_dsn)
        assert 0 < written < total
        restarted = start_sink(settings, pg_dsn, log, GOOSE_INGEST_BATCH_SIZE="10")
        try:
            wait_for(lambda: group_state(settings) == (0, 0) and db_count(pg_dsn) == total, timeout=180)
            assert_db_equals_topics(settings, pg_dsn)
            with psycopg.connect(pg_dsn) as conn:
                assert conn.execute("SELECT count(*) - count(DISTINCT event_id) FROM events").fetchone()[0] == 0
        finally:
            stop(restarted)
    finally:
        stop(sink)


def test_postgres_restart_mid_stream_blocks_then_catches_up(settings, private_postgres, tmp_path):
    dsn = private_postgres.dsn
    log = tmp_path / "procs.log"
    worker = start_worker(settings, log)
    sink = start_sink(settings, dsn, log)
    try:
        first = runs_of("pg-restart-a", 1)
        publish(settings, first)
        wait_for(lambda: db_count(dsn, "runs") == len(first) and group_state(settings) == (0, 0), timeout=120)
        port = metrics_port(log)
        assert readyz(port) == 200

        private_postgres.stop("fast")
        second = runs_of("pg-restart-b", 2)
        publish(settings, second)
        wait_for(lambda: topics_complete(settings, set(second)), timeout=120)
        wait_for(lambda: readyz(port) == 503, timeout=60)
        lag, pending = group_state(settings)
        assert lag + pending > 0  # nothing was acknowledged while the database was down
        assert sink.poll() is None
        assert "hunter2" not in log.read_text()

        private_postgres.start()
        wait_for(lambda: group_state(settings) == (0, 0) and readyz(port) == 200, timeout=120)
        assert_db_equals_topics(settings, dsn)
        assert "retrying in" in log.read_text()
    finally:
        stop(sink)
        stop(worker)


def test_unreachable_database_with_default_settings_acknowledges_nothing(settings, tmp_path):
    """Default timeouts and batch sizes: the sink waits, reports not ready, and leaves the data in the topic."""
    runs = runs_of("pg-down", 1)
    log = tmp_path / "procs.log"
    worker = start_worker(settings, log)
    try:
        publish(settings, runs)
        wait_for(lambda: topics_complete(settings, set(runs)), timeout=120)
    finally:
        stop(worker)
    dsn = f"host=127.0.0.1 port={free_port()} user=postgres password=hunter2secret dbname=postgres"
    sink = start_sink(settings, dsn, log)
    try:
        port = metrics_port(log)
        wait_for(lambda: "retrying in" in log.read_text(), timeout=60)
        assert readyz(port) == 503
        entries = len(topic_events(settings)) + sum(
            redis.Redis.from_url(settings.redis_url).xlen(s) for s in settings.layout.runs_partitions())
        lag, pending = group_state(settings)
        # Read ahead at most a batch or two, and nothing acknowledged: every entry is still owed.
        assert lag + pending == entries and pending <= 3 * 2 * Settings().batch_size  # 3 batches x 2 topics
        assert sink.poll() is None
        assert "hunter2secret" not in log.read_text()  # the DSN's password never reaches a log line
    finally:
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(timeout=30) == 0


def test_a_broker_down_at_start_is_waited_for_not_an_exit(pg_dsn, tmp_path):
    """The start check (export postgres pings the broker once before the sink starts) reports only
    configuration errors: with nothing on the broker's port the exporter logs one line and waits, and
    becomes ready once a redis-server comes up there."""
    from services.broker.embedded import start_redis

    port = free_port()
    settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", namespace="pgdown", spool_dir=str(tmp_path / "spool"))
    log = tmp_path / "sink.log"
    sink = start_sink(settings, pg_dsn, log)
    server = None
    try:
        metrics = metrics_port(log)
        wait_for(lambda: "broker unreachable at start" in log.read_text(errors="replace"), timeout=60)
        assert sink.poll() is None and readyz(metrics) == 503
        server = start_redis(port=port, dir=str(tmp_path / "late-redis"))
        wait_for(lambda: readyz(metrics) == 200, timeout=90)
        assert sink.poll() is None
    finally:
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(timeout=30) == 0
        if server is not None:
            server.close()
    assert "Traceback" not in log.read_text(errors="replace")


def test_refused_broker_credentials_are_one_line_at_start(settings, pg_dsn):
    """Refused credentials never work, however long the sink retries: one line, exit 2."""
    url = settings.redis_url.replace("redis://", "redis://nobody:hunter2secret@", 1)
    res = subprocess.run(sink_cmd(), cwd=REPO, capture_output=True, text=True, timeout=60,
                         env=cli_env(settings.model_copy(update={"redis_url": url}), GOOSE_INGEST_POSTGRES_DSN=pg_dsn,
                                     GOOSE_INGEST_METRICS_PORT="0"))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("goose-ingest export: the broker refused the credentials"), lines
    assert "hunter2secret" not in res.stderr  # the password is never printed


def test_bad_entries_and_refused_rows_are_dead_lettered_and_the_rest_written(settings, pg_dsn, tmp_path):
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.events_partitions()[0]
    good = {"eventId": "dl:0", "runId": "dl", "seq": 0, "type": "agent", "timestamp": "2026-11-30T10:00:00.000Z",
            "lines": [0, 0], "message": "fine"}
    nul = dict(good, eventId="dl:1", seq=1, message="nul \u0000 here")
    r.xadd(stream, {"eventId": "dl:0", "runId": "dl", "seq": 0, "type": "agent", "data": orjson.dumps(good)})
    bad_id = r.xadd(stream, {"eventId": "dl:x", "runId": "dl", "data": b"{truncated"}).decode()
    nul_id = r.xadd(stream, {"eventId": "dl:1", "runId": "dl", "seq": 1, "type": "agent", "data": orjson.dumps(nul)}).decode()
    log = tmp_path / "sink.log"
    sink = start_sink(settings, pg_dsn, log)
    try:
        wait_for(lambda: group_state(settings) == (0, 0) and db_count(pg_dsn) == 1, timeout=60)
        dead = {f[b"sourceId"].decode(): f for s in settings.layout.export_deadletter_partitions("postgres")
                for _, f in r.xrange(s)}
        assert set(dead) == {bad_id, nul_id}
        # its own dead-letter stream, never the workers' (its ACL user may not write there)
        assert all(r.xlen(s) == 0 for s in settings.layout.deadletter_partitions())
        assert dead[nul_id][b"exporter"] == b"postgres"
        assert dead[bad_id][b"reason"] == b"postgres-invalid-entry" and b"not JSON" in dead[bad_id][b"detail"]
        assert dead[nul_id][b"reason"] == b"postgres-rejected" and dead[nul_id][b"detail"]
        assert dead[nul_id][b"raw.data"] == orjson.dumps(nul) and dead[nul_id][b"source"] == stream.encode()
        assert db_events(pg_dsn) == {"dl:0": good}
        assert sink.poll() is None
    finally:
        stop(sink)


def test_hostile_timestamps_never_crash_the_sink_nor_make_partitions_retention_cannot_drop(settings, pg_dsn, tmp_path):
    """Issue 20 item 8: events dated 9999-12, next year, 1970 and year 1 (a tap's broken clock, a
    hostile `ts`) beside a normal one: written, the sink alive, no partition but this month's and
    next; each hostile row filed under its entry's time, its own timestamp kept in `data`."""
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.events_partitions()[0]
    stamps = ["2026-11-30T10:00:00.000Z", "9999-12-31T23:59:59.999Z", "2099-06-01T00:00:00.000Z",
              "1970-01-01T00:00:00.000Z", "0001-01-01T00:00:00.000Z"]
    for n, ts in enumerate(stamps):
        doc = {"eventId": f"ht:{n}", "runId": "ht", "seq": n, "type": "agent", "timestamp": ts, "lines": [n, n]}
        r.xadd(stream, {"eventId": doc["eventId"], "runId": "ht", "seq": n, "type": "agent", "data": orjson.dumps(doc)})
    log = tmp_path / "sink.log"
    sink = start_sink(settings, pg_dsn, log)
    try:
        wait_for(lambda: group_state(settings) == (0, 0) and db_count(pg_dsn) == len(stamps), timeout=60)
        assert sink.poll() is None, log.read_text()[-2000:]
        with psycopg.connect(pg_dsn) as conn:
            rows = {seq: (ts, kept) for seq, ts, kept in conn.execute("SELECT seq, ts, data->>'timestamp' FROM events")}
            parts = {name for (name,) in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'events' "
                "AND p.relnamespace = c.relnamespace AND c.relnamespace = to_regnamespace(current_schema())")}
        now = datetime.now(UTC)
        assert [kept for _, kept in (rows[n] for n in range(len(stamps)))] == stamps  # the originals kept
        for n in range(1, len(stamps)):  # filed under the entry's time: this month (a day at most ahead)
            assert abs((rows[n][0] - now).total_seconds()) < 600, rows[n]
        months = {now.strftime("%Y%m"), (now + timedelta(days=32)).strftime("%Y%m"), "202611"}
        assert {p[-6:] for p in parts} <= months, parts
        assert "Traceback" not in log.read_text()
        port = metrics_port(log)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "goose_ingest_postgres_clamped_timestamps_total 4.0" in text
    finally:
        stop(sink)
    assert sink.returncode == 0


def test_a_broker_at_maxmemory_while_a_batch_is_acknowledged_loses_and_doubles_nothing(private_redis, pg_dsn, tmp_path):
    """Issue 20 item 1 / finding 3, the sink's side, default settings: its batch (two good events and
    one the database refuses) is written while Redis refuses writes (maxmemory 1, noeviction), so
    the script carrying the dead letter and the XACKs is refused; the sink holds the batch, retries,
    and once memory is freed acknowledges it: both rows once, one dead letter, nothing pending, no
    crash. (The sink counts no deliveries: a refused acknowledgement can only delay it.)"""
    settings = Settings(redis_url=private_redis.url, namespace="oom", shards=2, spool_dir=str(tmp_path / "spool"))
    r = redis.Redis.from_url(private_redis.url)
    stream = settings.layout.events_partitions()[0]
    docs = [{"eventId": f"mm:{n}", "runId": "mm", "seq": n, "type": "agent", "timestamp": "2026-11-30T10:00:00.000Z",
             "lines": [n, n], "message": "nul \u0000" if n == 1 else "fine"} for n in range(3)]
    for doc in docs:
        r.xadd(stream, {"eventId": doc["eventId"], "runId": "mm", "seq": doc["seq"], "type": "agent",
                        "data": orjson.dumps(doc)})
    # the gate: the sink's groups exist past the entries, so it reads nothing until SETID 0
    for s in settings.layout.events_partitions() + settings.layout.runs_partitions():
        r.xgroup_create(s, DEFAULT_GROUP, id="$", mkstream=True)
    log = tmp_path / "sink.log"
    sink = start_sink(settings, pg_dsn, log)
    try:
        metrics_port(log)  # started
        # ... and reading: its groups are made and it has read once (a consumer exists), so the
        # refused writes below can only meet its acknowledgement, not its start (XGROUP CREATE is
        # refused at maxmemory even for a group that exists)
        wait_for(lambda: r.xinfo_consumers(stream, DEFAULT_GROUP), timeout=60)
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", "1")
        r.xgroup_setid(stream, DEFAULT_GROUP, "0")  # allowed at maxmemory, as XREADGROUP and XACK are
        wait_for(lambda: "broker refuses the acknowledgement" in log.read_text(errors="replace"), timeout=60)
        time.sleep(3)
        assert sink.poll() is None and db_count(pg_dsn) == 2 and r.xpending(stream, DEFAULT_GROUP)["pending"] == 3
        r.config_set("maxmemory", "0")
        wait_for(lambda: group_state(settings) == (0, 0), timeout=60)
        dead = [f for s in settings.layout.export_deadletter_partitions("postgres") for _, f in r.xrange(s)]
        assert [f[b"sourceId"] for f in dead] and len(dead) == 1 and dead[0][b"reason"] == b"postgres-rejected"
        assert db_count(pg_dsn) == 2 and sink.poll() is None
    finally:
        stop(sink)
    assert "Traceback" not in log.read_text(errors="replace")


def add_run(r: redis.Redis, settings: Settings, run: str, events: int) -> None:
    """A finished run straight onto the topics (as a worker commits it): events, then its records."""
    shard = settings.layout.shard_of(run)
    ev_stream = settings.layout.events_partition(shard)
    runs_stream = settings.layout.runs_partition(shard)
    for n in range(events):
        doc = {"eventId": f"{run}:{n}", "runId": run, "seq": n, "type": "agent",
               "timestamp": "2026-11-30T10:00:00.000Z", "lines": [n, n], "message": f"m{n}"}
        r.xadd(ev_stream, {"eventId": doc["eventId"], "runId": run, "seq": n, "type": "agent", "data": orjson.dumps(doc)})
    for k, state in enumerate(("started", "ended")):
        rec = {"recordId": f"{run}:run:{k}", "runId": run, "state": state, "timestamp": "2026-11-30T10:00:00.000Z",
               "seq": 0, "counts": {"agent": events if k else 0}, "host": "h"}
        r.xadd(runs_stream, {"recordId": rec["recordId"], "runId": run, "seq": 0, "state": state,
                             "data": orjson.dumps(rec)})


def test_entries_of_a_consumer_that_never_returns_are_claimed_by_another(settings, pg_dsn, tmp_path):
    r = redis.Redis.from_url(settings.redis_url)
    for i in range(40):
        add_run(r, settings, f"claim/{i}", 25)
    total = 40 * 25
    log = tmp_path / "sink.log"
    first = start_sink(settings, pg_dsn, log, GOOSE_INGEST_BATCH_SIZE="10")
    second = None
    try:
        wait_for(lambda: db_count(pg_dsn) > 0, timeout=60, interval=0.01)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert db_count(pg_dsn) < total and group_state(settings)[1] > 0  # it died holding entries
        # Another sink under another name (a replacement pod): it claims what the dead one held.
        second = subprocess.Popen(sink_cmd("--consumer", "replacement"), cwd=REPO, stdout=log.open("ab"),
                                  stderr=subprocess.STDOUT,
                                  env=cli_env(settings, GOOSE_INGEST_POSTGRES_DSN=pg_dsn, GOOSE_INGEST_METRICS_PORT="0",
                                              GOOSE_INGEST_CLAIM_IDLE_MS="1000", GOOSE_INGEST_SWEEP_INTERVAL_S="0.5"))
        wait_for(lambda: group_state(settings) == (0, 0) and db_count(pg_dsn) == total, timeout=120)
        assert "claimed" in log.read_text()
        assert db_count(pg_dsn, "runs") == 40
    finally:
        stop(first)
        if second is not None:
            stop(second)


def test_broker_restart_without_persistence_recreates_the_group_and_goes_on(settings, private_redis, pg_dsn, tmp_path):
    s = settings.model_copy(update={"redis_url": private_redis.url})
    r = redis.Redis.from_url(s.redis_url)
    add_run(r, s, "before/1", 5)
    log = tmp_path / "sink.log"
    sink = start_sink(s, pg_dsn, log)
    try:
        port = metrics_port(log)
        wait_for(lambda: db_count(pg_dsn) == 5 and readyz(port) == 200, timeout=60)
        private_redis.stop()
        wait_for(lambda: readyz(port) == 503, timeout=60)
        assert sink.poll() is None
        private_redis.start()  # empty: no streams, no groups
        add_run(redis.Redis.from_url(s.redis_url), s, "after/1", 7)
        wait_for(lambda: db_count(pg_dsn) == 12 and readyz(port) == 200, timeout=120)
        assert group_state(s) == (0, 0)
        assert "broker unreachable" in log.read_text()
    finally:
        stop(sink)


def _deliver(r: redis.Redis, stream: str, group: str, consumer: str, entry_id: str, times: int) -> None:
    """Deliver one entry `times` times to `consumer` (XREADGROUP of its own history counts each)."""
    r.xgroup_create(stream, group, id="0", mkstream=True)
    r.xreadgroup(group, consumer, {stream: ">"}, count=1)
    for _ in range(times - 1):
        r.xreadgroup(group, consumer, {stream: "0"}, count=1)
    [row] = r.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    assert row["times_delivered"] == times


@pytest.mark.parametrize("holder", ["a-dead-sink", "postgres-restarted"])
def test_an_entry_past_max_deliveries_is_dead_lettered_and_the_rest_written(settings, pg_dsn, tmp_path, holder):
    """`export postgres` honours MAX_DELIVERIES (services/streams/pending.py): an entry delivered more
    often than that - held by a dead sink (claimed by the sweep) or by this sink's own name before a
    restart (its pending entries re-read at start) - is dead-lettered `max-deliveries` with its fields,
    acknowledged, and everything else is written. Default settings but the claim idle time."""
    r = redis.Redis.from_url(settings.redis_url)
    run = "poison/0"
    add_run(r, settings, run, 4)
    stream = settings.layout.events_partition(settings.layout.shard_of(run))
    first_id = r.xrange(stream, count=1)[0][0].decode()
    _deliver(r, stream, DEFAULT_GROUP, holder, first_id, settings.max_deliveries + 1)
    log = tmp_path / "sink.log"
    sink = subprocess.Popen(sink_cmd("--consumer", "postgres-restarted"), cwd=REPO, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT,
                            env=cli_env(settings, GOOSE_INGEST_POSTGRES_DSN=pg_dsn, GOOSE_INGEST_METRICS_PORT="0",
                                        GOOSE_INGEST_CLAIM_IDLE_MS="1000", GOOSE_INGEST_SWEEP_INTERVAL_S="0.5"))
    try:
        wait_for(lambda: group_state(settings) == (0, 0) and db_count(pg_dsn) == 3, timeout=90)
        dead = [f for s in settings.layout.export_deadletter_partitions("postgres") for _, f in r.xrange(s)]
        assert len(dead) == 1
        [letter] = dead
        assert letter[b"reason"] == b"max-deliveries" and letter[b"sourceId"] == first_id.encode()
        assert letter[b"detail"] == f"delivered {settings.max_deliveries + 1} times".encode()
        assert letter[b"exporter"] == b"postgres" and letter[b"raw.eventId"] == f"{run}:0".encode()
        assert set(db_events(pg_dsn)) == {f"{run}:{n}" for n in (1, 2, 3)}
        assert db_count(pg_dsn, "runs") == 1
        assert sink.poll() is None
    finally:
        stop(sink)
    assert "Traceback" not in log.read_text(errors="replace")


def test_a_database_outage_longer_than_claim_idle_times_max_deliveries_dead_letters_nothing(settings, private_postgres,
                                                                                             tmp_path):
    """The batches the sink holds through a database outage are never claimed back by its own sweep
    (each claim would be a delivery): past CLAIM_IDLE_MS x MAX_DELIVERIES of outage, nothing is
    dead-lettered, and every row arrives once the database is back."""
    r = redis.Redis.from_url(settings.redis_url)
    dsn = private_postgres.dsn
    log = tmp_path / "sink.log"
    sink = start_sink(settings, dsn, log, GOOSE_INGEST_BATCH_SIZE="5", GOOSE_INGEST_CLAIM_IDLE_MS="200",
                      GOOSE_INGEST_SWEEP_INTERVAL_S="0.1")
    try:
        port = metrics_port(log)
        wait_for(lambda: readyz(port) == 200, timeout=60)
        private_postgres.stop("fast")
        add_run(r, settings, "pg-out/0", 3)  # one batch: the reader idles and sweeps while the writer waits
        # Read and held: all 5 entries in one batch, or (when the run records land after the reader's
        # first read, as on a loaded machine) a first batch held while the rest waits unread behind it.
        wait_for(lambda: group_state(settings)[1] > 0 and sum(group_state(settings)) == 5, timeout=60)
        held = group_state(settings)[1]
        time.sleep(200 / 1000 * (settings.max_deliveries + 2) * 3)  # far past CLAIM_IDLE_MS x MAX_DELIVERIES
        assert readyz(port) == 503
        stream = settings.layout.events_partition(0)
        rows = [row for s in settings.layout.events_partitions() + settings.layout.runs_partitions()
                for row in r.xpending_range(s, DEFAULT_GROUP, min="-", max="+", count=100)]
        # every held entry delivered once: the sink's own sweep never claimed its held batch back
        assert len(rows) >= held and {row["times_delivered"] for row in rows} == {1}, (stream, rows)
        private_postgres.start()
        wait_for(lambda: group_state(settings) == (0, 0) and db_count(dsn) == 3, timeout=120)
        assert db_count(dsn, "runs") == 1
        assert all(r.xlen(s) == 0 for s in settings.layout.export_deadletter_partitions("postgres"))
    finally:
        stop(sink)


def test_a_reader_thread_failure_ends_the_sink_with_one_line_and_exit_1(settings, private_redis, pg_dsn, tmp_path):
    """An error the reader does not know how to wait out ends the process, never a silent hang with
    the writer idling: here a real one, a server on the broker's port that does not speak Redis (the
    broker replaced by an HTTP server), which redis-py reports as InvalidResponse. One log line names
    the thread and the error, no traceback, exit 1 (EXIT_READER_DIED) so the supervisor restarts it."""
    import socket
    import threading

    from services.streams.watch import EXIT_READER_DIED

    s = settings.model_copy(update={"redis_url": private_redis.url})
    add_run(redis.Redis.from_url(s.redis_url), s, "before/1", 5)
    log = tmp_path / "sink.log"
    sink = start_sink(s, pg_dsn, log)
    listener = socket.socket()
    accepted: list[socket.socket] = []
    try:
        port = metrics_port(log)
        wait_for(lambda: db_count(pg_dsn) == 5 and readyz(port) == 200, timeout=60)
        private_redis.stop()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", private_redis.port))
        listener.listen()

        def answer_http() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:  # closed by the test
                    return
                accepted.append(conn)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer_http, daemon=True).start()
        assert sink.wait(timeout=90) == EXIT_READER_DIED
    finally:
        stop(sink)
        listener.close()
        for conn in accepted:
            conn.close()
    text = log.read_text(errors="replace")
    failed = [line for line in text.splitlines() if "thread failed" in line]
    assert len(failed) == 1, text[-3000:]
    assert "the reader thread failed: InvalidResponse" in failed[0] and "exiting with code 1" in failed[0], failed
    assert "Traceback" not in text, text[-3000:]


def test_a_writer_thread_failure_stops_the_reader_and_says_why(settings, pg_dsn, caplog):
    """The other side: a bug in the writer (stood in for by a subclass whose hourly maintenance raises,
    with the real broker, database and reader thread) stops the reader thread too, `run` returns with
    `failure` set, /readyz says which thread failed and why, and one ERROR line says it."""
    import logging
    import threading

    from services.export.postgres.metrics import SinkMetrics
    from services.export.postgres.sink import Sink, SinkOptions, ThreadFailure
    from services.export.postgres.store import Store

    class BuggyMaintenance(Sink):
        def _maintain(self, force: bool = False) -> None:
            if not force:
                raise KeyError("partition 2026-13")  # a bug: what no retry loop expects

    opts = SinkOptions(group="g-writer-bug", consumer="c1", retention=timedelta(days=30), batch_size=10, block_ms=100,
                       claim_idle_ms=60_000, sweep_interval_s=1.0)
    store = Store(pg_dsn)
    sink = BuggyMaintenance(settings, redis.Redis.from_url(settings.redis_url), store, opts, SinkMetrics())
    runner = threading.Thread(target=sink.run)
    try:
        with caplog.at_level(logging.INFO, logger="goose_ingest.export.postgres"):
            runner.start()
            runner.join(timeout=60)
            assert not runner.is_alive()
    finally:
        sink.stop()
        runner.join(timeout=30)
        store.close()
    assert sink.failure == ThreadFailure("writer", "KeyError: 'partition 2026-13'")
    assert not sink.readiness() and sink.readiness().reason == "the writer thread failed: KeyError: 'partition 2026-13'"
    assert not any(t.name == "postgres-sink-reader" for t in threading.enumerate())  # the reader stopped too
    failed = [r for r in caplog.records if "thread failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "ERROR" and failed[0].exc_info is None, failed
    assert sink.metrics.registry.get_sample_value("goose_ingest_postgres_ready") == 0
