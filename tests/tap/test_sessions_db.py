"""sessions.db reader: fixture (schema 17), older schemas (6, 14, 15), errors, concurrent writer."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.backfill import (
    SessionsDbError,
    list_sessions,
    open_readonly,
    read_messages,
    schema_version,
    usage_complete,
    usage_complete_with_source,
)
from tests.support.fixtures import FIXTURES  # noqa: E402

SQL = FIXTURES / "a-read-edit-test-finish.sessions-db.sql"
STREAM = FIXTURES / "a-read-edit-test-finish.jsonl"
SID = "20260926_3"




def _stream_complete() -> dict:
    last = STREAM.read_text("utf-8").strip().splitlines()[-1]
    rec = json.loads(last)
    assert rec["type"] == "complete"
    return rec


# --- the schema-17 fixture ---------------------------------------------------------------------


def test_fixture_session(fixture_db):
    conn = open_readonly(fixture_db)
    assert schema_version(conn) == 17
    [s] = list_sessions(conn)
    assert s.id == SID and s.session_type == "user" and s.working_dir == "/home/dev/acme-widgets"
    assert s.name == "Fix pager off-by-one" and s.parent_session_id is None
    assert s.provider_name == "anthropic" and s.model == "claude-sonnet-4-5"
    assert s.created_at == datetime(2026, 9, 26, 12, 42, 10, tzinfo=UTC)
    assert list_sessions(conn, session_id=SID) == [s]
    assert list_sessions(conn, session_id="nope") == []
    assert list_sessions(conn, since=datetime(2026, 9, 26, 12, 42, 10)) == [s]  # naive = UTC, inclusive
    assert list_sessions(conn, since=datetime(2026, 9, 26, 12, 42, 11, tzinfo=UTC)) == []


def test_fixture_messages_order_is_created_timestamp_then_id(fixture_db):
    msgs = read_messages(open_readonly(fixture_db), SID)
    assert len(msgs) == 19
    # rows 7 (created ...340) and 8 (created ...339): created_timestamp wins over id
    assert [m.rowid for m in msgs] == [1, 2, 3, 4, 5, 6, 8, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    keys = [(m.created, m.rowid) for m in msgs]
    assert keys == sorted(keys)


def test_fixture_prompt_row_and_line_shape(fixture_db):
    msgs = read_messages(open_readonly(fixture_db), SID)
    p = msgs[0]
    assert p.rowid == 1 and p.role == "user"
    assert p.message_id == "msg_cea66c71-6b44-41fb-bed3-30d74f662560"
    assert p.created == 1790431331
    assert p.content == [{"type": "text", "text": "Fix the off-by-one in paginate() in src/widgets/pager.py and make sure the tests pass."}]
    assert p.metadata == {"userVisible": True, "agentVisible": True}
    assert p.line == (
        '{"type":"message","message":{"id":"msg_cea66c71-6b44-41fb-bed3-30d74f662560","role":"user",'
        '"created":1790431331,"content":[{"type":"text","text":"Fix the off-by-one in paginate() in '
        'src/widgets/pager.py and make sure the tests pass."}],"metadata":{"userVisible":true,"agentVisible":true}}}'
    )
    rec = json.loads(msgs[2].line)
    assert list(rec) == ["type", "message"]
    assert list(rec["message"]) == ["id", "role", "created", "content", "metadata"]
    assert rec["message"]["content"][1]["type"] == "toolRequest"
    assert rec["message"]["metadata"]["usage"]["inputTokens"] == 5101


def test_fixture_usage_from_ledger_equals_stream_complete(fixture_db):
    conn = open_readonly(fixture_db)
    rec, source = usage_complete_with_source(conn, SID)
    assert source == "usage_ledger"
    assert rec == _stream_complete()
    assert json.dumps(rec, separators=(",", ":")) == STREAM.read_text("utf-8").strip().splitlines()[-1]


def test_usage_from_message_metadata_when_ledger_has_no_rows(fixture_db):
    w = sqlite3.connect(fixture_db)
    w.execute("DELETE FROM usage_ledger")
    w.commit()
    w.close()
    rec, source = usage_complete_with_source(open_readonly(fixture_db), SID)
    assert source == "message_metadata"
    # the fixture's per-turn usage covers the same six calls as the ledger
    assert rec == _stream_complete()


def test_ledger_and_metadata_are_never_added(fixture_db):
    w = sqlite3.connect(fixture_db)
    w.execute("DELETE FROM usage_ledger WHERE id > 1")
    w.commit()
    w.close()
    rec = usage_complete(open_readonly(fixture_db), SID)
    assert rec == {"type": "complete", "total_tokens": 5252, "input_tokens": 5101, "output_tokens": 151,
                   "cache_read_input_tokens": 0, "cache_write_input_tokens": 3000, "cost_usd": 0.0218}


def test_usage_fallbacks_when_neither_ledger_nor_metadata(fixture_db):
    w = sqlite3.connect(fixture_db)
    w.execute("DELETE FROM usage_ledger")
    w.execute("UPDATE messages SET metadata_json = '{\"userVisible\":true,\"agentVisible\":true}'")
    w.commit()
    rec, source = usage_complete_with_source(open_readonly(fixture_db), SID)
    assert source == "session_accumulated"
    assert rec == _stream_complete()  # the fixture's accumulated_* columns hold the run totals
    w.execute("UPDATE sessions SET accumulated_total_tokens = NULL, accumulated_input_tokens = 0,"
              " accumulated_output_tokens = NULL, accumulated_cache_read_tokens = NULL,"
              " accumulated_cache_write_tokens = NULL, accumulated_cost = 0")
    w.commit()
    w.close()
    rec, source = usage_complete_with_source(open_readonly(fixture_db), SID)
    assert (rec, source) == ({"type": "complete", "total_tokens": None}, "none")


def test_usage_keys_omitted_when_unknown(fixture_db):
    w = sqlite3.connect(fixture_db)
    w.execute("UPDATE usage_ledger SET cache_write_tokens = NULL, cost = NULL, total_tokens = NULL")
    w.commit()
    w.close()
    rec = usage_complete(open_readonly(fixture_db), SID)
    assert rec == {"type": "complete", "total_tokens": 41877, "input_tokens": 40309, "output_tokens": 1568,
                   "cache_read_input_tokens": 30620}


# --- older schemas -----------------------------------------------------------------------------

SESSIONS_V6 = """CREATE TABLE sessions (id TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '',
    working_dir TEXT NOT NULL, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, extension_data TEXT DEFAULT '{}',
    total_tokens INTEGER, input_tokens INTEGER, output_tokens INTEGER,
    accumulated_total_tokens INTEGER, accumulated_input_tokens INTEGER, accumulated_output_tokens INTEGER,
    schedule_id TEXT, recipe_json TEXT, name TEXT NOT NULL DEFAULT '', user_set_name BOOLEAN DEFAULT FALSE,
    session_type TEXT NOT NULL DEFAULT 'user', user_recipe_values_json TEXT)"""
MESSAGES_V6 = """CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL, content_json TEXT NOT NULL,
    created_timestamp INTEGER NOT NULL, timestamp TIMESTAMP DEFAULT CURRENT_TIMESTAMP, tokens INTEGER,
    metadata_json TEXT)"""
SESSIONS_V14 = SESSIONS_V6[:-1] + """, provider_name TEXT, model_config_json TEXT,
    goose_mode TEXT NOT NULL DEFAULT 'auto', archived_at TIMESTAMP, project_id TEXT, accumulated_cost REAL,
    cache_read_tokens INTEGER, cache_write_tokens INTEGER, accumulated_cache_read_tokens INTEGER,
    accumulated_cache_write_tokens INTEGER)"""
MESSAGES_V7 = MESSAGES_V6.replace("(id INTEGER PRIMARY KEY AUTOINCREMENT,", "(id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT,")
SESSIONS_V15 = SESSIONS_V14[:-1] + ", parent_session_id TEXT)"
LEDGER = """CREATE TABLE usage_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, created_timestamp INTEGER NOT NULL,
    model TEXT, input_tokens INTEGER, output_tokens INTEGER, total_tokens INTEGER, cache_read_tokens INTEGER,
    cache_write_tokens INTEGER, cost REAL, cost_source TEXT, is_compaction INTEGER DEFAULT 0)"""


def _make_db(path: Path, version: int, ddl: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)")
    for v in range(1, version + 1):
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (v,))
    for stmt in ddl:
        conn.execute(stmt)
    conn.commit()
    return conn


def test_schema_6_without_message_id_and_ms_timestamps(tmp_path):
    path = tmp_path / "v6.db"
    w = _make_db(path, 6, [SESSIONS_V6, MESSAGES_V6])
    w.execute("INSERT INTO sessions (id, working_dir, created_at, name) VALUES ('20251201_1', '/w', '2025-12-01 09:00:00', 'old')")
    w.execute("INSERT INTO sessions (id, working_dir, created_at) VALUES ('20251130_4', '/v', '2025-11-30 23:59:59')")
    rows = [
        (10, "20251201_1", "user", '[{"type":"text","text":"hi"}]', 1764579600000, None),  # legacy ms
        (11, "20251201_1", "assistant", '[{"type":"text","text":"hello"}]', 1764579601000, '{"userVisible":true,"agentVisible":true}'),
        (12, "20251201_1", "assistant", "not json", 1764579601999, None),
    ]
    w.executemany("INSERT INTO messages (id, session_id, role, content_json, created_timestamp, metadata_json) VALUES (?,?,?,?,?,?)", rows)
    w.commit()
    w.close()
    conn = open_readonly(path)
    assert schema_version(conn) == 6
    sessions = list_sessions(conn)
    assert [s.id for s in sessions] == ["20251130_4", "20251201_1"]  # by created_at
    s = sessions[1]
    assert s.parent_session_id is None and s.provider_name is None and s.model is None and s.name == "old"
    msgs = read_messages(conn, "20251201_1")
    assert [m.message_id for m in msgs] == ["msg_20251201_1_10", "msg_20251201_1_11", "msg_20251201_1_12"]
    assert [m.created for m in msgs] == [1764579600, 1764579601, 1764579601]
    assert msgs[0].metadata is None
    assert json.loads(msgs[0].line) == {"type": "message", "message": {
        "id": "msg_20251201_1_10", "role": "user", "created": 1764579600, "content": [{"type": "text", "text": "hi"}]}}
    assert msgs[2].content == "not json"  # kept verbatim; a non-array content yields no events downstream
    assert usage_complete(conn, "20251201_1") == {"type": "complete", "total_tokens": None}


def test_schema_14_without_ledger_uses_message_metadata(tmp_path):
    path = tmp_path / "v14.db"
    w = _make_db(path, 14, [SESSIONS_V14, MESSAGES_V7])
    w.execute("INSERT INTO sessions (id, working_dir, created_at, provider_name, model_config_json, accumulated_total_tokens)"
              " VALUES ('20260610_2', '/w', '2026-06-10 10:00:00', 'openai', '{\"model_name\":\"gpt-5\"}', 999999)")
    meta = {"userVisible": True, "agentVisible": True,
            "usage": {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120, "cacheReadTokens": 50, "cost": 0.1}}
    meta2 = dict(meta, usage={"inputTokens": 200, "outputTokens": 30, "totalTokens": 230, "cacheReadTokens": 150, "cost": 0.2})
    w.executemany(
        "INSERT INTO messages (message_id, session_id, role, content_json, created_timestamp, metadata_json) VALUES (?,?,?,?,?,?)",
        [("chatcmpl-1", "20260610_2", "assistant", "[]", 1781085600, json.dumps(meta)),
         (None, "20260610_2", "assistant", "[]", 1781085601, json.dumps(meta2))],
    )
    w.commit()
    w.close()
    conn = open_readonly(path)
    assert schema_version(conn) == 14
    [s] = list_sessions(conn)
    assert s.parent_session_id is None and s.provider_name == "openai" and s.model == "gpt-5"
    msgs = read_messages(conn, "20260610_2")
    assert [m.message_id for m in msgs] == ["chatcmpl-1", "msg_20260610_2_2"]
    rec, source = usage_complete_with_source(conn, "20260610_2")
    assert source == "message_metadata"  # the accumulated columns are not mixed in
    assert rec == {"type": "complete", "total_tokens": 350, "input_tokens": 300, "output_tokens": 50,
                   "cache_read_input_tokens": 200, "cost_usd": 0.3}


def test_schema_15_parent_session_and_ledger(tmp_path):
    path = tmp_path / "v15.db"
    w = _make_db(path, 15, [SESSIONS_V15, MESSAGES_V7, LEDGER])
    w.execute("INSERT INTO sessions (id, working_dir, created_at) VALUES ('20260706_1', '/w', '2026-07-06 08:00:00')")
    w.execute("INSERT INTO sessions (id, working_dir, created_at, session_type, parent_session_id)"
              " VALUES ('20260706_2', '/w', '2026-07-06 08:00:05', 'sub_agent', '20260706_1')")
    w.execute("INSERT INTO usage_ledger (session_id, created_timestamp, input_tokens, output_tokens, total_tokens)"
              " VALUES ('20260706_2', 1783324805, 10, 5, 15)")
    w.commit()
    w.close()
    conn = open_readonly(path)
    parent, child = list_sessions(conn)
    assert child.parent_session_id == "20260706_1" and child.session_type == "sub_agent"
    assert usage_complete(conn, "20260706_2") == {"type": "complete", "total_tokens": 15, "input_tokens": 10, "output_tokens": 5}
    # ledger table present but no rows for the parent and no metadata: nothing known
    assert usage_complete(conn, "20260706_1") == {"type": "complete", "total_tokens": None}
    assert read_messages(conn, "20260706_1") == []


# --- errors ------------------------------------------------------------------------------------


def test_missing_file_is_a_clear_error_and_not_created(tmp_path):
    path = tmp_path / "nope" / "sessions.db"
    with pytest.raises(SessionsDbError, match="sessions.db not found"):
        open_readonly(path)
    assert not path.exists()
    path2 = tmp_path / "sessions.db"
    with pytest.raises(SessionsDbError, match="not found"):
        open_readonly(path2)
    assert not path2.exists()


def test_not_sqlite(tmp_path):
    path = tmp_path / "sessions.db"
    path.write_text("this is not a database\n" * 100)
    with pytest.raises(SessionsDbError, match="not a SQLite database"):
        open_readonly(path)


def test_sqlite_without_goose_tables(tmp_path):
    path = tmp_path / "other.db"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    c.commit()
    c.close()
    with pytest.raises(SessionsDbError, match="not a goose sessions.db.*no sessions and no messages table"):
        open_readonly(path)


@pytest.mark.parametrize("version, word", [(5, "older"), (18, "newer")])
def test_unsupported_schema_version(tmp_path, version, word):
    path = tmp_path / "s.db"
    _make_db(path, version, [SESSIONS_V6, MESSAGES_V6]).close()
    with pytest.raises(SessionsDbError, match=f"unsupported sessions.db schema version {version}: {word}"):
        open_readonly(path)


def test_connection_is_read_only(fixture_db):
    conn = open_readonly(fixture_db)
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM messages")
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000


# --- concurrent writer (WAL) -------------------------------------------------------------------


def test_reading_while_goose_writes(fixture_db):
    w = sqlite3.connect(fixture_db)
    assert w.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    w.close()
    n_writes = 300
    errors: list[BaseException] = []
    done = threading.Event()

    def writer():
        try:
            c = sqlite3.connect(fixture_db, timeout=30)
            c.execute("PRAGMA busy_timeout=30000")
            for i in range(n_writes):
                with c:  # one transaction per row, like goose
                    c.execute(
                        "INSERT INTO messages (message_id, session_id, role, content_json, created_timestamp, metadata_json)"
                        " VALUES (?, ?, 'assistant', ?, ?, ?)",
                        (f"msg_w{i}", SID, json.dumps([{"type": "text", "text": f"w{i}"}]), 1790431400 + i,
                         json.dumps({"userVisible": True, "agentVisible": True})),
                    )
                    c.execute(
                        "INSERT INTO usage_ledger (session_id, created_timestamp, input_tokens, output_tokens, total_tokens)"
                        " VALUES (?, ?, 1, 1, 2)", (SID, 1790431400 + i))
            c.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    conn = open_readonly(fixture_db)
    t = threading.Thread(target=writer)
    t.start()
    seen = []
    while not done.is_set() or len(seen) < 2:
        msgs = read_messages(conn, SID)
        keys = [(m.created, m.rowid) for m in msgs]
        assert keys == sorted(keys)
        assert [m.rowid for m in msgs[:9]] == [1, 2, 3, 4, 5, 6, 8, 7, 9]
        rec = usage_complete(conn, SID)
        assert rec["total_tokens"] >= 41877
        seen.append(len(msgs))
    t.join(30)
    assert not errors, errors
    assert seen == sorted(seen)  # a reader only ever moves forward
    assert len(read_messages(conn, SID)) == 19 + n_writes
    assert usage_complete(conn, SID)["total_tokens"] == 41877 + 2 * n_writes


# --- odd values: parsed totally, never raised (issue 22 §1) ---------------------------------------

from services.backfill.sessions_db import INT64_MAX, parse_time, usage_report  # noqa: E402


@pytest.mark.parametrize("value, expected", [
    (None, (None, False)),
    ("", (None, False)),
    ("2026-09-26 12:42:10", (datetime(2026, 9, 26, 12, 42, 10, tzinfo=UTC), False)),
    (1790426530, (datetime(2026, 9, 26, 12, 42, 10, tzinfo=UTC), False)),
    (1790426530000, (datetime(2026, 9, 26, 12, 42, 10, tzinfo=UTC), False)),  # legacy ms
    (float("inf"), (None, True)),
    (float("nan"), (None, True)),
    (1e300, (None, True)),
    (-1e15, (None, True)),
    (2**63 - 1, (None, True)),
    ("yesterday", (None, True)),
    ("0001-01-01T00:00:00+01:00", (None, True)),  # shifted to UTC: before year 1
    (b"\x00\x01", (None, True)),
])
def test_parse_time_is_total(value, expected):
    assert parse_time(value) == expected


def _spoilt(fixture_db, *sql: str) -> sqlite3.Connection:
    w = sqlite3.connect(fixture_db)
    for stmt in sql:
        w.execute(stmt)
    w.commit()
    w.close()
    return open_readonly(fixture_db)


def test_ledger_sum_past_int64_is_omitted_not_raised(fixture_db):
    conn = _spoilt(fixture_db, f"UPDATE usage_ledger SET total_tokens = {2**62}")  # 6 rows: SQL SUM would raise
    rep = usage_report(conn, SID)
    assert rep.source == "usage_ledger"
    assert rep.record["total_tokens"] is None and rep.record["input_tokens"] == 40309  # not derived: it was recorded
    [odd] = rep.odd
    assert (odd.table, odd.column, odd.rowid, odd.value) == ("usage_ledger", "SUM(total_tokens)", None, 6 * 2**62)
    assert odd.value > INT64_MAX


@pytest.mark.parametrize("value, storage, shown", [("'n/a'", "text", "n/a"), ("-0.5", "real", "-0.5"),
                                                   ("9e999", "real", "inf"), ("x'00ff'", "blob", "00ff")])
def test_ledger_odd_cost_omits_cost_and_is_evidence(fixture_db, value, storage, shown):
    conn = _spoilt(fixture_db, f"UPDATE usage_ledger SET cost = {value} WHERE id = 2")
    rep = usage_report(conn, SID)
    assert "cost_usd" not in rep.record and rep.record["total_tokens"] == 41877  # the counters still add up
    [odd] = rep.odd
    ev = odd.evidence()
    assert ev == {"type": "goose-ingest.native", "source": "sessions.db", "session": SID, "table": "usage_ledger",
                  "column": "cost", "rowid": "2", "storage": storage, "value": shown, "outcome": odd.outcome}
    json.loads(json.dumps(ev, allow_nan=False))  # evidence is plain JSON


def test_odd_metadata_usage_and_accumulated_values(fixture_db):
    conn = _spoilt(fixture_db, "DELETE FROM usage_ledger",
                   """UPDATE messages SET metadata_json = '{"usage":{"inputTokens":"12","outputTokens":1}}'
                      WHERE id = (SELECT MIN(id) FROM messages WHERE metadata_json LIKE '%usage%')""")
    rep = usage_report(conn, SID)
    assert rep.source == "message_metadata" and "input_tokens" not in rep.record
    assert [(o.column, o.value) for o in rep.odd] == [("metadata_json.usage.inputTokens", "12")]
    conn = _spoilt(fixture_db, """UPDATE messages SET metadata_json = '{"userVisible":true}'""",
                   "UPDATE sessions SET accumulated_cost = 'lots', accumulated_input_tokens = -3")
    rep = usage_report(conn, SID)
    assert rep.source == "session_accumulated"
    assert "cost_usd" not in rep.record and "input_tokens" not in rep.record and rep.record["total_tokens"] == 41877
    assert sorted(o.column for o in rep.odd) == ["accumulated_cost", "accumulated_input_tokens"]


def test_odd_message_cells_are_replaced_and_reported(fixture_db):
    conn = _spoilt(fixture_db, "UPDATE messages SET created_timestamp = 9e999 WHERE id = 4",
                   "UPDATE messages SET role = x'ff' WHERE id = 5",
                   "UPDATE messages SET content_json = '[1e400]' WHERE id = 6",
                   "UPDATE messages SET message_id = 42 WHERE id = 9",
                   "UPDATE messages SET metadata_json = CAST(x'7b22ff' AS TEXT) WHERE id = 10")
    msgs = read_messages(conn, SID)
    by_row = {m.rowid: m for m in msgs}
    assert msgs[-1].rowid == 4  # +Inf sorts last (the spec's order over the stored values) ...
    assert by_row[4].created == msgs[-2].created  # ... and takes its predecessor's time
    assert [o.column for o in by_row[4].odd] == ["created_timestamp"]
    assert by_row[5].role == "ff" and [o.column for o in by_row[5].odd] == ["role"]
    assert by_row[6].content == "[1e400]"  # not JSON a worker can read: kept as text
    assert by_row[9].message_id == "42"  # INTEGER into a TEXT column: SQLite made it text
    assert by_row[10].metadata == '{"\ufffd'  # not UTF-8: U+FFFD, no exception
    for m in msgs:
        json.loads(m.line, parse_constant=lambda c: pytest.fail(f"{c} in a line"))


def test_odd_session_row_and_model_from_the_ledger(fixture_db):
    conn = _spoilt(fixture_db, "UPDATE sessions SET created_at = -1e15, updated_at = 1e300, model_config_json = '{'",
                   "UPDATE usage_ledger SET model = 'claude-opus-4' WHERE id = (SELECT MAX(id) FROM usage_ledger)")
    [s] = list_sessions(conn)
    assert s.created_at is None and s.updated_at is None
    assert [o.column for o in s.odd] == ["created_at", "updated_at"]
    assert s.model == "claude-opus-4"  # model_config_json names none: the last ledger row's
    assert list_sessions(conn, since=datetime(2030, 1, 1)) == [s]  # an unknown creation time is never dropped
