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
from tests.support.fixtures import FIXTURES  # noqa: E402
from tests.support.pipeline import (
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
    for stream in settings.layout.raw_streams():
        for _sid, f in r.xrange(stream):
            out.append({k.decode(): v.decode() for k, v in f.items()})
    return out


def raw_len(settings) -> int:
    r = redis.Redis.from_url(settings.redis_url)
    return sum(r.xlen(s) for s in settings.layout.raw_streams())


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
    records = [r for r in topic(settings, settings.layout.runs_partition(0)) if r["runId"] == run]
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
                               for r in topic(settings, settings.layout.runs_partition(0))), timeout=60)
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
    return redis.Redis.from_url(settings.redis_url).xrange(settings.layout.deadletter_partition(0))


# --- odd values: one bad session never stops the others (issue 22 §1) ------------------------------

GOOD = "20260101_9"
T0 = 1_767_225_600  # 2026-01-01


def _sessions(db: Path, sids: list[str], n: int = 8) -> None:
    """Sessions of n messages each, created a minute apart in the order given."""
    import random

    conn = create_schema(db)
    rng = random.Random(3)
    for i, sid in enumerate(sids):
        add_session(conn, sid, T0 + 60 * i, n, rng)
    conn.commit()
    conn.close()


# one bad session per case (issue 22 §1), each created before the good one:
# case -> (its session id, the column named on stderr, what its `complete` must say)
ODD_CASES = {
    "created_timestamp-inf": ("20260101_1", "messages.created_timestamp", None),
    "updated_at-1e300": ("20260101_2", "sessions.updated_at", None),
    "ledger-cost-text": ("20260101_3", "usage_ledger.cost", lambda c: "cost_usd" not in c and c["total_tokens"] > 0),
    "ledger-sum-overflow": ("20260101_4", "usage_ledger.SUM(total_tokens)",
                            lambda c: c["total_tokens"] is None and c["input_tokens"] > 0 and c["cost_usd"] > 0),
    "accumulated_cost-text": ("20260101_5", "sessions.accumulated_cost",
                              lambda c: c == {"type": "complete", "total_tokens": 1234}),
    "created_at-minus-1e15": ("20260101_6", "sessions.created_at", None),
}


def _spoil(db: Path) -> None:
    sid = {case: v[0] for case, v in ODD_CASES.items()}
    conn = sqlite3.connect(db)
    conn.execute("UPDATE messages SET created_timestamp = ? WHERE id = (SELECT id FROM messages"
                 " WHERE session_id = ? ORDER BY id LIMIT 1 OFFSET 2)", (float("inf"), sid["created_timestamp-inf"]))
    conn.execute("UPDATE sessions SET updated_at = 1e300 WHERE id = ?", (sid["updated_at-1e300"],))
    conn.execute("UPDATE usage_ledger SET cost = 'n/a' WHERE id = (SELECT MIN(id) FROM usage_ledger"
                 " WHERE session_id = ?)", (sid["ledger-cost-text"],))
    # two rows of 2^62: SQLite's own SUM raises "integer overflow"
    conn.execute("UPDATE usage_ledger SET total_tokens = ? WHERE session_id = ?", (2**62, sid["ledger-sum-overflow"]))
    acc = sid["accumulated_cost-text"]  # no ledger rows, no per-turn usage: accumulated_* is the source
    conn.execute("DELETE FROM usage_ledger WHERE session_id = ?", (acc,))
    conn.execute("UPDATE messages SET metadata_json = '{\"userVisible\":true,\"agentVisible\":true}'"
                 " WHERE session_id = ?", (acc,))
    conn.execute("UPDATE sessions SET accumulated_total_tokens = 1234, accumulated_cost = 'lots' WHERE id = ?", (acc,))
    conn.execute("UPDATE sessions SET created_at = -1e15 WHERE id = ?", (sid["created_at-minus-1e15"],))
    conn.commit()
    conn.close()


def _entries_of(settings, run: str) -> list[dict]:
    return by_run(raw_fields(settings)).get(run, [])


def test_odd_values_are_kept_as_evidence_and_the_good_session_imported_once(settings, tmp_path):
    """Each odd value of issue 22 §1 in its own session, all created before the good one: exit 0,
    one warning per bad session naming the column, every session whole (messages, evidence,
    complete, eof), the good one exactly once; a re-run publishes nothing."""
    db = tmp_path / "sessions.db"
    _sessions(db, [v[0] for v in ODD_CASES.values()] + [GOOD])
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM usage_ledger WHERE session_id = ?",
                        (ODD_CASES["ledger-sum-overflow"][0],)).fetchone()[0] >= 2
    conn.close()
    _spoil(db)
    res = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", LATER)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if ": warning: " in ln]
    assert len(warnings) == len(ODD_CASES), res.stderr
    for sid, column, _ok in ODD_CASES.values():
        assert any(f"session {sid!r}: 1 odd value(s) kept as native evidence: {column}" in w for w in warnings), \
            (column, res.stderr)
    assert res.stderr.strip().splitlines()[-1] == (
        "goose-ingest import-sessions: 7 session(s): 7 imported, 0 skipped; published 56 message(s), "
        "7 run(s) ended, 6 odd value(s) kept as native evidence")
    # the good session: each message once, then complete + eof
    good = _entries_of(settings, f"{NS}/{GOOD}")
    assert [int(e["seq"]) for e in good] == list(range(10))
    assert len({e["src.message_id"] for e in good[:8]}) == 8 and not any("src.native" in e for e in good)
    assert good[-1]["kind"] == "eof" and json.loads(good[-2]["line"])["type"] == "complete"
    # each bad session: whole, with its evidence line (an unknown record) and its run's end
    for case, (sid, column, complete_ok) in ODD_CASES.items():
        bad = _entries_of(settings, f"{NS}/{sid}")
        assert [int(e["seq"]) for e in bad] == list(range(11)), case
        assert bad[-1]["kind"] == "eof"
        evidence = [json.loads(e["line"]) for e in bad if e.get("src.native") == "1"]
        assert len(evidence) == 1 and evidence[0]["type"] == "goose-ingest.native", case
        assert f"{evidence[0]['table']}.{evidence[0]['column']}" == column
        complete = json.loads(bad[-2]["line"])
        assert complete["type"] == "complete"
        if complete_ok is not None:
            assert complete_ok(complete), (case, complete)
        assert all(-62135596800000 <= int(e["ts"]) <= 253402300799999 for e in bad), case
    # a re-run publishes nothing, reports nothing again, exits the same
    n = raw_len(settings)
    again = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", LATER)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines() == [
        "goose-ingest import-sessions: 7 session(s): 7 imported, 0 skipped; published 0 message(s), "
        "0 run(s) ended, 0 odd value(s) kept as native evidence"]
    assert raw_len(settings) == n


def test_evidence_becomes_unknown_events_and_both_runs_end(settings, tmp_path, worker):
    """Through a real worker: the evidence lines are `unknown` events holding the native values; no
    dead letter; both runs end, the bad one without the cost it could not sum."""
    bad = ODD_CASES["created_timestamp-inf"][0]
    db = tmp_path / "sessions.db"
    _sessions(db, [bad, GOOD])
    conn = sqlite3.connect(db)
    conn.execute("UPDATE messages SET created_timestamp = ? WHERE id = (SELECT MIN(id) + 2 FROM messages)",
                 (float("inf"),))
    conn.execute("UPDATE usage_ledger SET cost = 'n/a' WHERE id = (SELECT MIN(id) FROM usage_ledger)")
    conn.commit()
    conn.close()
    imp(settings, db)
    runs = {f"{NS}/{bad}", f"{NS}/{GOOD}"}
    wait_until(lambda: runs <= ended_runs(settings), timeout=60)
    events = events_by_run(settings)
    unknown = [e["raw"] for e in events[f"{NS}/{bad}"] if e["type"] == "unknown"]
    assert {(u["table"], u["column"], u["storage"], u["value"]) for u in unknown} == {
        ("messages", "created_timestamp", "real", "inf"), ("usage_ledger", "cost", "text", "n/a")}
    for run in runs:
        assert events[run] == expected_events(settings, run)
    assert not topic_dead(settings)
    records = {r["runId"]: r for r in topic(settings, settings.layout.runs_partition(0)) if r["state"] == "ended"}
    assert "costUsd" not in records[f"{NS}/{bad}"] and records[f"{NS}/{bad}"]["totalTokens"] > 0
    assert records[f"{NS}/{GOOD}"]["costUsd"] > 0


def test_sessions_without_a_usable_id_are_skipped_exit_3(settings, tmp_path):
    """NULL, a blob, and text that forms no run key: each skipped with one line naming the column,
    exit 3, the good session imported once (also on the re-run, which skips them again). The good
    session names no model itself: its `model` is its last ledger row's."""
    db = tmp_path / "sessions.db"
    _sessions(db, ["20260101_1", "20260101_2", "20260101_3", GOOD])
    conn = sqlite3.connect(db)
    for old, new in (("20260101_1", None), ("20260101_2", b"\x01blob"), ("20260101_3", "has space/and slash")):
        conn.execute("UPDATE sessions SET id = ? WHERE id = ?", (new, old))
    conn.execute("UPDATE sessions SET model_config_json = NULL WHERE id = ?", (GOOD,))
    conn.execute("UPDATE usage_ledger SET model = 'gpt-5-mini' WHERE id = (SELECT MAX(id) FROM usage_ledger"
                 " WHERE session_id = ?)", (GOOD,))
    conn.commit()
    conn.close()
    res = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", LATER)
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr
    skips = [ln for ln in res.stderr.splitlines() if " skipped: " in ln]
    assert len(skips) == 3 and all(ln.startswith("goose-ingest import-sessions: warning: session ") and
                                   " skipped: sessions.id " in ln for ln in skips), res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "goose-ingest import-sessions: 4 session(s): 1 imported, 3 skipped (3 sessions.id); published 8 message(s), "
        "1 run(s) ended, 0 odd value(s) kept as native evidence")
    entries = by_run(raw_fields(settings))
    assert set(entries) == {f"{NS}/{GOOD}"} and len(entries[f"{NS}/{GOOD}"]) == 10
    assert {e["model"] for e in entries[f"{NS}/{GOOD}"]} == {"gpt-5-mini"}
    again = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", LATER)
    assert again.returncode == 3 and "published 0 message(s)" in again.stderr
    assert len(_entries_of(settings, f"{NS}/{GOOD}")) == 10


# --- property: arbitrary values in every column the importer reads --------------------------------

from hypothesis import HealthCheck, example, given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class _BadUtf8(bytes):
    """Bytes stored as TEXT (``CAST(? AS TEXT)``): text that is not UTF-8, as a torn write leaves."""


def _bind(v):
    if isinstance(v, int) and not -(2**63) <= v < 2**63:
        return str(v)  # SQLite holds no such integer; as text (INTEGER affinity makes it a REAL)
    return v


_ANY = st.one_of(
    st.none(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e15, float("inf"), -1.0, 0.5]),
    st.text(max_size=12),
    st.sampled_from(["", "n/a", "2026-13-45 99:99:99", "0001-01-01T00:00:00+01:00", "[[[[", "{\"a\":NaN}",
                     "[1e400]", '{"usage":{"inputTokens":-5}}', '{"model_name":7}',
                     '{"model_name":"\\udc80"}', '[{"type":"text","text":"\\ud800"}]',
                     '{"usage":{"totalTokens":99999999999999999999,"cost":1e308}}']),
    st.binary(max_size=8),
    st.binary(min_size=1, max_size=6).map(_BadUtf8),
)


def _col(good):
    """(good?, value): mostly a plausible value, sometimes anything at all."""
    return st.one_of(good.map(lambda v: (True, v)), good.map(lambda v: (True, v)), _ANY.map(lambda v: (False, v)))


def _sessions_of(col):
    """The session strategy with every cell drawn by `col` (`_col`: anything; `_good`: plausible only)."""
    message = st.fixed_dictionaries({
        "message_id": col(st.just(None) | st.uuids().map(lambda u: f"msg_{u.hex[:12]}")),
        "role": col(st.sampled_from(["user", "assistant"])),
        "content_json": col(st.text(max_size=20).map(lambda t: json.dumps([{"type": "text", "text": t}]))),
        "created_timestamp": col(st.integers(T0, T0 + 5000)),
        "metadata_json": col(st.sampled_from([None, '{"userVisible":true,"agentVisible":true}',
                                               '{"usage":{"inputTokens":10,"outputTokens":2,"totalTokens":12,"cost":0.1}}'])),
    })
    ledger = st.fixed_dictionaries({
        c: col(st.integers(0, 10**6)) for c in
        ("total_tokens", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    } | {"cost": col(st.floats(0, 10)), "model": col(st.sampled_from([None, "m-1", "claude-sonnet-4-5"]))})
    return st.fixed_dictionaries({
        "id": col(st.just("ok")),  # the good id is made unique below
        "created_at": col(st.integers(0, 86_399).map(lambda s: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + s)))),
        "updated_at": col(st.none() | st.just("2026-01-02 00:00:00")),
        "parent_session_id": col(st.none()),
        "session_type": col(st.sampled_from(["user", "scheduled", "sub_agent"])),
        "working_dir": col(st.sampled_from(["/w", "/home/dev/acme-widgets", "C:\\work"])),
        "name": col(st.text(max_size=12)),
        "provider_name": col(st.none() | st.sampled_from(["anthropic", "openai"])),
        "model_config_json": col(st.none() | st.just('{"model_name":"gpt-5"}')),
        **{c: col(st.none() | st.integers(0, 10**6)) for c in
           ("accumulated_total_tokens", "accumulated_input_tokens", "accumulated_output_tokens",
            "accumulated_cache_read_tokens", "accumulated_cache_write_tokens")},
        "accumulated_cost": col(st.none() | st.floats(0, 10)),
        "messages": st.lists(message, max_size=4),
        "ledger": st.lists(ledger, max_size=3),
    })


def _good(good):
    """(True, value): a plausible value only."""
    return good.map(lambda v: (True, v))


_session = _sessions_of(_col)
_good_session = _sessions_of(_good)  # one per example: drawn from _session alone, a good one is rare


def _insert(conn, table: str, values: dict) -> None:
    cols = list(values)
    marks = ", ".join("CAST(? AS TEXT)" if isinstance(values[c], _BadUtf8) else "?" for c in cols)
    conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                 [bytes(v) if isinstance(v, _BadUtf8) else _bind(v) for v in values.values()])


def _loose_db(path: Path, sessions: list[dict]) -> dict[str, bool]:
    """The fixture's schema without NOT NULL (any value in any column, types kept for their
    affinity); returns {session id text: every value of it good?} for the sessions with a text id."""
    import re

    from bench.import_sessions import FIXTURE_SQL

    conn = sqlite3.connect(path)
    conn.executescript(re.sub(r"\s+NOT NULL", "", FIXTURE_SQL.read_text("utf-8")))
    conn.executescript("DELETE FROM messages; DELETE FROM usage_ledger; DELETE FROM sessions;")
    good: dict[str, bool] = {}
    for i, s in enumerate(sessions):
        id_good, sid = s["id"]
        if id_good:
            sid = f"20260101_{i + 1}"
        elif isinstance(sid, str) and sid.startswith("20260101_"):
            sid = "x" + sid
        row = {k: v for k, (_g, v) in ((k, s[k]) for k in s if k not in ("id", "messages", "ledger"))}
        all_good = all(s[k][0] for k in s if k not in ("messages", "ledger"))
        try:
            _insert(conn, "sessions", {"id": sid, "working_dir": "/w", **row})
        except sqlite3.IntegrityError:
            continue  # an id drawn twice
        for m in s["messages"]:
            all_good &= all(g for g, _v in m.values())
            _insert(conn, "messages", {"session_id": sid, **{k: v for k, (_g, v) in m.items()}})
        for r in s["ledger"]:
            all_good &= all(g for g, _v in r.values())
            _insert(conn, "usage_ledger", {"session_id": sid, "created_timestamp": T0, **{k: v for k, (_g, v) in r.items()}})
        if id_good:
            good[sid] = all_good
    conn.commit()
    conn.close()
    return good


def _run_in_process(settings, db: Path) -> tuple[int, str]:
    import argparse
    import contextlib
    import io
    import os
    from unittest import mock

    from services.backfill import command

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["import-sessions", str(db), "--namespace", NS, "--no-progress", "--now", LATER])
    err = io.StringIO()
    with mock.patch.dict(os.environ, cli_env(settings), clear=True), contextlib.redirect_stderr(err):
        code = command.run(args)
    return code, err.getvalue()


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sessions=st.tuples(st.lists(_session, max_size=4), _good_session, st.integers(0, 4)).map(
    lambda t: [*t[0][:t[2]], t[1], *t[0][t[2]:]]))
@example(sessions=[{  # lone surrogates from JSON escapes: no raw entry can carry them as they are
    "id": (True, "ok"), "created_at": (True, "2026-01-01 00:00:00"), "updated_at": (True, None),
    "parent_session_id": (True, None), "model_config_json": (False, '{"model_name":"\\udc80"}'),
    **{c: (True, None) for c in ("accumulated_total_tokens", "accumulated_input_tokens", "accumulated_output_tokens",
                                 "accumulated_cache_read_tokens", "accumulated_cache_write_tokens", "accumulated_cost")},
    "messages": [{"message_id": (True, None), "role": (True, "assistant"),
                  "content_json": (False, '[{"type":"text","text":"\\ud800"}]'), "created_timestamp": (True, T0),
                  "metadata_json": (False, '{"usage":{"inputTokens":"\\udc80"},"x":"\\udfff"}')}],
    "ledger": []}, {  # and a good one, as every drawn example has
    "id": (True, "ok"), "created_at": (True, "2026-01-01 00:01:00"), "session_type": (True, "user"),
    "working_dir": (True, "/w"), "name": (True, "ok"), "provider_name": (True, "anthropic"),
    "messages": [{"role": (True, "user"), "content_json": (True, '[{"type":"text","text":"hi"}]'),
                  "created_timestamp": (True, T0 + 60)}],
    "ledger": []}])
def test_property_arbitrary_values_never_stop_the_import(redis_url, tmp_path_factory, sessions):
    """Whatever the cells hold (every column the importer reads): no exception, exit 0 or 3 (3 iff a
    session was skipped), every published run whole (seqs 0..n-1, its messages once, complete, eof,
    lines the workers parse, ts in range), every good session imported exactly once -- counted on
    the raw log as it is, one entry per message plus complete and eof, no seq twice -- and a re-run
    publishes nothing."""
    from uuid import uuid4

    from services.settings import Settings
    from tests.support.redis_server import wipe_namespace

    tmp = tmp_path_factory.mktemp("prop")
    db = tmp / "sessions.db"
    good = _loose_db(db, sessions)
    s = Settings(redis_url=redis_url, namespace=f"p{uuid4().hex[:10]}", shards=2, spool_dir=str(tmp / "spool"))
    try:
        code, err = _run_in_process(s, db)
        assert "Traceback" not in err
        skipped = [ln for ln in err.splitlines() if " skipped: " in ln]
        assert code == (3 if skipped else 0), err
        raw = raw_fields(s)
        runs = by_run(raw)  # seqs merged: the shape of each run; the counts below use `raw` as it is
        conn = open_readonly(db)
        for run, entries in runs.items():
            sid = run.split("/", 1)[1]
            msgs = read_messages(conn, sid)
            assert [int(e["seq"]) for e in entries] == list(range(len(entries)))
            lines = [e for e in entries if e["kind"] != "eof"]
            assert all(-62135596800000 <= int(e["ts"]) <= 253402300799999 for e in entries)
            parsed = [orjson.loads(e["line"]) for e in lines]  # the workers' parser takes every line
            completes = [p for p in parsed if p["type"] == "complete"]
            if entries[-1]["kind"] == "eof":  # ended: exactly one complete, right before the eof
                assert len(completes) == 1 and parsed[-1] == completes[0] and len(lines) == len(entries) - 1
                assert all(v is None or (type(v) is int and 0 <= v < 2**63)
                           for k, v in completes[0].items() if k.endswith("_tokens"))
            else:  # a (valid) time after --now: the session is active, its run stays open
                assert not completes and max(m.created for m in msgs) * 1000 > 0
            assert [e["src.rowid"] for e in lines if "src.rowid" in e and "src.native" not in e] \
                == [str(m.rowid) for m in msgs]
        assert any(good.values())  # the good session drawn for every example (and the @example's)
        for sid, all_good in good.items():
            if all_good:
                entries = runs[f"{NS}/{sid}"]
                assert not any("src.native" in e for e in entries) and entries[-1]["kind"] == "eof"
                assert f"session {sid!r}" not in err
                published = sorted(int(e["seq"]) for e in raw if e["run"] == f"{NS}/{sid}")
                assert published == list(range(len(read_messages(conn, sid)) + 2)), (sid, published)
        conn.close()
        n = raw_len(s)
        code2, err2 = _run_in_process(s, db)
        assert code2 == code and "Traceback" not in err2
        assert "published 0 message(s), 0 run(s) ended, 0 odd value(s)" in err2
        assert raw_len(s) == n
    finally:
        wipe_namespace(redis_url, s.namespace)


def test_a_damaged_page_under_one_session_skips_only_that_session(settings, tmp_path):
    """A disk that filled up mid-write: one leaf page of the messages table is garbage. The session
    whose rows sit on it is skipped (exit 3, one line); the good one is imported."""
    db = tmp_path / "sessions.db"
    bad = "20260101_1"
    _sessions(db, [bad, GOOD], n=40)
    conn = sqlite3.connect(db)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    leaves = [p for (p,) in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY path")]
    first_good = conn.execute("SELECT MIN(id) FROM messages WHERE session_id = ?", (GOOD,)).fetchone()[0]
    conn.close()
    assert len(leaves) > 4
    with open(db, "r+b") as f:  # the first leaf holds the lowest rowids: the bad session's only
        f.seek((leaves[0] - 1) * page_size)
        f.write(b"\xff" * page_size)
    with pytest.raises(sqlite3.DatabaseError):
        read_messages(open_readonly(db), bad)
    assert len(read_messages(open_readonly(db), GOOD)) == 40 and first_good > 0
    res = cli(settings, str(db), "--namespace", NS, "--no-progress", "--now", LATER)
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr
    [skip] = [ln for ln in res.stderr.splitlines() if " skipped: " in ln]
    assert f"session {bad!r} skipped: messages/usage_ledger unreadable: " in skip
    assert "1 skipped (1 messages/usage_ledger)" in res.stderr
    entries = by_run(raw_fields(settings))
    assert set(entries) == {f"{NS}/{GOOD}"} and len(entries[f"{NS}/{GOOD}"]) == 42

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
