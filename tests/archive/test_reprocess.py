"""`goose-ingest reprocess`: a redaction rule added after the fact reaches the PostgreSQL rows of a day
that is gone from Redis, with no duplicate row (real Redis, worker, `goose-ingest archive`,
`reprocess` and `export postgres` processes; real PostgreSQL via tests/support/postgres.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import psycopg
import pytest

from services.broker.connect import sync_client
from tests.export.test_export_postgres_live import start_sink
from tests.support import postgres as pg_support
from tests.support.archive_reading import (
    archive_from_redis,
    archived_everything,
    cli,
    file_store,
    publish_runs,
    runs_of,
    start_archive_process,
    trim_to,
)
from tests.support.pipeline import ended_runs, start_worker, stop, wait_until

pytestmark = pytest.mark.e2e

pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

SECRET = "ACME-INTERNAL-7f3a9c21d4"  # an in-house credential form no built-in rule knows
RULES = '{"acme-internal": "ACME-INTERNAL-[0-9a-f]{10}"}'
REPROCESSED = {"GOOSE_INGEST_EVENTS_TOPIC": "harness.events.reprocessed",
               "GOOSE_INGEST_RUNS_TOPIC": "harness.runs.reprocessed"}


def _secret_transcript(path: Path) -> Path:
    req = {"type": "message", "message": {"id": "m1", "role": "assistant", "content": [
        {"type": "toolRequest", "id": "call_1", "toolCall": {"status": "success", "value": {
            "name": "developer__shell", "arguments": {"command": f"deploy --token {SECRET} --env prod"}}}}]}}
    resp = {"type": "message", "message": {"id": "m2", "role": "user", "content": [
        {"type": "toolResponse", "id": "call_1", "toolResult": {"status": "success", "value": {
            "content": [{"type": "text", "text": f"deployed with {SECRET}"}], "isError": False}}}]}}
    text = {"type": "message", "message": {"id": "m3", "role": "assistant", "content": [
        {"type": "text", "text": f"Done; the token {SECRET} worked."}]}}
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in (req, resp, text)) + b"\n")
    return path


def _rows(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return {eid: data for eid, data in conn.execute("SELECT event_id, data::text FROM events")}


def _count(dsn: str, table: str) -> int:
    """Rows so far; 0 while the sink has not created its tables yet (it migrates at its start, which
    a fast worker can beat)."""
    with psycopg.connect(dsn) as conn:
        try:
            return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        except psycopg.errors.UndefinedTable:
            return 0


def _day() -> tuple[str, str]:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today.strftime("%Y-%m-%d"), (today + timedelta(days=1)).strftime("%Y-%m-%d")


def test_a_new_redaction_rule_reaches_a_reprocessed_day_without_duplicates(settings, pg_dsn, tmp_path):
    runs = {**runs_of("reprocess"), **{f"reprocess/secret-{i}": _secret_transcript(tmp_path / f"s{i}.jsonl")
                                       for i in range(2)}}
    log = tmp_path / "procs.log"
    url = f"file://{tmp_path / 'archive'}"
    worker = start_worker(settings, log)
    sink = start_sink(settings, pg_dsn, log)
    archive = start_archive_process(settings, url, log)  # the real archive, into a local directory
    try:
        publish_runs(settings, runs)
        wait_until(lambda: set(runs) <= ended_runs(settings), timeout=120)
        total = sum(sync_client(settings).xlen(s) for s in settings.layout.events_partitions())
        wait_until(lambda: _count(pg_dsn, "events") == total and _count(pg_dsn, "runs") == len(runs), timeout=120)
        wait_until(lambda: archived_everything(settings), timeout=120)
    finally:
        stop(archive)
        stop(sink)
        stop(worker)
    before = _rows(pg_dsn)
    records_before = _count(pg_dsn, "run_records")
    assert sum(SECRET in d for d in before.values()) >= 2  # the old settings let it through (in text)

    # The day is in the archive; Redis keeps nothing of it (a short retention).
    assert trim_to(settings, f"{int(time.time() * 1000) + 1}-0") > 0
    since, until = _day()

    done = cli(settings, "reprocess", "--since", since, "--until", until, GOOSE_INGEST_ARCHIVE_URL=url,
               GOOSE_INGEST_REDACTION_EXTRA_RULES=RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(runs)} runs rebuilt" in done.stdout and "harness.events.reprocessed" in done.stdout, done.stdout

    sink = start_sink(settings, pg_dsn, log, **REPROCESSED)
    try:
        wait_until(lambda: not any(SECRET in d for d in _rows(pg_dsn).values()), timeout=120)
    finally:
        stop(sink)
    after = _rows(pg_dsn)
    assert set(after) == set(before)  # the same events: replaced, none added
    assert _count(pg_dsn, "events") == len(before) and _count(pg_dsn, "run_records") == records_before
    assert _count(pg_dsn, "runs") == len(runs)
    redacted = [eid for eid, d in after.items() if "[REDACTED:acme-internal]" in d]
    assert redacted and all(eid.startswith("reprocess/secret-") for eid in redacted)
    changed = {eid for eid in before if before[eid] != after[eid]}
    assert changed == {eid for eid in before if SECRET in before[eid]}  # nothing else moved

    # Again: idempotent (the same content is a duplicate for the sink).
    again = cli(settings, "reprocess", "--since", since, "--until", until, GOOSE_INGEST_ARCHIVE_URL=url,
                GOOSE_INGEST_REDACTION_EXTRA_RULES=RULES)
    assert again.returncode == 0, again.stderr
    sink = start_sink(settings, pg_dsn, log, **REPROCESSED)
    try:
        r = sync_client(settings)
        stream = "harness.events.reprocessed"
        key = f"{settings.namespace}:{stream}" if settings.namespace else stream
        wait_until(lambda: all(int(g["lag"] or 0) == 0 and int(g["pending"]) == 0 for g in r.xinfo_groups(key))
                   and r.xlen(key) == 2 * len(before), timeout=120)
    finally:
        stop(sink)
    assert _rows(pg_dsn) == after and _count(pg_dsn, "run_records") == records_before


def test_a_corrupt_segment_stops_reprocess_before_anything_is_published(settings, tmp_path):
    runs = runs_of("reprocess-corrupt")
    worker = start_worker(settings, tmp_path / "w.log")
    try:
        publish_runs(settings, runs)
        wait_until(lambda: set(runs) <= ended_runs(settings), timeout=120)
    finally:
        stop(worker)
    url, store = file_store(settings, tmp_path / "archive")
    victim = next(k for k in archive_from_redis(settings, store) if k.startswith("raw/"))
    store.put(victim, b"PAR1 this is not parquet")
    since, until = _day()
    done = cli(settings, "reprocess", "--since", since, "--until", until, GOOSE_INGEST_ARCHIVE_URL=url)
    assert done.returncode == 1 and victim in done.stderr and "nothing published" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    r = sync_client(settings)
    assert not [k for k in r.scan_iter(match=f"{settings.namespace}:*reprocessed*")]
    forced = cli(settings, "reprocess", "--since", since, "--until", until, "--allow-corrupt", GOOSE_INGEST_ARCHIVE_URL=url)
    assert forced.returncode == 1 and "runs rebuilt" in forced.stdout and victim in forced.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--since", "not-a-time"], "--since"),
    (["--since", "2026-12-02", "--until", "2026-12-01"], "window is empty"),
])
def test_reprocess_usage_errors_are_one_line_and_exit_2(settings, tmp_path, args, needle):
    done = cli(settings, "reprocess", *args, GOOSE_INGEST_ARCHIVE_URL=f"file://{tmp_path}/a")
    assert done.returncode == 2 and needle in done.stderr and done.stderr.count("\n") == 1, done.stderr
    missing = cli(settings, "reprocess")
    assert missing.returncode == 2 and "--since" in missing.stderr and "Traceback" not in missing.stderr


# ---------------------------------------------------------------------------------- the sink's replacement rule


@pytest.fixture
def store(pg_dsn: str):
    from services.export.postgres.store import Store

    s = Store(pg_dsn)
    s.migrate()
    yield s
    s.close()


def test_the_sink_replaces_a_reprocessed_event_and_skips_a_redelivered_one(store):
    from tests.export.test_export_postgres import event, record, write

    batch = [event("r", n, command=f"echo {n}") for n in range(3)] + [
        record("r", 0, "started", "2026-11-30T10:00:00.000Z", {"agent": 3})]
    write(store, batch)
    _, again = write(store, batch)  # a re-delivery: the same content
    assert (again.events_inserted, again.events_duplicate, again.records_inserted, again.records_duplicate) == (0, 3, 0, 1)
    changed = [event("r", 1, command="echo [REDACTED:x]"), event("r", 1, command="echo [REDACTED:x]"),  # twice in one batch
               record("r", 0, "started", "2026-11-30T10:00:00.000Z", {"agent": 2})]
    _, replaced = write(store, changed)
    assert (replaced.events_inserted, replaced.records_inserted) == (1, 1)  # one row each, replaced
    conn = store.connect()
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (3,)
    assert conn.execute("SELECT command FROM events WHERE seq = 1").fetchone() == ("echo [REDACTED:x]",)
    assert conn.execute("SELECT count(*), min(counts::text) FROM run_records").fetchone() == (1, '{"agent": 2}')
    assert conn.execute("SELECT events_total FROM runs").fetchone() == (2,)  # runs recomputed from the new record


# ---------------------------------------------------------------------------------- outputs (pure)


@pytest.mark.parametrize("cluster", [False, True])
def test_outputs_go_to_the_reprocessed_topics_in_the_runs_partition(cluster):
    from services.archive.reprocess import outputs, reprocessed_layout
    from services.sequencer.rebuild import Rebuilt
    from services.settings import Settings

    settings = Settings(namespace="ns", shards=4, redis_cluster=cluster)
    layout = reprocessed_layout(settings)
    run = "host-1/run-7"
    event = {"eventId": f"{run}:0", "runId": run, "seq": 0, "type": "command", "timestamp": "2026-12-01T00:00:00.000Z"}
    rec = {"recordId": f"{run}:run:0", "runId": run, "seq": 0, "state": "started"}
    out = outputs(Rebuilt(events={run: [event]}, records={run: [rec]}), layout)
    shard = settings.layout.shard_of(run)
    assert [o.stream for o in out] == [layout.events_partition(shard), layout.type_partition("command", shard),
                                       layout.runs_partition(shard)]
    assert all("reprocessed" in o.stream and o.stream.startswith("ns:") for o in out)
    live = settings.layout
    assert not {o.stream for o in out} & {*live.events_partitions(), *live.runs_partitions()}
    assert out[0].fields == {b"eventId": f"{run}:0".encode(), b"runId": run.encode(), b"seq": b"0", b"type": b"command",
                             b"data": orjson.dumps(event)}
    assert out[2].fields[b"state"] == b"started" and out[2].fields[b"recordId"] == f"{run}:run:0".encode()


def test_a_run_whose_start_was_not_read_is_skipped_not_republished(settings):
    """Republishing a run from half its log would overwrite good rows with wrong events."""
    from contracts.keys import shard_of
    from services.archive.reprocess import reprocess
    from services.archive.window import Window

    r = sync_client(settings)
    line = orjson.dumps({"type": "message", "message": {"id": "m", "role": "assistant", "content": [
        {"type": "text", "text": "hello"}]}})
    for run, seqs in (("whole", range(3)), ("nohead", range(1, 3))):
        stream = settings.layout.raw_stream(shard_of(run, settings.shards))
        for seq in seqs:
            r.xadd(stream, {"run": run, "seq": seq, "ts": 1_000 + seq, "line": line})
        r.xadd(stream, {"run": run, "seq": 3, "ts": 2_000, "kind": "eof"})
    report = reprocess(settings, Window(0, None), r, None)
    assert report.partial == ["nohead"] and report.runs == 1 and report.published
    key = settings.layout.key("harness.events.reprocessed")
    assert {orjson.loads(f[b"data"])["runId"] for _, f in r.xrange(key)} == {"whole"}
