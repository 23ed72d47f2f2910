"""PostgreSQL sink, database side: parsing, migrations, idempotent batches, rejected rows, views,
partitions and retention. Real PostgreSQL (tests/support/postgres.py), no broker needed."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest

from services.export.postgres.migrate import LATEST, MigrationError, applied, migrate, shipped
from services.export.postgres.rows import (
    INVALID_ENTRY,
    REJECTED,
    EntryRef,
    parse_event,
    parse_record,
    parse_topic_batch,
)
from services.export.postgres.store import Store
from tests.support import postgres as pg_support

EV = "harness.events"
RUNS = "harness.runs"
_ids = itertools.count(1)

# The PostgreSQL fixtures (tests/support/postgres.py), made visible to this module.
pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn


def event(run: str, n: int, ts: str = "2026-11-30T10:00:00.000Z", **fields) -> tuple[str, str, dict[bytes, bytes]]:
    doc = {"eventId": f"{run}:{n}", "runId": run, "seq": n, "type": "agent", "timestamp": ts, "lines": [n, n]}
    doc.update(fields)
    return EV, f"{next(_ids)}-0", {b"eventId": doc["eventId"].encode(), b"runId": run.encode(), b"seq": str(n).encode(),
                                   b"type": str(doc["type"]).encode(), b"data": orjson.dumps(doc)}


def record(run: str, k: int, state: str, ts: str, counts: dict | None = None, **fields) -> tuple[str, str, dict[bytes, bytes]]:
    doc = {"recordId": f"{run}:run:{k}", "runId": run, "state": state, "timestamp": ts, "seq": k,
           "counts": counts or {}}
    doc.update(fields)
    return RUNS, f"{next(_ids)}-0", {b"recordId": doc["recordId"].encode(), b"runId": run.encode(),
                                     b"seq": str(k).encode(), b"state": state.encode(), b"data": orjson.dumps(doc)}


def write(store: Store, entries, horizon: str = "2000-01-01T00:00:00.000Z"):
    events = [e for e in entries if e[0] == EV]
    records = [e for e in entries if e[0] == RUNS]
    parsed = parse_topic_batch(events, records, horizon)
    result = store.write(parsed.events, parsed.records, [EntryRef(s, i) for s, i, _ in entries])
    return parsed, result


@pytest.fixture
def store(pg_dsn: str):
    s = Store(pg_dsn)
    s.migrate()
    yield s
    s.close()


def q(store: Store, query: str, *params):
    return store.connect().execute(query, params or None).fetchall()


# ---------------------------------------------------------------------------------- parsing (pure)


def test_event_entry_to_row_keeps_the_json_verbatim():
    _, sid, fields = event("r", 3, type="command", command="a\tb\\c\nd")
    row = parse_event(EntryRef(EV, sid), fields)
    assert (row.event_id, row.ts, row.month) == ("r:3", "2026-11-30T10:00:00.000Z", "2026-11")
    assert row.data == fields[b"data"]
    # COPY text format: backslashes doubled (JSON escapes survive), the row ends with one newline.
    assert row.copy_line() == b"2026-11-30T10:00:00.000Z\t" + fields[b"data"].replace(b"\\", b"\\\\") + b"\n"


def test_typed_columns_are_generated_from_the_event(store):
    write(store, [event("r", 3, type="command", command="pytest -q", tool="developer__shell", toolCallId="c1",
                        isSuccess=False, exitCode=1, durationMs=1234),
                  event("r", 4, type="read", path="/a b", isSuccess="yes", exitCode="1")])
    assert q(store, "SELECT event_id, run_key, seq, type, ts, tool, tool_call_id, success, exit_code, path, command, "
                    "duration_ms, code FROM events ORDER BY seq") == [
        ("r:3", "r", 3, "command", datetime(2026, 11, 30, 10, tzinfo=UTC), "developer__shell", "c1", False, 1, None,
         "pytest -q", 1234, None),
        # values of the wrong JSON type are not coerced: NULL in the column, the original kept in `data`
        ("r:4", "r", 4, "read", datetime(2026, 11, 30, 10, tzinfo=UTC), None, None, None, None, "/a b", None, None, None),
    ]
    assert q(store, "SELECT data->>'command' FROM events WHERE seq = 3") == [("pytest -q",)]


def test_record_entry_to_typed_row():
    _, sid, fields = record("a/b", 2, "ended", "2026-11-30T10:05:00.000Z", {"agent": 1}, exitCode=3, inputTokens=10,
                            costUsd=1, host="h1", agent="goose/1.9", parentRunId="p", model="m1")
    row = parse_record(EntryRef(RUNS, sid), fields)
    assert (row.record_id, row.run_key, row.k, row.state, row.exit_code) == ("a/b:run:2", "a/b", 2, "ended", 3)
    assert (row.input_tokens, row.cost_usd, row.host, row.agent, row.parent_run_key, row.model) == (
        10, 1.0, "h1", "goose/1.9", "p", "m1")
    assert orjson.loads(row.counts) == {"agent": 1}


@pytest.mark.parametrize(
    "entry, detail",
    [
        ((EV, "1-0", {b"eventId": b"r:0"}), "missing field data"),
        ((EV, "1-0", {b"eventId": b"r:0", b"data": b"{not json"}), "data is not JSON"),
        ((EV, "1-0", {b"eventId": b"r:0", b"data": b"[1]"}), "not a JSON object"),
        ((EV, "1-0", {b"eventId": b"r:9", b"data": event("r", 0)[2][b"data"]}), "eventId"),
        (event("r", 0, eventId="r:7"), "not <runId>:<seq>"),
        (event("r", 0, type="mystery"), "unknown event type"),
        (event("r", 0, timestamp="yesterday"), "timestamp"),
        (event("r", 0, seq=-1), "seq"),
        (record("r", 0, "paused", "2026-11-30T10:00:00.000Z"), "unknown run state"),
        (record("r", 0, "started", "2026-11-30T10:00:00.000Z", counts={"agent": "x"}), "counts"),
        ((RUNS, "1-0", {b"recordId": b"r:0", b"data": orjson.dumps({"recordId": "r:0", "runId": "r"})}), "runId"),
    ],
)
def test_invalid_entries_become_dead_letters_with_a_reason(entry, detail):
    parsed = parse_topic_batch([entry] if entry[0] == EV else [], [entry] if entry[0] == RUNS else [], "2000")
    assert not parsed.events and not parsed.records
    [dead] = parsed.dead
    assert dead.reason == INVALID_ENTRY and detail in dead.detail
    assert dead.ref == EntryRef(entry[0], entry[1])


@pytest.mark.parametrize("ts", ["9999-12-31T23:59:59.999Z", "2026-12-05T00:00:00.001Z", "1999-12-31T23:59:59.999Z",
                                "1970-01-01T00:00:00.000Z", "0001-01-01T00:00:00.000Z"])
def test_an_event_dated_outside_the_sane_window_is_filed_under_its_entrys_time(ts):
    """Issue 20 item 8: before 2000 or more than a day ahead of the sink's clock -> the partition key
    is the time the topic entry was written (its id); `data` keeps the event's own timestamp."""
    stream, _, fields = event("r", 0, ts=ts)
    entry_ms = 1_764_800_000_123  # 2025-12-03T22:13:20.123Z
    parsed = parse_topic_batch([(stream, f"{entry_ms}-0", fields)], [], "2025-01-01T00:00:00.000Z",
                         ceiling="2026-12-04T00:00:00.000Z")
    [row] = parsed.events
    assert row.ts == "2025-12-03T22:13:20.123Z" and row.month == "2025-12" and row.clamped and parsed.clamped == 1
    assert orjson.loads(row.data)["timestamp"] == ts


def test_an_event_inside_the_sane_window_keeps_its_time_and_the_bounds_hold():
    ceiling = "2026-12-04T00:00:00.000Z"
    for ts in ("2000-01-01T00:00:00.000Z", ceiling, "2026-11-30T10:00:00.000Z"):
        [row] = parse_topic_batch([event("r", 0, ts=ts)], [], "1990", ceiling=ceiling).events
        assert row.ts == ts and not row.clamped
    # an entry id that is itself out of the window (a foreign writer's explicit id) is bounded too
    [row] = parse_topic_batch([(EV, "1-0", event("r", 0, ts="1970-01-01T00:00:00.000Z")[2])], [], "1990", ceiling=ceiling).events
    assert row.ts == "2000-01-01T00:00:00.000Z"


@pytest.mark.parametrize("ts", ["2026-13-01T00:00:00.000Z", "2026-02-30T00:00:00.000Z", "2026-01-01T25:00:00.000Z",
                                "0000-01-01T00:00:00.000Z"])
def test_an_impossible_date_is_an_invalid_entry_not_a_crash(ts):
    [dead] = parse_topic_batch([event("r", 0, ts=ts)], [], "1990", ceiling="2026-12-04T00:00:00.000Z").dead
    assert dead.reason == INVALID_ENTRY and "not a valid date" in dead.detail


def test_events_older_than_the_retention_horizon_are_counted_not_written():
    parsed = parse_topic_batch([event("r", 0, ts="2020-01-01T00:00:00.000Z"), event("r", 1)], [], "2026-01-01T00:00:00.000Z")
    assert parsed.expired == 1 and [e.event_id for e in parsed.events] == ["r:1"]


# ---------------------------------------------------------------------------------- migrations


def test_migrations_apply_once_and_a_changed_file_is_an_error(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert [m.version for m in migrate(conn)] == list(range(1, LATEST + 1))
        assert migrate(conn) == []
        assert set(applied(conn)) == set(range(1, LATEST + 1))
        conn.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
        with pytest.raises(MigrationError, match="changed after it was applied"):
            migrate(conn)


def test_migration_from_v1_with_data_backfills_and_keeps_everything(pg_dsn):
    assert LATEST >= 2 and shipped()[1].name == "model_format_views"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert [m.version for m in migrate(conn, target=1)] == [1]
        # Data as the v1 sink wrote it: records carrying `model` / `format` in their JSON only.
        for k, (state, ts) in enumerate([("started", "2026-11-30T10:00:00Z"), ("completed", "2026-11-30T10:01:00Z"),
                                         ("ended", "2026-11-30T10:02:00Z")]):
            data = {"recordId": f"r1:run:{k}", "model": "claude-x", "format": "claude-code"}
            conn.execute(
                "INSERT INTO run_records (record_id, run_key, k, state, ts, seq, agent, exit_code, total_tokens, cost_usd, "
                "counts, data) VALUES (%s, 'r1', %s, %s, %s, %s, 'claude/2', %s, %s, %s, %s, %s)",
                (f"r1:run:{k}", k, state, ts, k, 0 if state == "ended" else None, 100 * k or None, 0.5 * k or None,
                 orjson.dumps({"error": 1, "unknown": 2, "agent": 3}).decode(), orjson.dumps(data).decode()),
            )
        conn.execute("SELECT refresh_runs(ARRAY['r1'])")
        conn.execute("CREATE TABLE events_p202611 PARTITION OF events FOR VALUES FROM ('2026-11-01Z') TO ('2026-12-01Z')")
        conn.execute("INSERT INTO events (ts, data) VALUES ('2026-11-30T10:00:30Z', %s)", (orjson.dumps(
            {"eventId": "r1:0", "runId": "r1", "seq": 0, "type": "read", "tool": "read", "isSuccess": False}).decode(),))
        assert conn.execute("SELECT state, events_total FROM runs").fetchall() == [("ended", 6)]

        assert [m.version for m in migrate(conn)] == list(range(2, LATEST + 1))
        assert conn.execute("SELECT model, format, state, total_tokens, cost_usd FROM runs").fetchall() == [
            ("claude-x", "claude-code", "ended", 200, 1.0)]
        assert conn.execute("SELECT count(*) FROM run_records WHERE model = 'claude-x'").fetchone() == (3,)
        assert conn.execute("SELECT day, model, runs, total_tokens, cost_usd::float8 FROM usage_by_model_day").fetchall() == [
            (datetime(2026, 11, 30).date(), "claude-x", 1, 200, 1.0)]
        assert conn.execute("SELECT tool, calls, failures FROM tool_failure_rate_weekly").fetchall() == [("read", 1, 1)]


# ---------------------------------------------------------------------------------- batches


def test_redelivery_writes_nothing_twice(store):
    batch = [event("r", n) for n in range(5)] + [record("r", 0, "started", "2026-11-30T10:00:00.000Z", {"agent": 5})]
    _, first = write(store, batch)
    assert (first.events_inserted, first.records_inserted) == (5, 1)
    _, again = write(store, batch)  # the whole batch again (a crash between commit and XACK)
    assert (again.events_inserted, again.events_duplicate, again.records_inserted, again.records_duplicate) == (0, 5, 0, 1)
    overlap = [event("r", n) for n in range(3, 8)]  # part old, part new
    _, mixed = write(store, overlap)
    assert (mixed.events_inserted, mixed.events_duplicate) == (3, 2)
    assert q(store, "SELECT count(*), count(DISTINCT event_id) FROM events") == [(8, 8)]
    assert q(store, "SELECT sum(entries) FROM consumer_positions") == [(5 + 1 + 5 + 1 + 5,)]


def test_run_row_is_the_same_whatever_the_order_of_its_records(store):
    records = [
        ("started", "2026-11-30T10:00:00.000Z", {"agent": 0}, {"host": "h1", "agent": "goose/1.9"}),
        ("completed", "2026-11-30T10:03:00.000Z", {"agent": 2, "command": 1},
         {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15, "costUsd": 0.25, "host": "h1"}),
        ("completed", "2026-11-30T10:04:00.000Z", {"agent": 3, "command": 1},
         {"inputTokens": 20, "outputTokens": 7, "totalTokens": 27, "costUsd": 0.5}),
        ("ended", "2026-11-30T10:05:00.000Z", {"agent": 3, "command": 1, "error": 1},
         {"exitCode": 2, "inputTokens": 20, "outputTokens": 7, "totalTokens": 27, "costUsd": 0.5}),
    ]
    rows = set()
    for n, order in enumerate(itertools.permutations(range(4))):
        run = f"perm{n}"
        entries = [record(run, k, records[k][0], records[k][1], records[k][2], **records[k][3]) for k in order]
        for entry in entries:  # one record per batch, in this order, each delivered twice
            write(store, [entry])
            write(store, [entry])
        rows.add(tuple(q(store, "SELECT host, agent, state, last_k, records, started_at, ended_at, exit_code, "
                               "input_tokens, output_tokens, total_tokens, cost_usd, event_counts::text, events_total "
                               "FROM runs WHERE run_key = %s", run)[0]))
    assert len(rows) == 1
    (row,) = rows
    assert row[:5] == ("h1", "goose/1.9", "ended", 3, 4)
    assert row[7:12] == (2, 20, 7, 27, 0.5) and row[13] == 5
    assert row[6] - row[5] == timedelta(minutes=5)


def test_an_intermediate_state_is_never_overwritten_by_an_older_record(store):
    write(store, [record("late", 1, "ended", "2026-11-30T10:05:00.000Z", exitCode=0)])
    write(store, [record("late", 0, "started", "2026-11-30T10:00:00.000Z", host="h9")])
    assert q(store, "SELECT state, host, exit_code FROM runs") == [("ended", "h9", 0)]


def test_rows_the_database_refuses_are_dead_lettered_and_the_rest_is_written(store):
    batch = [event("r", n, type="command", command=f"c{n}", tool="shell") for n in range(40)]
    batch[7] = event("r", 7, type="command", command="nul\u0000byte", tool="shell")
    batch[23] = event("r", 23, type="command", command="x", exitCode=2**40)  # beyond integer
    batch[31] = event("r", 31, type="read", path="p", durationMs=2**63)  # beyond bigint
    batch.append(record("r", 0, "started", "2026-11-30T10:00:00.000Z", host="bad\u0000host"))
    batch.append(record("r", 1, "ended", "2026-11-30T10:01:00.000Z", exitCode=0))
    parsed, result = write(store, batch)
    assert sorted(d.ref.entry_id for d in result.rejected) == sorted(batch[i][1] for i in (7, 23, 31, 40))
    assert all(d.reason == REJECTED for d in result.rejected)
    details = {d.fields.get("eventId", d.fields.get("recordId")): d.detail for d in result.rejected}
    assert "Unicode escape" in details[b"r:7"] and "out of range" in details[b"r:23"] and "NUL" in details[b"r:run:0"]
    assert details[b"r:31"]  # the reason the database gave
    assert result.events_inserted == 37 and result.records_inserted == 1
    assert q(store, "SELECT count(*) FROM events") == [(37,)]
    assert q(store, "SELECT state FROM runs") == [("ended",)]


# ---------------------------------------------------------------------------------- views


def known_fleet(store: Store) -> None:
    """Four runs with known answers (the docs' sample results come from these numbers)."""
    ts = "2026-11-{d}T{h}:00:00.000Z".format
    batch = []
    # run A: goose/1.9 on h1, ended 0 after 10 min, 3 shell calls (1 failed), tokens and cost.
    batch += [record("A", 0, "started", ts(d=23, h="09"), host="h1", agent="goose/1.9"),
              record("A", 1, "completed", ts(d=23, h="09"), {"command": 3, "error": 1}, inputTokens=1000,
                     outputTokens=200, totalTokens=1200, costUsd=0.12, host="h1", agent="goose/1.9"),
              record("A", 2, "ended", "2026-11-23T09:10:00.000Z", {"command": 3, "error": 1}, exitCode=0,
                     inputTokens=1000, outputTokens=200, totalTokens=1200, costUsd=0.12, host="h1", agent="goose/1.9")]
    batch += [event("A", 0, ts=ts(d=23, h="09"), type="command", command="pytest -q", tool="developer__shell",
                    isSuccess=False, exitCode=1, durationMs=9000),
              event("A", 1, ts=ts(d=23, h="09"), type="command", command="ls", tool="developer__shell", isSuccess=True,
                    exitCode=0, durationMs=20),
              event("A", 2, ts=ts(d=23, h="09"), type="command", command="pytest -q", tool="developer__shell",
                    isSuccess=True, exitCode=0, durationMs=7000),
              event("A", 3, ts=ts(d=23, h="09"), type="error", message="boom")]
    # run B: goose/1.9 on h2, exit 2 after 20 min; one read (ok) the next week.
    batch += [record("B", 0, "started", ts(d=30, h="10"), host="h2", agent="goose/1.9"),
              record("B", 1, "ended", "2026-11-30T10:20:00.000Z", {"read": 1, "error": 1}, exitCode=2, host="h2",
                     agent="goose/1.9", inputTokens=500, totalTokens=600, costUsd=0.05)]
    batch += [event("B", 0, ts=ts(d=30, h="10"), type="read", path="/a", tool="read", isSuccess=True, durationMs=3)]
    # run C: goose/1.8 on h1, abandoned after 40 min with a gap.
    batch += [record("C", 0, "started", ts(d=30, h="11"), host="h1", agent="goose/1.8"),
              record("C", 1, "abandoned", "2026-11-30T11:40:00.000Z", {"unknown": 2}, host="h1", agent="goose/1.8",
                     missing=[[3, 4]])]
    # run D: goose/1.8 on h1, still running (no end).
    batch += [record("D", 0, "started", ts(d=30, h="12"), host="h1", agent="goose/1.8")]
    _, result = write(store, batch)
    assert not result.rejected


def test_errors_by_class_per_1000_runs_of_each_agent(store):
    batch = [record("E1", 0, "started", "2026-11-30T10:00:00.000Z", agent="claude-code/2.1"),
             record("E1", 1, "ended", "2026-11-30T10:05:00.000Z", {"error": 2}, exitCode=1, agent="claude-code/2.1"),
             record("E2", 0, "started", "2026-11-30T10:00:00.000Z", agent="claude-code/2.1"),
             record("E3", 0, "started", "2026-11-30T10:00:00.000Z", agent="codex/0.5"),
             event("E1", 0, ts="2026-11-30T10:00:00.000Z", type="error", message="API Error: 429", errorClass="rate_limit"),
             event("E1", 1, ts="2026-11-30T10:00:00.000Z", type="error", message="claude exited with code 1", errorClass="agent_exit"),
             # published before contract 1.1: no class, counted as other
             event("E3", 0, ts="2026-11-30T10:00:00.000Z", type="error", message="boom")]
    _, result = write(store, batch)
    assert not result.rejected
    assert q(store, "SELECT error_class, agent, runs, error_events, runs_with_errors, errors_per_1000_runs::float8 "
                    "FROM errors_by_class ORDER BY 1, 2") == [
        ("agent_exit", "claude-code/2.1", 2, 1, 1, 500.0),
        ("other", "codex/0.5", 1, 1, 1, 1000.0),
        ("rate_limit", "claude-code/2.1", 2, 1, 1, 500.0),
    ]


def test_errors_by_class_format_splits_the_classes_by_format_agent_and_host(store):
    batch = [record("F1", 0, "started", "2026-11-30T10:00:00.000Z", agent="claude-code/2.1", format="claude-code", host="h1"),
             record("F2", 0, "started", "2026-11-30T10:00:00.000Z", agent="claude-code/2.1", format="claude-code", host="h1"),
             record("F3", 0, "started", "2026-11-30T10:00:00.000Z", agent="claude-code/2.1", format="claude-code", host="h2"),
             record("F4", 0, "started", "2026-11-30T10:00:00.000Z", agent="codex/0.5", format="codex", host="h1"),
             record("F5", 0, "started", "2026-11-30T10:00:00.000Z", host="h3"),
             event("F1", 0, type="error", message="API Error: 401", errorClass="auth"),
             event("F1", 1, type="error", message="API Error: 401", errorClass="auth"),
             event("F3", 0, type="error", message="API Error: 401", errorClass="auth"),
             event("F4", 0, type="error", message="401 Unauthorized", errorClass="auth"),
             event("F4", 1, type="error", message="stream disconnected", errorClass="timeout"),
             # published before contract 1.1 on a run without format or agent: other, '(none)'
             event("F5", 0, type="error", message="boom"),
             # a run the runs table does not know (yet): every label '(none)', no runs to divide by
             event("F9", 0, type="error", message="boom", errorClass="other")]
    _, result = write(store, batch)
    assert not result.rejected
    assert q(store, "SELECT error_class, format, agent, host, runs, error_events, runs_with_errors, "
                    "errors_per_1000_runs::float8 FROM errors_by_class_format ORDER BY 1, 2, 3, 4") == [
        ("auth", "claude-code", "claude-code/2.1", "h1", 2, 2, 1, 1000.0),
        ("auth", "claude-code", "claude-code/2.1", "h2", 1, 1, 1, 1000.0),
        ("auth", "codex", "codex/0.5", "h1", 1, 1, 1, 1000.0),
        ("other", "(none)", "(none)", "(none)", 0, 1, 1, None),
        ("other", "(none)", "(none)", "h3", 1, 1, 1, 1000.0),
        ("timeout", "codex", "codex/0.5", "h1", 1, 1, 1, 1000.0),
    ]
    # The runbook's grouping (docs/operations.md, GooseIngestAuthErrors): one provider or the fleet?
    assert q(store, "SELECT format, sum(error_events)::int, sum(runs_with_errors)::int, sum(runs)::int "
                    "FROM errors_by_class_format WHERE error_class = 'auth' GROUP BY 1 ORDER BY 1") == [
        ("claude-code", 3, 2, 3), ("codex", 1, 1, 1)]
    # The older view keeps its rows and columns (class x agent).
    assert q(store, "SELECT error_class, agent, error_events FROM errors_by_class WHERE error_class = 'auth' "
                    "ORDER BY 2") == [("auth", "claude-code/2.1", 3), ("auth", "codex/0.5", 1)]


def test_class_failures_lists_errors_and_retry_warnings_with_their_runs_host(store):
    """What the error-class alerts count, one row per event: a retry-only storm is not 0 rows."""
    batch = [record("T1", 0, "started", "2026-11-30T10:00:00.000Z", agent="codex/0.5", format="codex", host="h1"),
             record("T2", 0, "started", "2026-11-30T10:00:00.000Z", agent="claude-code/2.1", format="claude-code",
                    host="h2"),
             event("T1", 0, type="warning", message="Reconnecting... 1/5", code="retry", errorClass="timeout"),
             event("T1", 1, type="warning", message="Reconnecting... 2/5", code="retry", errorClass="timeout"),
             event("T2", 0, type="warning", message="api_retry", code="api_retry", errorClass="timeout"),
             event("T2", 1, type="warning", message="missing entries", code="missing-entries"),  # no class: no failure
             event("T2", 2, type="error", message="stream disconnected", errorClass="timeout"),
             event("T2", 3, type="error", message="boom"),  # before contract 1.1: other
             event("T9", 0, type="error", message="401", errorClass="auth")]  # a run not known yet
    _, result = write(store, batch)
    assert not result.rejected
    assert q(store, "SELECT c.error_class, c.type, c.run_key, c.host, c.format, c.agent, c.code FROM class_failures c "
                    "ORDER BY c.run_key, c.message") == [
        ("timeout", "warning", "T1", "h1", "codex", "codex/0.5", "retry"),
        ("timeout", "warning", "T1", "h1", "codex", "codex/0.5", "retry"),
        ("timeout", "warning", "T2", "h2", "claude-code", "claude-code/2.1", "api_retry"),
        ("other", "error", "T2", "h2", "claude-code", "claude-code/2.1", None),
        ("timeout", "error", "T2", "h2", "claude-code", "claude-code/2.1", None),
        ("auth", "error", "T9", None, None, None, None),
    ]
    # errors_by_class_format (type `error` only) sees one timeout; the alert counted two runs on two hosts
    assert q(store, "SELECT sum(runs_with_errors)::int FROM errors_by_class_format WHERE error_class = 'timeout'") \
        == [(1,)]
    assert q(store, "SELECT count(DISTINCT run_key)::int, count(DISTINCT host)::int, count(*)::int FROM class_failures "
                    "WHERE error_class = 'timeout'") == [(2, 2, 4)]


def test_views_answer_the_operators_questions(store):
    known_fleet(store)
    from datetime import date

    assert q(store, "SELECT week, tool, calls, calls_with_outcome, failures, failure_rate::float8 "
                    "FROM tool_failure_rate_weekly ORDER BY week, tool") == [
        (date(2026, 11, 23), "developer__shell", 3, 3, 1, 0.3333),
        (date(2026, 11, 30), "read", 1, 1, 0, 0.0),
    ]
    assert q(store, "SELECT agent, host, runs, error_events, unknown_events, errors_per_1000_runs::float8, "
                    "unknowns_per_1000_runs::float8 FROM error_events_per_1000_runs ORDER BY agent, host") == [
        ("goose/1.8", "h1", 2, 0, 2, 0.0, 1000.0),
        ("goose/1.9", "h1", 1, 1, 0, 1000.0, 0.0),
        ("goose/1.9", "h2", 1, 1, 0, 1000.0, 0.0),
    ]
    assert q(store, "SELECT day, model, agent, runs, runs_with_usage, input_tokens, output_tokens, total_tokens, "
                    "cost_usd::float8 FROM usage_by_model_day ORDER BY day, agent") == [
        (date(2026, 11, 23), None, "goose/1.9", 1, 1, 1000, 200, 1200, 0.12),
        (date(2026, 11, 30), None, "goose/1.8", 2, 0, None, None, None, None),
        (date(2026, 11, 30), None, "goose/1.9", 1, 1, 500, None, 600, 0.05),
    ]
    assert q(store, "SELECT agent, runs, p50_s, p90_s, max_s::float8 FROM run_duration_percentiles ORDER BY agent") == [
        ("goose/1.8", 1, 2400.0, 2400.0, 2400.0),
        ("goose/1.9", 2, 900.0, 1140.0, 1200.0),
    ]
    assert q(store, "SELECT run_key, problem, exit_code, duration_s::float8, missing FROM problem_runs ORDER BY run_key") == [
        ("B", "non-zero-exit", 2, 1200.0, None),
        ("C", "abandoned", None, 2400.0, [[3, 4]]),
    ]
    assert q(store, "SELECT command, executions, runs, max_ms, p50_ms, failures FROM slowest_commands "
                    "ORDER BY max_ms DESC") == [
        ("pytest -q", 2, 1, 9000, 8000.0, 1),
        ("ls", 1, 1, 20, 20.0, 0),
    ]


# ---------------------------------------------------------------------------------- partitions and retention


def test_partitions_are_created_ahead_and_retention_drops_whole_old_months(store):
    now = datetime(2026, 12, 15, tzinfo=UTC)
    store.maintain(now, timedelta(days=90))
    assert {"2026-12", "2027-01"} <= set(store.partitions())
    write(store, [event("old", 0, ts="2026-08-31T23:59:59.999Z"), event("old", 1, ts="2026-09-01T00:00:00.000Z"),
                  event("new", 0, ts="2026-12-14T00:00:00.000Z")])
    assert {"2026-08", "2026-09"} <= set(store.partitions())
    # 90 days before 2026-12-15 is 2026-09-16: August is wholly older, September is not.
    dropped = store.maintain(now, timedelta(days=90))
    assert dropped == ["2026-08"]
    assert "2026-08" not in store.partitions() and "2026-09" in store.partitions()
    assert q(store, "SELECT event_id FROM events ORDER BY event_id") == [("new:0",), ("old:1",)]
    # A month whose partition was dropped is re-created on demand if an event for it still arrives.
    write(store, [event("late", 0, ts="2026-08-02T00:00:00.000Z")])
    assert q(store, "SELECT count(*) FROM events WHERE run_key = 'late'") == [(1,)]


def test_docs_show_every_view_exactly_as_migrations_create_it():
    import re

    from tests.support.fixtures import REPO

    docs = (REPO / "docs" / "analytics.md").read_text()
    views = [re.search(r"CREATE VIEW .*?;", m.sql, re.S) for m in shipped()]
    statements = [v for m in shipped() for v in re.findall(r"CREATE VIEW \w+ AS\n.*?;", m.sql, re.S)]
    assert len(statements) == 9 and any(views)
    for sql in statements:
        assert sql in docs, f"docs/analytics.md does not show {sql.splitlines()[0]} as migrated"


def test_a_partition_dropped_behind_the_sinks_back_is_recreated_not_dead_lettered(store):
    write(store, [event("p", 0)])
    store.connect().execute("DROP TABLE events_p202611")  # an operator, or another sink's retention
    _, result = write(store, [event("p", 1), event("p", 2)])
    assert not result.rejected and result.events_inserted == 2
    assert q(store, "SELECT seq FROM events ORDER BY seq") == [(1,), (2,)]


def test_the_views_cover_every_format_of_the_registry_with_no_format_named_in_sql(store):
    """contracts/formats.py's rows, gemini-cli and opencode included, reach the runs table and the
    views by the `format` label alone (tests/core/test_formats_registry.py holds the SQL free of names)."""
    from contracts.formats import FORMAT_NAMES

    batch = []
    for i, fmt in enumerate(FORMAT_NAMES):
        run = f"G{i}"
        batch += [record(run, 0, "started", "2026-11-30T10:00:00.000Z", agent=f"{fmt}/1", format=fmt, host="h"),
                  record(run, 1, "ended", "2026-11-30T10:01:00.000Z", {"error": 1}, exitCode=1, agent=f"{fmt}/1",
                         format=fmt, host="h", inputTokens=10 + i),
                  event(run, 0, type="error", message=f"{fmt} exited with code 1", errorClass="agent_exit")]
    _, result = write(store, batch)
    assert not result.rejected
    assert q(store, "SELECT format, input_tokens FROM runs WHERE run_key LIKE 'G%' ORDER BY run_key") == [
        (fmt, 10 + i) for i, fmt in enumerate(FORMAT_NAMES)]
    assert q(store, "SELECT format, runs, error_events FROM errors_by_class_format WHERE agent LIKE '%/1' "
                    "ORDER BY 1") == sorted((fmt, 1, 1) for fmt in FORMAT_NAMES)
