"""`goose-ingest import-sessions`: sessions.db -> raw entries -> a real worker -> events (real Redis).

Expected differences between a sessions.db import and the live stream of the same run (spec §9.6),
checked in ``test_fixture_import_matches_normalizer_and_stream``:
- the DB stores the user prompt as a user text row: the normalizer ignores user text, no event;
- text fragments of one provider call are one merged row: the same agent messages, other line ranges;
- each tool request is its own assistant row (carrying the turn's thinking): reasoning may sit at
  another position relative to the agent text, line ranges and tool durations (second precision in
  the DB) differ;
- tool events must agree on type, tool, call id, path, command, isSuccess and exitCode.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from bench.import_sessions import add_session, create_schema, generate_db
from services.backfill import list_sessions, open_readonly, read_messages, usage_complete
from services.normalizer import RunNormalizer
from tests.fixtures import FIXTURES  # noqa: E402
from tests.pipeline_helpers import (
    REPO,
    ended_runs,
    events_by_run,
    expected_events,
    start_worker,
    stop,
    topic,
    wait_until,
)
from tests.support.redis_server import cli_env

SQL = FIXTURES / "a-read-edit-test-finish.sessions-db.sql"
STREAM = FIXTURES / "a-read-edit-test-finish.jsonl"
SID = "20260926_3"
NS = "lap-1"
LATER = "2030-01-01T00:00:00Z"  # --now: every session is final (idle for years)

pytestmark = pytest.mark.e2e


# --- helpers ------------------------------------------------------------------------------------




@pytest.fixture()
def worker(settings, tmp_path):
    proc = start_worker(settings, tmp_path / "worker.log")
    yield proc
    stop(proc)


def cli(settings, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "import-sessions", *args],
        cwd=REPO, env=env or cli_env(settings), capture_output=True, text=True, timeout=300, **kw,
    )


def imp(settings, db: Path, *args: str, now: str = LATER) -> subprocess.CompletedProcess:
    res = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", now, *args)
    assert res.returncode == 0, res.stderr
    return res


def raw_fields(settings) -> list[dict[str, str]]:
    r = redis.Redis.from_url(settings.redis_url)
    out = []
    for stream in settings.raw_streams():
        for _sid, f in r.xrange(stream):
            out.append({k.decode(): v.decode() for k, v in f.items()})
    return out


def raw_len(settings) -> int:
    r = redis.Redis.from_url(settings.redis_url)
    return sum(r.xlen(s) for s in settings.raw_streams())


def by_run(entries: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, dict[int, dict]] = {}
    for e in entries:
        out.setdefault(e["run"], {})[int(e["seq"])] = e  # re-sent duplicates collapse
    return {run: [d[s] for s in sorted(d)] for run, d in out.items()}


def db_expected(db: Path, sid: str, run: str) -> list[dict]:
    """One normalizer pass over the session as it should be published: its message lines
    (ts = created s x 1000), the complete line, eof."""
    conn = open_readonly(db)
    msgs = read_messages(conn, sid)
    complete = usage_complete(conn, sid)
    conn.close()
    norm = RunNormalizer(run)
    out: list[dict] = []
    seq = 0
    for m in msgs:
        out += norm.line(seq, m.created * 1000, m.line, "stdout")
        seq += 1
    last = max(m.created for m in msgs) * 1000
    out += norm.line(seq, last, json.dumps(complete, separators=(",", ":")), "stdout")
    out += norm.end(seq + 1, last, None)
    return out


def strip(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in ("runId", "eventId", "timestamp")} for e in events]


def assert_events_exact(settings, run: str, expected: list[dict]) -> None:
    got = events_by_run(settings)[run]
    assert [e["eventId"] for e in got] == [f"{run}:{n}" for n in range(len(got))], "gap or duplicate"
    assert strip(got) == strip(expected)
    assert got == expected_events(settings, run)  # == a one-pass normalization of the raw log


TOOL_KEYS = ("type", "tool", "toolCallId", "path", "command", "isSuccess", "exitCode")


def tool_view(events: list[dict]) -> list[dict]:
    return [{k: e.get(k) for k in TOOL_KEYS} for e in events if "toolCallId" in e]


# --- the fixture, end to end --------------------------------------------------------------------


def test_fixture_import_matches_normalizer_and_stream(settings, fixture_db, worker):
    run = f"{NS}/{SID}"
    res = imp(settings, fixture_db)
    assert "published 19 message(s)" in res.stderr
    wait_until(lambda: run in ended_runs(settings), timeout=60)
    expected = db_expected(fixture_db, SID, run)
    assert_events_exact(settings, run, expected)

    # provenance and labels on every raw entry
    entries = by_run(raw_fields(settings))[run]
    conn = open_readonly(fixture_db)
    msgs = read_messages(conn, SID)
    conn.close()
    assert len(entries) == len(msgs) + 2
    for e, m in zip(entries[: len(msgs)], msgs, strict=True):
        assert (e["src.table"], e["src.rowid"], e["src.message_id"]) == ("messages", str(m.rowid), m.message_id)
        assert e["line"] == m.line and e["ts"] == str(m.created * 1000)
        assert e["host"] == NS and e["agent"] == "goose" and "parent" not in e
    complete, eof = entries[-2], entries[-1]
    assert complete["src.table"] == "usage_ledger" and json.loads(complete["line"])["type"] == "complete"
    assert eof["kind"] == "eof" and "exit" not in eof

    # the run's lifecycle records carry the ledger usage (same as the stream's complete)
    records = [r for r in topic(settings, settings.runs_stream()) if r["runId"] == run]
    assert [r["state"] for r in records] == ["started", "completed", "ended"]

    # semantic comparison with the live stream of the same run, via `goose-ingest normalize`
    out = subprocess.run([sys.executable, "-m", "services.cli", "normalize", str(STREAM), "--run", run,
                          "--epoch", "0"], cwd=REPO, capture_output=True, check=True)
    stream_events = [orjson.loads(line) for line in out.stdout.splitlines()]
    got = events_by_run(settings)[run]
    assert tool_view(got) == tool_view(stream_events)
    assert [e["message"] for e in got if e["type"] == "agent"] == \
        [e["message"] for e in stream_events if e["type"] == "agent"]
    assert sorted(e["message"] for e in got if e["type"] == "reasoning") == \
        sorted(e["message"] for e in stream_events if e["type"] == "reasoning")
    assert {e["type"] for e in got} == {e["type"] for e in stream_events}


def test_reimport_publishes_nothing(settings, fixture_db):
    imp(settings, fixture_db)
    n = raw_len(settings)
    assert n == 21
    res = imp(settings, fixture_db)
    assert "published 0 message(s)" in res.stderr
    assert raw_len(settings) == n


# --- growth, continuation, compaction ------------------------------------------------------------


def _grow(db: Path, sid: str, created: int, texts: list[str]) -> list[str]:
    conn = sqlite3.connect(db)
    ids = []
    for i, text in enumerate(texts):
        mid = f"msg_01grow{created}{i}"
        conn.execute(
            "INSERT INTO messages (message_id, session_id, role, content_json, created_timestamp, metadata_json)"
            " VALUES (?,?,?,?,?,?)",
            (mid, sid, "assistant", json.dumps([{"type": "text", "text": text}]), created + i,
             json.dumps({"userVisible": True, "agentVisible": True})),
        )
        ids.append(mid)
    conn.execute("UPDATE sessions SET updated_at = datetime(?, 'unixepoch') WHERE id = ?", (created + len(texts), sid))
    conn.commit()
    conn.close()
    return ids


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def test_growing_session_continues_the_same_run(settings, fixture_db, worker):
    run = f"{NS}/{SID}"
    conn = open_readonly(fixture_db)
    last = max(m.created for m in read_messages(conn, SID))
    conn.close()
    # still active (10 s after its last message): published without complete/eof
    res = imp(settings, fixture_db, now=_iso(last + 10))
    assert "0 run(s) ended" in res.stderr
    assert raw_len(settings) == 19
    wait_until(lambda: run in events_by_run(settings), timeout=60)
    # it grew: only the new messages, as seqs 19.. of the same run
    _grow(fixture_db, SID, last + 20, ["Follow-up: I also tidied the docstring.", "Anything else?"])
    dry = imp(settings, fixture_db, "--dry-run", now=_iso(last + 30))
    assert f"{run}\t2 new message(s)\teof: no" in dry.stdout
    assert raw_len(settings) == 19
    imp(settings, fixture_db, now=_iso(last + 30))
    assert raw_len(settings) == 21
    # later it is idle: only complete + eof
    imp(settings, fixture_db, now=_iso(last + 30 + 601))
    entries = by_run(raw_fields(settings))
    assert list(entries) == [run]
    assert [e["seq"] for e in entries[run]] == [str(i) for i in range(23)]
    wait_until(lambda: run in ended_runs(settings), timeout=60)
    assert_events_exact(settings, run, db_expected(fixture_db, SID, run))
    agent = [e["message"] for e in events_by_run(settings)[run] if e["type"] == "agent"]
    assert agent[-2:] == ["Follow-up: I also tidied the docstring.", "Anything else?"]


def test_growth_after_eof_is_a_continuation_run(settings, fixture_db, worker):
    run = f"{NS}/{SID}"
    imp(settings, fixture_db)
    wait_until(lambda: run in ended_runs(settings), timeout=60)
    conn = open_readonly(fixture_db)
    last = max(m.created for m in read_messages(conn, SID))
    conn.close()
    _grow(fixture_db, SID, last + 100, ["Resumed: one more fix."])
    imp(settings, fixture_db)
    cont = f"{run}/2"
    entries = by_run(raw_fields(settings))
    assert set(entries) == {run, cont}
    assert len(entries[run]) == 21
    assert [json.loads(e["line"]).get("type") for e in entries[cont][:-1]] == ["message", "complete"]
    assert all(e["continues"] == run for e in entries[cont])
    # the continuation's complete adds nothing: the ledger did not grow
    assert json.loads(entries[cont][1]["line"])["total_tokens"] == 0
    wait_until(lambda: cont in ended_runs(settings), timeout=60)
    got = events_by_run(settings)[cont]
    assert [e["message"] for e in got if e["type"] == "agent"] == ["Resumed: one more fix."]
    assert got == expected_events(settings, cont)


def test_compacted_session_is_not_republished(settings, fixture_db):
    run = f"{NS}/{SID}"
    imp(settings, fixture_db)
    n = raw_len(settings)
    # compaction: delete the rows, re-insert the same message_ids under new rowids (+ a summary)
    conn = sqlite3.connect(fixture_db)
    rows = conn.execute("SELECT message_id, session_id, role, content_json, created_timestamp, metadata_json"
                        " FROM messages WHERE session_id = ? ORDER BY id", (SID,)).fetchall()
    conn.execute("DELETE FROM messages WHERE session_id = ?", (SID,))
    conn.executemany("INSERT INTO messages (message_id, session_id, role, content_json, created_timestamp,"
                     " metadata_json) VALUES (?,?,?,?,?,?)", rows)
    conn.commit()
    conn.close()
    assert min(m.rowid for m in read_messages(open_readonly(fixture_db), SID)) > 19
    dry = imp(settings, fixture_db, "--dry-run")
    assert f"{run}\t0 new message(s)" in dry.stdout
    imp(settings, fixture_db)
    assert raw_len(settings) == n
    # a summary message added by the compaction is new: published (as a continuation, the run ended)
    _grow(fixture_db, SID, 1790431400, ["Summary of the conversation so far."])
    imp(settings, fixture_db)
    cont = by_run(raw_fields(settings))[f"{run}/2"]
    assert len(cont) == 3 and "Summary of the conversation" in cont[0]["line"]


# --- interruption -------------------------------------------------------------------------------


def _assert_db_imported(settings, db: Path, sids: list[str]) -> None:
    """Raw log: each session's run holds each message exactly once, in order, then complete + eof;
    the worker's events equal a one-pass normalization of the database."""
    entries = by_run(raw_fields(settings))
    assert set(entries) == {f"{NS}/{s}" for s in sids}
    conn = open_readonly(db)
    for sid in sids:
        run = f"{NS}/{sid}"
        msgs = read_messages(conn, sid)
        got = entries[run]
        assert [int(e["seq"]) for e in got] == list(range(len(msgs) + 2))
        assert [e.get("src.message_id") for e in got[:-2]] == [m.message_id for m in msgs]
        assert got[-1]["kind"] == "eof"
    conn.close()
    wait_until(lambda: {f"{NS}/{s}" for s in sids} <= ended_runs(settings), timeout=120)
    for sid in sids:
        run = f"{NS}/{sid}"
        assert_events_exact(settings, run, db_expected(db, sid, run))


def test_interrupted_import_resumes_sigkill(settings, tmp_path, worker):
    db = tmp_path / "sessions.db"
    sids = generate_db(db, 30, 100)  # 3,000 messages
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "import-sessions", str(db), "--namespace", NS,
                             "--no-progress", "--now", LATER], cwd=REPO, env=cli_env(settings),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: raw_len(settings) >= 900 or proc.poll() is not None, timeout=120, interval=0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert raw_len(settings) < 30 * 102, "the import finished before it could be interrupted"
    imp(settings, db)
    _assert_db_imported(settings, db, sids)
    assert raw_len(settings) >= 30 * 102


def test_interrupted_import_resumes_after_flush_before_checkpoint(settings, tmp_path):
    db = tmp_path / "sessions.db"
    sids = generate_db(db, 8, 40)
    env = cli_env(settings, GOOSE_INGEST_IMPORT_TEST_CRASH_AFTER="3")
    res = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", LATER, env=env)
    assert res.returncode == 99
    assert raw_len(settings) == 3 * 42  # three sessions delivered, the third not checkpointed
    res = imp(settings, db)
    # the third recovered from its spool (delivered, then checkpointed), five fresh
    assert "published 240 message(s), 6 run(s) ended" in res.stderr
    assert raw_len(settings) == 8 * 42  # nothing re-sent: the spools were only re-checked
    r = redis.Redis.from_url(settings.redis_url)
    log = Path(settings.spool_dir)
    assert not any(log.rglob("entries.jsonl")), "finished runs leave no spool"
    ended = imp(settings, db)
    assert "published 0 message(s)" in ended.stderr
    with_worker = start_worker(settings, tmp_path / "w.log")
    try:
        _assert_db_imported(settings, db, sids)
    finally:
        stop(with_worker)
    assert r.hget(settings.key(f"goose-ingest:import:{NS}/{sids[0]}"), "ended") == b"1"


# --- filters, dry-run, errors, parent links ------------------------------------------------------


def test_session_and_since_filters(settings, tmp_path):
    db = tmp_path / "sessions.db"
    sids = generate_db(db, 4, 5, subagent_every=0)  # created 10 minutes apart
    imp(settings, db, "--session", sids[1])
    assert set(by_run(raw_fields(settings))) == {f"{NS}/{sids[1]}"}
    conn = open_readonly(db)
    created = {s.id: s.created_at for s in list_sessions(conn)}
    conn.close()
    imp(settings, db, "--since", created[sids[2]].isoformat())
    assert set(by_run(raw_fields(settings))) == {f"{NS}/{s}" for s in sids[1:]}
    res = cli(settings, str(db), "--namespace", NS, "--session", "nope")
    assert res.returncode == 2 and "no session 'nope'" in res.stderr


def test_dry_run_publishes_nothing(settings, fixture_db):
    res = imp(settings, fixture_db, "--dry-run")
    assert res.stdout.strip() == f"{NS}/{SID}\t19 new message(s)\teof: yes"
    assert raw_len(settings) == 0
    # without a broker: everything counts as new, and it says so
    env = cli_env(settings, GOOSE_INGEST_REDIS_URL="")
    res = cli(settings, str(fixture_db), "--namespace", NS, "--dry-run", "--now", LATER, env=env)
    assert res.returncode == 0
    assert "no broker configured" in res.stdout and "19 new message(s)" in res.stdout


@pytest.mark.parametrize("case", ["missing", "corrupt", "not-goose", "schema", "no-broker", "namespace", "since"])
def test_errors_exit_2(settings, tmp_path, fixture_db, case):
    env = None
    path = fixture_db
    ns = NS
    extra: list[str] = []
    if case == "missing":
        path = tmp_path / "nope.db"
    elif case == "corrupt":
        path = tmp_path / "corrupt.db"
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    elif case == "not-goose":
        path = tmp_path / "other.db"
        c = sqlite3.connect(path)
        c.execute("CREATE TABLE t (x)")
        c.commit()
        c.close()
    elif case == "schema":
        c = sqlite3.connect(path)
        c.execute("INSERT INTO schema_version (version) VALUES (99)")
        c.commit()
        c.close()
    elif case == "no-broker":
        env = cli_env(settings, GOOSE_INGEST_REDIS_URL="")
    elif case == "namespace":
        ns = "a/b"
    elif case == "since":
        extra = ["--since", "yesterday"]
    res = cli(settings, str(path), "--namespace", ns, *extra, env=env)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("goose-ingest import-sessions: error: "), res.stderr
    expect = {"missing": "not found", "corrupt": "not a SQLite database", "not-goose": "not a goose sessions.db",
              "schema": "schema version 99", "no-broker": "GOOSE_INGEST_REDIS_URL", "namespace": "no '/'",
              "since": "--since"}[case]
    assert expect in lines[0]
    assert raw_len(settings) == 0


def test_subagent_sessions_carry_parent(settings, tmp_path):
    db = tmp_path / "sessions.db"
    conn = create_schema(db)
    import random

    rng = random.Random(7)
    add_session(conn, "20260101_1", 1_767_225_600, 6, rng)
    add_session(conn, "20260101_2", 1_767_225_700, 4, rng, parent="20260101_1")
    conn.commit()
    conn.close()
    imp(settings, db)
    entries = by_run(raw_fields(settings))
    assert all("parent" not in e for e in entries[f"{NS}/20260101_1"])
    child = entries[f"{NS}/20260101_2"]
    assert len(child) == 6 and all(e["parent"] == f"{NS}/20260101_1" for e in child)


def test_open_run_abandoned_by_the_worker_continues_as_new_part(settings, fixture_db, tmp_path):
    """An open run left idle past the worker's idle timeout is abandoned by the worker; the next
    import must not append to it (that would be dead-lettered) but start part 2."""
    run = f"{NS}/{SID}"
    worker = start_worker(settings, tmp_path / "w.log", GOOSE_INGEST_RUN_IDLE_TIMEOUT_S="2")
    try:
        conn = open_readonly(fixture_db)
        last = max(m.created for m in read_messages(conn, SID))
        conn.close()
        env = cli_env(settings, GOOSE_INGEST_RUN_IDLE_TIMEOUT_S="2")
        args = ["--namespace", NS, "--no-progress"]
        res = cli(settings, str(fixture_db), *args, "--now", _iso(last + 10), env=env)
        assert res.returncode == 0, res.stderr
        wait_until(lambda: any(r["runId"] == run and r["state"] == "abandoned"
                               for r in topic(settings, settings.runs_stream())), timeout=60)
        _grow(fixture_db, SID, last + 20, ["Back again."])
        res = cli(settings, str(fixture_db), *args, "--now", LATER, env=env)
        assert res.returncode == 0, res.stderr
        cont = f"{run}/2"
        entries = by_run(raw_fields(settings))
        assert len(entries[run]) == 19 and entries[cont][0]["continues"] == run
        assert [json.loads(e["line"])["type"] for e in entries[cont][:-1]] == ["message", "complete"]
        # the whole session's usage lands in part 2: part 1 never reported any
        conn = open_readonly(fixture_db)
        assert json.loads(entries[cont][1]["line"]) == usage_complete(conn, SID)
        conn.close()
        wait_until(lambda: cont in ended_runs(settings), timeout=60)
        assert [e["message"] for e in events_by_run(settings)[cont] if e["type"] == "agent"] == ["Back again."]
        assert not [d for d in topic_dead(settings)]
    finally:
        stop(worker)


def topic_dead(settings) -> list:
    return redis.Redis.from_url(settings.redis_url).xrange(settings.deadletters())


def test_an_open_run_is_judged_from_the_active_run_index_never_from_its_state(settings):
    """The importer's role may not read run states (they hold unredacted held lines, issue 21): whether
    the worker still has a run comes from the active-run index. Absent long after our last delivery:
    closed (the session continues as a new part); absent just after it: not processed yet."""
    from services.backfill.importer import LAG_GRACE_S, Checkpoint, _now_ms_of, _open_run_state

    client = redis.Redis.from_url(settings.redis_url)
    layout = settings.layout
    now = _now_ms_of(client)
    run = "imp/open-run"
    client.hset(layout.run_state(run), "s", json.dumps({"state": "ended"}))  # must not be what decides
    recent, old = Checkpoint(run=run, last_ms=now - 1000), Checkpoint(run=run, last_ms=now - int(LAG_GRACE_S * 1000) - 1000)
    assert _open_run_state(client, settings, recent) is None
    assert _open_run_state(client, settings, old) == "closed"
    client.zadd(layout.active_runs(layout.shard_of(run)), {run: now})
    assert _open_run_state(client, settings, old) == "running"
