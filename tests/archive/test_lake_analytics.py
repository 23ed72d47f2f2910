"""The event lake answers the operators' questions: the DuckDB SQL of docs/analytics.md ("The same
questions over the event lake (DuckDB)"), run as written there, gives the PostgreSQL views' answers
on the same runs (the fixture transcripts through a real worker, archived by a real `goose-ingest
archive` process into a local directory, and exported to a real PostgreSQL by a real `export
postgres` process)."""

from __future__ import annotations

import math
import re
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb  # the test extra's: a missing one fails the test, never skips it
import orjson
import psycopg
import pytest

from contracts.formats import AGENT_FORMATS, DEFAULT_FORMAT, FORMAT_NAMES
from contracts.keys import shard_of
from services.broker.connect import sync_client
from tests.deploy.test_class_alerts_live import CLASSES as CLASS_ALERTS
from tests.deploy.test_class_alerts_live import runbook
from tests.export.test_export_postgres_live import start_sink
from tests.support import postgres as pg_support
from tests.support.archive_reading import archived_everything, publish_runs, runs_of, start_archive_process
from tests.support.fixtures import SHARED
from tests.support.pipeline import REPO, ended_runs, start_worker, stop, wait_until

pytestmark = pytest.mark.e2e

pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

SECTION = "## The same questions over the event lake (DuckDB)"
VIEWS = ("tool_failure_rate_weekly", "error_events_per_1000_runs", "errors_by_class", "errors_by_class_format",
         "class_failures", "usage_by_model_day", "run_duration_percentiles", "problem_runs", "slowest_commands")


def lake_sql() -> list[str]:
    """The SQL blocks of the docs section, in order."""
    text = (REPO / "docs" / "analytics.md").read_text()
    section = text[text.index(SECTION):]
    nxt = section.find("\n## ", len(SECTION))
    section = section if nxt < 0 else section[:nxt]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def test_the_docs_define_every_view_over_the_lake():
    sql = "\n".join(lake_sql())
    for view in (*VIEWS, "events", "run_records", "runs"):
        assert f"CREATE OR REPLACE VIEW {view} AS" in sql, view


def _norm(value: Any) -> Any:
    """One comparable form for both engines' values (numbers as floats, times as epoch seconds, JSON parsed)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float, Decimal)):
        return round(float(value), 6)
    if isinstance(value, datetime):
        return round(value.timestamp(), 6)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:  # a text that only starts like JSON (Gemini's "[API Error: ...]")
            return value
    return value


def _rows(rows: list[tuple]) -> list[tuple]:
    return sorted((tuple(_norm(v) for v in row) for row in rows), key=repr)


def _close(a: list[tuple], b: list[tuple]) -> bool:
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b, strict=True):
        for x, y in zip(ra, rb, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6):
                    return False
            elif x != y:
                return False
    return True


def _failed_run(settings, run: str) -> None:
    """A run that exits 3 (problem_runs has a row), written as a tap would."""
    r = sync_client(settings)
    stream = settings.layout.raw_stream(shard_of(run, settings.shards))
    line = orjson.dumps({"type": "message", "message": {"id": "m1", "role": "assistant", "content": [
        {"type": "text", "text": "giving up"}]}})
    r.xadd(stream, {"run": run, "seq": 0, "ts": 1_000, "line": line, "host": "ci-7", "agent": "goose/1.9"})
    r.xadd(stream, {"run": run, "seq": 1, "ts": 2_500, "kind": "eof", "exit": 3, "host": "ci-7", "agent": "goose/1.9"})


def test_duckdb_over_the_lake_answers_as_the_postgresql_views(settings, pg_dsn, tmp_path):
    # the goose transcripts, and one real run of every other format of the registry (issue 37: the
    # lake covers every row with no per-format code)
    runs = {**runs_of("lake"), **{f"lake/{f.name}": SHARED / "fixtures" / f.name / f.demo_transcript
                                  for f in AGENT_FORMATS if f.name != DEFAULT_FORMAT},
            # and a failed one of the two formats added last (their error classes per format)
            **{f"lake/{fmt}-{name}": SHARED / "fixtures" / fmt / f"{name}.jsonl"
               for fmt, name in (("gemini-cli", "rate429"), ("opencode", "auth401"))}}
    log = tmp_path / "procs.log"
    url = f"file://{tmp_path / 'archive'}"
    worker = start_worker(settings, log)
    sink = start_sink(settings, pg_dsn, log)
    archive = start_archive_process(settings, url, log)
    try:
        publish_runs(settings, runs)
        _failed_run(settings, "lake/failed")
        wanted = {*runs, "lake/failed"}
        wait_until(lambda: wanted <= ended_runs(settings), timeout=120)
        r = sync_client(settings)
        total = sum(r.xlen(s) for s in settings.layout.events_partitions())
        records = sum(r.xlen(s) for s in settings.layout.runs_partitions())

        def exported() -> bool:
            with psycopg.connect(pg_dsn) as conn:
                try:
                    e = conn.execute("SELECT count(*) FROM events").fetchone()[0]
                    k = conn.execute("SELECT count(*) FROM run_records").fetchone()[0]
                except psycopg.errors.UndefinedTable:  # the sink has not migrated yet
                    return False
            return e == total and k == records

        wait_until(exported, timeout=120)
        wait_until(lambda: archived_everything(settings), timeout=120)
    finally:
        stop(archive)
        stop(sink)
        stop(worker)
    assert archive.returncode == 0, log.read_text()[-2000:]

    con = duckdb.connect()
    for block in lake_sql():
        con.execute(block.replace("/var/lib/goose-ingest/archive", str(tmp_path / "archive")))
    with psycopg.connect(pg_dsn) as conn:
        assert con.execute("SELECT count(*) FROM events").fetchone()[0] == total
        for view in VIEWS:
            pg = _rows(conn.execute(f"SELECT * FROM {view}").fetchall())
            lake = _rows(con.execute(f"SELECT * FROM {view}").fetchall())
            assert pg, f"{view}: the fixtures give no rows, the comparison would prove nothing"
            assert _close(lake, pg), f"{view}:\n  lake {lake[:5]}\n  pg   {pg[:5]}"
        pg_cols = {v: [d.name for d in conn.execute(f"SELECT * FROM {v} LIMIT 0").description] for v in VIEWS}
    for view in VIEWS:
        assert [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description] == pg_cols[view], view
    assert sorted(r[0] for r in con.execute("SELECT DISTINCT format FROM runs").fetchall()) == sorted(FORMAT_NAMES)
    assert {r[0] for r in con.execute("SELECT format FROM errors_by_class_format").fetchall()} >= {"gemini-cli", "opencode"}

    # The runbooks' queries of the class and tool alerts (docs/operations.md), as written there: the
    # same rows over the lake as in the database.
    answered = 0
    with psycopg.connect(pg_dsn) as conn:
        for alert in (*(alert for alert, _ in CLASS_ALERTS.values()), "GooseIngestToolFailing"):
            for statement in runbook(alert)[0]:
                pg = _rows(conn.execute(statement).fetchall())
                lake = _rows(con.execute(statement).fetchall())
                assert _close(lake, pg), f"{alert}: {statement}\n  lake {lake[:5]}\n  pg   {pg[:5]}"
                answered += bool(pg)
    assert answered, "no runbook query had rows: the comparison would prove nothing"


def test_the_docs_sql_reads_a_lake_path_given_as_a_variable(tmp_path: Path):
    blocks = lake_sql()
    assert "getvariable('lake')" in blocks[0] and "SET VARIABLE lake" in blocks[0]
