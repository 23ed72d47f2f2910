"""The database side of the sink: one transaction per batch, partitions, retention.

`write()` commits a batch's events, run records, the recomputed `runs` rows and the consumer's
positions in ONE transaction; the caller acknowledges the Redis entries only after it returns.
A row the database refuses (a NUL byte in text, an exit code beyond `integer`...) is isolated by
bisection inside the transaction (savepoints) and returned as a dead letter with the database's
reason; every other row of the batch is written.

Errors that are not about a row (connection lost, server shutting down, missing table) propagate:
the caller backs off and retries the whole batch, which is safe because every write is
idempotent (events keyed by (run_key, seq, ts), records by record_id, runs recomputed from records).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import errors, sql

from services.export.postgres.migrate import migrate
from services.export.postgres.rows import (
    EVENT_COLUMNS,
    RECORD_COLUMNS,
    REJECTED,
    EntryRef,
    EventRow,
    RecordRow,
    RefusedEntry,
    month_start,
    positions,
)

log = logging.getLogger("goose_ingest.export.postgres")

PARTITION_PREFIX = "events_p"  # events_pYYYYMM
MONTHS_AHEAD = 1  # partitions created ahead of the current month

Row = TypeVar("Row", EventRow, RecordRow)

# SQLSTATE classes that mean "this row's content", not "this database": 22 data exception,
# 23 integrity constraint violation. Everything else stops the batch.
_ROW_ERRORS = (errors.DataError, errors.IntegrityError)


@dataclass
class WriteResult:
    events_inserted: int = 0
    events_duplicate: int = 0
    records_inserted: int = 0
    records_duplicate: int = 0
    rejected: list[RefusedEntry] = field(default_factory=list)


def _reason(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None) or "client"
    diag = getattr(exc, "diag", None)
    message = (diag.message_primary if diag is not None else None) or str(exc).splitlines()[0]
    return f"{state}: {message}"


def next_month(month: str) -> str:
    y, m = int(month[:4]), int(month[5:7])
    return f"{y + m // 12:04d}-{m % 12 + 1:02d}"


def partition_name(month: str) -> str:
    return f"{PARTITION_PREFIX}{month[:4]}{month[5:7]}"


class Store:
    """A connection to the analytics database and the batch writer."""

    def __init__(self, dsn: str, connect_timeout: float = 5.0):
        self.dsn = dsn  # secret: never logged (sink.redact_dsn)
        self._connect_timeout = connect_timeout
        self.conn: psycopg.Connection | None = None
        self._months: set[str] = set()

    # ------------------------------------------------------------------ connection
    def connect(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.close()
            self.conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, int(self._connect_timeout)),
                application_name="goose-ingest-export-postgres",
            )
            self._months.clear()  # retention or another sink may have changed them meanwhile
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # closing a broken connection must not hide the original error
                pass
            self.conn = None

    def migrate(self) -> list[str]:
        conn = self.connect()
        return [f"{m.version:04d}_{m.name}" for m in migrate(conn)]

    # ------------------------------------------------------------------ partitions
    def ensure_partitions(self, months: set[str]) -> None:
        """Create the monthly partitions of `months` (YYYY-MM) that do not exist yet."""
        conn = self.connect()
        for month in sorted(months - self._months):
            start, end = month_start(month), month_start(next_month(month))
            stmt = sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF events FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(partition_name(month)), sql.Literal(start), sql.Literal(end)
            )
            try:
                conn.execute(stmt)
            except (errors.DuplicateTable, errors.UniqueViolation):
                pass  # another sink created it between IF NOT EXISTS and CREATE
            self._months.add(month)

    def partitions(self) -> list[str]:
        """The months (YYYY-MM) that have a partition, oldest first."""
        rows = self.connect().execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'events'::regclass"
        ).fetchall()
        out = []
        for (name,) in rows:
            digits = name[len(PARTITION_PREFIX):]
            if name.startswith(PARTITION_PREFIX) and len(digits) == 6 and digits.isdigit():
                out.append(f"{digits[:4]}-{digits[4:]}")
        return sorted(out)

    def maintain(self, now: datetime, retention: timedelta) -> list[str]:
        """Create this month's and the next partitions; drop those wholly older than the retention.
        Returns the dropped months."""
        month = now.strftime("%Y-%m")
        ahead = {month}
        for _ in range(MONTHS_AHEAD):
            month = next_month(month)
            ahead.add(month)
        self.ensure_partitions(ahead)
        cutoff = now - retention
        dropped = []
        conn = self.connect()
        for month in self.partitions():
            if month_start(next_month(month)) <= cutoff:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(partition_name(month))))
                self._months.discard(month)
                dropped.append(month)
        return dropped

    # ------------------------------------------------------------------ the batch
    def write(self, events: Sequence[EventRow], records: Sequence[RecordRow], refs: Sequence[EntryRef]) -> WriteResult:
        """Write one batch in one transaction with the positions of `refs` (every entry of the batch,
        dead letters included, since they are handled once this returns)."""
        conn = self.connect()
        self.ensure_partitions({e.month for e in events})
        # Fast path, the usual case: plain statements, no savepoints (each costs a round trip).
        # A re-delivered event (key conflict) or a refused row aborts it; then the whole batch
        # goes through the careful path below, in a new transaction.
        try:
            with conn.transaction():
                inserted_events = _copy(conn, "events", b"".join(r.copy_line() for r in events)) if events else 0
                inserted_records = self._insert_records(list(records)) if records else 0
                self._finish(records, refs)
            return WriteResult(events_inserted=inserted_events, records_inserted=inserted_records,
                               records_duplicate=len(records) - inserted_records)
        except _ROW_ERRORS:
            # Not only a re-delivery or a refused row: "no partition for this row" (23514) is one
            # too, when someone dropped a partition this process thought it had. Re-check them.
            self._months.clear()
            self.ensure_partitions({e.month for e in events})
        result = WriteResult()
        with conn.transaction():
            ok_events = self._isolate(list(events), self._insert_events, result)
            ok_records = self._isolate(list(records), self._insert_records, result)
            rejected = {d.ref for d in result.rejected}
            result.events_inserted = ok_events
            result.events_duplicate = len(events) - ok_events - sum(1 for e in events if e.ref in rejected)
            result.records_inserted = ok_records
            result.records_duplicate = len(records) - ok_records - sum(1 for r in records if r.ref in rejected)
            self._finish(records, refs)
        return result

    def _finish(self, records: Sequence[RecordRow], refs: Sequence[EntryRef]) -> None:
        """The touched runs' rows and the consumer positions, in the batch's transaction."""
        conn = self.connect()
        keys = sorted({r.run_key for r in records})
        if keys:
            conn.execute("SELECT refresh_runs(%s)", (keys,))
        marks = positions(list(refs))
        if marks:
            values = sql.SQL(", ").join(sql.SQL("(%s, %s, %s, %s)") for _ in marks)
            conn.execute(
                sql.SQL(
                    "INSERT INTO consumer_positions AS p (stream, last_ms, last_seq, entries) VALUES {} "
                    "ON CONFLICT (stream) DO UPDATE SET entries = p.entries + EXCLUDED.entries, updated_at = now(), "
                    "last_ms = greatest(p.last_ms, EXCLUDED.last_ms), "
                    "last_seq = CASE WHEN (EXCLUDED.last_ms, EXCLUDED.last_seq) > (p.last_ms, p.last_seq) "
                    "THEN EXCLUDED.last_seq ELSE p.last_seq END"
                ).format(values),
                [v for stream, (ms, seq, n) in sorted(marks.items()) for v in (stream, ms, seq, n)],
            )

    def _isolate(self, rows: list[Row], insert: Callable[[list[Row]], int], result: WriteResult) -> int:
        """insert(rows) in a savepoint; when the database refuses the content, split and retry the
        halves, down to the single rows it refuses (dead-lettered). Returns the rows inserted."""
        if not rows:
            return 0
        conn = self.connect()
        try:
            with conn.transaction():
                return insert(rows)
        except _ROW_ERRORS as exc:
            if len(rows) == 1:
                row = rows[0]
                result.rejected.append(RefusedEntry(row.ref, REJECTED, _reason(exc), _fields_of(row)))
                return 0
            mid = len(rows) // 2
            return self._isolate(rows[:mid], insert, result) + self._isolate(rows[mid:], insert, result)

    def _insert_events(self, rows: list[EventRow]) -> int:
        """Through a staging table, skipping events already stored (re-delivery)."""
        conn = self.connect()
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS events_stage (ts timestamptz, data jsonb) ON COMMIT DELETE ROWS")
        conn.execute("DELETE FROM events_stage")
        _copy(conn, "events_stage", b"".join(r.copy_line() for r in rows))
        # An event already stored with the same content is a re-delivery (skipped, counted as a
        # duplicate); with different content it is the same event rebuilt by `goose-ingest reprocess`
        # with newer settings (docs/archive-replay.md, "Reprocessing"): the newer content replaces it.
        # DISTINCT ON: one statement may not update a row twice (the same event twice in a batch).
        cur = conn.execute("INSERT INTO events AS e (ts, data) SELECT DISTINCT ON (ts, data ->> 'runId', data ->> 'seq') "
                           "ts, data FROM events_stage "
                           "ON CONFLICT (run_key, seq, ts) DO UPDATE SET data = EXCLUDED.data "
                           "WHERE e.data IS DISTINCT FROM EXCLUDED.data")
        return max(cur.rowcount, 0)

    def _insert_records(self, rows: list[RecordRow]) -> int:
        conn = self.connect()
        cols = sql.SQL(", ").join(map(sql.Identifier, RECORD_COLUMNS))
        marks = sql.SQL(", ").join(sql.Placeholder() * len(RECORD_COLUMNS))
        values = sql.SQL(", ").join(sql.SQL("({})").format(marks) for _ in rows)
        excluded = sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(sql.Identifier(c)) for c in RECORD_COLUMNS)
        rows = list({r.record_id: r for r in rows}.values())  # a row may be updated once per statement
        params: list[Any] = [v for r in rows for v in r.values()]
        cur = conn.execute(
            # As for events: the same content is a re-delivery, other content a reprocessed record.
            sql.SQL("INSERT INTO run_records AS r ({c}) VALUES {v} ON CONFLICT (record_id) DO UPDATE SET ({c}) = ({x}) "
                    "WHERE r.data IS DISTINCT FROM EXCLUDED.data").format(c=cols, v=values, x=excluded),
            params,
        )
        return max(cur.rowcount, 0)


def _copy(conn: psycopg.Connection, table: str, buffer: bytes) -> int:
    """COPY rows already in text format (EventRow.copy_line) into table (ts, data); the rows copied."""
    stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, EVENT_COLUMNS)))
    with conn.cursor() as cur:
        with cur.copy(stmt) as copy:
            copy.write(buffer)
        return max(cur.rowcount, 0)


def _fields_of(row: EventRow | RecordRow) -> dict[str, bytes]:
    """The topic entry's fields, rebuilt for the dead letter (the data is kept verbatim)."""
    if isinstance(row, EventRow):
        return {"eventId": row.event_id.encode(), "data": row.data}
    return {"recordId": row.record_id.encode(), "runId": row.run_key.encode(), "seq": str(row.seq).encode(),
            "state": row.state.encode(), "data": row.data.encode()}


def utcnow() -> datetime:
    return datetime.now(UTC)
