"""Read-only access to goose's ``sessions.db`` (spec: goose-stream-format.md §9).

Pure reading, no broker. Safe while goose writes: the database is opened with ``mode=ro`` (never
created), a 30 s busy timeout, and every read is a single statement, i.e. one consistent WAL
snapshot. (SQLite may still create the ``-shm``/``-wal`` side files next to a WAL database, as
any reader does.)

Supported schema versions: 6 … 17. Columns are discovered per database (``PRAGMA table_info``),
so only the columns that exist at that version are read.

Every value is parsed totally (docs/backfill.md, "Odd values"): SQLite stores any type in any
column, and files come from many goose versions and from disks that filled up mid-write. A value
that does not parse never raises here: it becomes ``None`` (unknown) or a documented substitute, and
an ``OddValue`` that the importer reports and publishes as native evidence. Nothing is summed in SQL
(``SUM`` raises on an int64 overflow); sums are checked in Python.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

MIN_SCHEMA = 6
MAX_SCHEMA = 17
BUSY_TIMEOUT_MS = 30_000
_MS_THRESHOLD = 10_000_000_000  # created_timestamp values above this are milliseconds
INT64_MAX = 2**63 - 1  # a counter beyond it is no count any consumer can hold (contract, PostgreSQL bigint)
# raw entry timestamps the workers accept (years 1..9999, services/normalizer/timefmt.py)
MIN_MS = -62_135_596_800_000
MAX_MS = 253_402_300_799_999
EVIDENCE_MAX_CHARS = 1024  # a native value kept as evidence is cut here (a raw line stays far below 1 MiB)
EVIDENCE_TYPE = "goose-ingest.native"  # the record type of a native-evidence line (an `unknown` event)


class SessionsDbError(Exception):
    """The file is missing, not SQLite, not a goose sessions.db, or of an unsupported schema."""


# --- opening ------------------------------------------------------------------------------------


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Opens ``path`` read-only (URI ``mode=ro``; the file is never created), with a 30 s busy
    timeout, and checks that it is a goose sessions.db of a supported schema version."""
    p = Path(path).expanduser()
    if not p.exists():
        raise SessionsDbError(f"sessions.db not found: {p}")
    if not p.is_file():
        raise SessionsDbError(f"not a file: {p}")
    uri = p.resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    except sqlite3.Error as exc:
        raise SessionsDbError(f"cannot open {p} read-only: {exc}") from exc
    try:
        conn.isolation_level = None  # autocommit: no implicit transactions (we never write)
        # TEXT that is not UTF-8 (a torn write) would make the whole SELECT raise; U+FFFD as the
        # workers do for raw lines
        conn.text_factory = _decode_text
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        try:
            tables = _tables(conn)
        except sqlite3.DatabaseError as exc:
            raise SessionsDbError(f"not a SQLite database: {p} ({exc})") from exc
        missing = [t for t in ("sessions", "messages") if t not in tables]
        if missing:
            raise SessionsDbError(
                f"not a goose sessions.db: {p} has no {' and no '.join(missing)} table"
                + (f" (tables: {', '.join(sorted(tables))})" if tables else " (no tables at all)")
            )
        schema_version(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def schema_version(conn: sqlite3.Connection) -> int:
    """``MAX(version)`` of ``schema_version``; SessionsDbError unless 6 <= version <= 17."""
    if "schema_version" not in _tables(conn):
        raise SessionsDbError(
            "unsupported sessions.db: no schema_version table (older than schema 6 or not written by goose)"
        )
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    version = row[0] if row else None
    if not isinstance(version, int):
        raise SessionsDbError("unsupported sessions.db: the schema_version table is empty")
    if version < MIN_SCHEMA:
        raise SessionsDbError(
            f"unsupported sessions.db schema version {version}: older than the oldest supported ({MIN_SCHEMA})"
        )
    if version > MAX_SCHEMA:
        raise SessionsDbError(
            f"unsupported sessions.db schema version {version}: newer than the newest supported ({MAX_SCHEMA});"
            " upgrade goose-ingest"
        )
    return version


# --- odd values ---------------------------------------------------------------------------------


def _native(value: Any) -> tuple[str, Any, bool]:
    """(SQLite storage class, a JSON-safe rendering, cut?) of a native value kept as evidence:
    text as is, integers as decimal text, reals as Python's repr (``inf``, ``1e+300``), blobs as
    hex, a JSON value (from inside a JSON column) as its JSON text."""
    if value is None:
        return "null", None, False
    if isinstance(value, bool):
        return "json", "true" if value else "false", False
    if isinstance(value, int):
        return "integer", str(value), False
    if isinstance(value, float):
        return "real", repr(value), False
    if isinstance(value, str):
        # a lone surrogate (from a JSON escape) as its escape's text: no JSON reader takes it
        storage, text = "text", value.encode("utf-8", "backslashreplace").decode("utf-8")
    elif isinstance(value, bytes):
        storage, text = "blob", value[: EVIDENCE_MAX_CHARS // 2 + 1].hex()
    else:
        storage = "json"
        try:
            text = json.dumps(value, ensure_ascii=True, allow_nan=True)[: EVIDENCE_MAX_CHARS + 1]
        except (ValueError, TypeError, RecursionError):
            text = repr(value)[: EVIDENCE_MAX_CHARS + 1]
    if len(text) > EVIDENCE_MAX_CHARS:
        return storage, text[:EVIDENCE_MAX_CHARS], True
    return storage, text, False


@dataclass(frozen=True)
class OddValue:
    """A value of sessions.db that did not parse. ``outcome`` says what was done instead (the
    declared loss); the importer reports it on stderr and publishes ``evidence()`` as a line."""

    session: str
    table: str
    rowid: int | None  # None: the session's own row, or a sum over rows
    column: str
    value: Any
    outcome: str

    def where(self) -> str:
        return f"{self.table}.{self.column}" + (f" (row {self.rowid})" if self.rowid is not None else "")

    def brief(self) -> str:
        storage, text, cut = _native(self.value)
        shown = "NULL" if text is None else (text[:40] + "…" if cut or len(text) > 40 else text)
        return f"{self.where()} = {storage} {shown!r}: {self.outcome}"

    def evidence(self) -> dict[str, Any]:
        storage, text, cut = _native(self.value)
        rec: dict[str, Any] = {"type": EVIDENCE_TYPE, "source": "sessions.db", "session": self.session,
                               "table": self.table, "column": self.column}
        if self.rowid is not None:
            rec["rowid"] = str(self.rowid)
        rec["storage"] = storage
        rec["value"] = text
        if cut:
            rec["truncated"] = True
        rec["outcome"] = self.outcome
        return rec


def _counter(value: Any) -> int | None:
    """A token counter: an integer 0 … 2^63-1 (a real, text, blob or negative number is no count)."""
    if type(value) is int and 0 <= value <= INT64_MAX:
        return value
    return None


def _cost(value: Any) -> float | None:
    """A USD amount: a finite, non-negative number."""
    if type(value) is int:
        if 0 <= value <= INT64_MAX:
            return float(value)
        return None
    if type(value) is float and math.isfinite(value) and value >= 0:
        return value
    return None


def _text(value: Any) -> str | None:
    """A descriptive TEXT column: text as is, anything else unknown."""
    return value if isinstance(value, str) else None


# --- sessions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionInfo:
    id: str  # the id's text; when the column is not text, its rendering (the session is then skipped)
    session_type: str | None
    working_dir: str | None
    created_at: datetime | None  # parsed as UTC; None when absent or unparseable
    created_at_raw: str | None  # the column as stored
    name: str | None
    parent_session_id: str | None = None  # schema 15+; None when absent or not text
    provider_name: str | None = None
    model: str | None = None  # model_config_json.model_name, else the session's last usage_ledger.model
    updated_at: datetime | None = None  # parsed as UTC; None when absent or unparseable
    id_problem: str | None = None  # why sessions.id is unusable (NULL, not text): the session is skipped
    odd: tuple[OddValue, ...] = ()  # values of the session's row that did not parse


def _seconds_in_range(v: int) -> bool:
    return MIN_MS <= v * 1000 <= MAX_MS


def parse_time(value: Any) -> tuple[datetime | None, bool]:
    """(time as UTC, odd?) of a TIMESTAMP column: goose's text (``YYYY-MM-DD HH:MM:SS``, ISO 8601),
    or a number of seconds (milliseconds above 10^10). NULL and empty text are absent (not odd);
    anything else that gives no time in years 1..9999 is odd (None)."""
    if value is None:
        return None, False
    if isinstance(value, bool) or isinstance(value, bytes):
        return None, True
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return None, True
        v = float(value)
        if v > _MS_THRESHOLD:
            v /= 1000
        if not MIN_MS / 1000 <= v <= MAX_MS / 1000:
            return None, True
        try:
            return datetime.fromtimestamp(v, tz=UTC), False
        except (OverflowError, ValueError, OSError):
            return None, True
    text = str(value).strip()
    if not text:
        return None, False
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)  # 'YYYY-MM-DD HH:MM:SS[.fff][+00:00]' and the T form
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)  # goose stores UTC text
        return dt.astimezone(UTC), False
    except (ValueError, OverflowError):  # unparseable, or shifted out of years 1..9999
        return None, True


def _parse_ts(value: Any) -> datetime | None:
    return parse_time(value)[0]


def _model_name(model_config_json: Any) -> str | None:
    if not isinstance(model_config_json, str):
        return None
    try:
        cfg = json.loads(model_config_json)
    except (ValueError, RecursionError):
        return None
    name = cfg.get("model_name") if isinstance(cfg, dict) else None
    return name if isinstance(name, str) and name else None


def ledger_models(conn: sqlite3.Connection) -> dict[str, str]:
    """Per session, the ``model`` of its last ``usage_ledger`` row (by id) that names one (the
    resolved model that answered last); empty before schema 15."""
    if "usage_ledger" not in _tables(conn) or "model" not in _columns(conn, "usage_ledger"):
        return {}
    try:
        rows = conn.execute(
            "SELECT session_id, model FROM usage_ledger WHERE typeof(session_id) = 'text'"
            " AND typeof(model) = 'text' AND model <> '' ORDER BY id"
        ).fetchall()
    except sqlite3.DatabaseError:  # a damaged ledger: no model from it (its sessions are skipped later)
        return {}
    return dict(rows)  # the last row of a session wins


def list_sessions(
    conn: sqlite3.Connection, since: datetime | None = None, session_id: str | None = None
) -> list[SessionInfo]:
    """Sessions ordered by (created_at, id). ``since`` (naive = UTC) keeps sessions created at or
    after it; a session whose created_at cannot be parsed is kept (never silently dropped) and
    sorted last."""
    cols = _columns(conn, "sessions")
    wanted = ["id", "session_type", "working_dir", "created_at", "updated_at", "name", "parent_session_id",
              "provider_name", "model_config_json"]
    present = [c for c in wanted if c in cols]
    sql = f"SELECT {', '.join(present)} FROM sessions"
    params: tuple[str, ...] = ()
    if session_id is not None:
        sql += " WHERE id = ?"
        params = (session_id,)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    models = ledger_models(conn)
    out: list[tuple[tuple[bool, datetime, str], SessionInfo]] = []
    for row in conn.execute(sql, params).fetchall():
        d = dict(zip(present, row, strict=True))
        raw_id = d["id"]
        sid = raw_id if isinstance(raw_id, str) else _native(raw_id)[1] or "NULL"
        id_problem = None if isinstance(raw_id, str) else f"sessions.id is {_native(raw_id)[0]}, not text"
        odd: list[OddValue] = []
        created, bad = parse_time(d.get("created_at"))
        if bad:
            odd.append(OddValue(sid, "sessions", None, "created_at", d.get("created_at"),
                                "not a time: the creation time is unknown (sorted last, kept by --since)"))
        if since is not None and created is not None and created < since:
            continue
        updated, bad = parse_time(d.get("updated_at"))
        if bad:
            odd.append(OddValue(sid, "sessions", None, "updated_at", d.get("updated_at"),
                                "not a time: the last activity is taken from the messages"))
        parent = d.get("parent_session_id")
        if parent is not None and not (isinstance(parent, str) and parent):
            if parent != "":
                odd.append(OddValue(sid, "sessions", None, "parent_session_id", parent,
                                    "not a session id: the parent link is dropped"))
            parent = None
        created_raw = d.get("created_at")
        info = SessionInfo(
            id=sid,
            session_type=_text(d.get("session_type")),
            working_dir=_text(d.get("working_dir")),
            created_at=created,
            created_at_raw=None if created_raw is None else _native(created_raw)[1],
            name=_text(d.get("name")),
            parent_session_id=parent,
            provider_name=_text(d.get("provider_name")),
            model=_model_name(d.get("model_config_json")) or (models.get(sid) if id_problem is None else None),
            updated_at=updated,
            id_problem=id_problem,
            odd=tuple(odd),
        )
        key = (created is None, created or datetime.min.replace(tzinfo=UTC), sid)
        out.append((key, info))
    out.sort(key=lambda kv: kv[0])
    return [info for _, info in out]


# --- messages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceMessage:
    rowid: int
    message_id: str
    role: str
    created: int  # seconds
    content: Any  # the parsed content_json (a list for every well-formed row); the raw text if unparseable
    metadata: Any  # the parsed metadata_json (dict), None when NULL; the raw text if unparseable
    line: str  # a stream-json `message` record (compact JSON)
    odd: tuple[OddValue, ...] = ()  # values of this row that did not parse


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e400: JSON has no infinity, and the workers' parser refuses it
        raise ValueError(f"number out of range: {text}")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")  # NaN / Infinity: Python's extension, not JSON


def _loads_or_raw(text: Any) -> Any:
    """Strict JSON (no NaN/Infinity, no number beyond a float); the text itself when it is not."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        return text  # a number in a JSON column: kept as the number
    try:
        return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # also: integers past Python's digit limit, deep nesting
        return text


def _as_text(value: Any) -> Any:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _seconds(created: Any) -> int | None:
    """``created_timestamp`` as seconds (milliseconds above 10^10); None when it is not an integer
    or out of years 1..9999."""
    if type(created) is not int:
        return None
    v = created // 1000 if created > _MS_THRESHOLD else created
    return v if _seconds_in_range(v) else None


def _line(message_id: str, role: Any, created: int, content: Any, metadata: Any) -> str:
    msg: dict[str, Any] = {"id": message_id, "role": role, "created": created, "content": content}
    if metadata is not None:
        msg["metadata"] = metadata
    return json.dumps({"type": "message", "message": msg}, ensure_ascii=False, separators=(",", ":"))


def _readable(line: str) -> bool:
    """Can the line be published and parsed (no lone surrogate from a JSON escape)? Workers'
    JSON reader refuses those even escaped."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_messages(conn: sqlite3.Connection, session_id: str) -> list[SourceMessage]:
    """The session's messages in transcript order: ``ORDER BY created_timestamp, id``.

    Before schema 7 there is no ``message_id`` column: the id is ``msg_<session_id>_<rowid>``,
    exactly what goose's schema-7 migration assigns; a NULL (or non-text, or empty) ``message_id``
    at a later schema gets the same deterministic id. A ``created_timestamp`` that is no time is
    replaced by the time of the message before it (else after it, else 0) and reported as odd.
    """
    cols = _columns(conn, "messages")
    has_mid = "message_id" in cols
    has_meta = "metadata_json" in cols
    sql = (
        "SELECT id, "
        + ("message_id" if has_mid else "NULL")
        + ", role, content_json, created_timestamp, "
        + ("metadata_json" if has_meta else "NULL")
        + " FROM messages WHERE session_id = ? ORDER BY created_timestamp, id"
    )
    rows = conn.execute(sql, (session_id,)).fetchall()
    times = [_seconds(r[4]) for r in rows]
    good = [t for t in times if t is not None]
    fallback = good[0] if good else 0
    out: list[SourceMessage] = []
    for (rowid, mid, role, content_json, created_ts, metadata_json), created in zip(rows, times, strict=True):
        odd: list[OddValue] = []
        message_id = mid if isinstance(mid, str) and mid else f"msg_{session_id}_{rowid}"
        if created is None:
            odd.append(OddValue(session_id, "messages", rowid, "created_timestamp", created_ts,
                                f"not a time: the message is published at {fallback} (its neighbour's time)"))
            created = fallback
        fallback = created
        if not isinstance(role, str):
            odd.append(OddValue(session_id, "messages", rowid, "role", role,
                                "not text: the message is published with its rendering as role"))
            role = _native(role)[1]
        content = _loads_or_raw(content_json)
        metadata = _loads_or_raw(metadata_json)
        line = _line(message_id, role, created, content, metadata)
        if not _readable(line):  # a lone surrogate escape inside the JSON: kept as the stored text
            if not _readable(json.dumps(content, ensure_ascii=False)):
                content = _as_text(content_json)
            if not _readable(json.dumps(metadata, ensure_ascii=False)):
                metadata = _as_text(metadata_json)
            line = _line(message_id, role, created, content, metadata)
        out.append(
            SourceMessage(
                rowid=rowid,
                message_id=message_id,
                role=role,
                created=created,
                content=content,
                metadata=metadata,
                line=line,
                odd=tuple(odd),
            )
        )
    return out


# --- usage --------------------------------------------------------------------------------------

# a stream-json `complete` record (spec §2.1): "type", "total_tokens" (always), the token counters
# of _COMPLETE_KEYS and "cost_usd" when known; the importer also keeps it as its `reported` totals
UsageRecord: TypeAlias = dict[str, Any]

_COMPLETE_KEYS = (
    ("input_tokens", "inputTokens"),
    ("output_tokens", "outputTokens"),
    ("cache_read_input_tokens", "cacheReadTokens"),
    ("cache_write_input_tokens", "cacheWriteTokens"),
)
# usage_ledger / sessions.accumulated_* column -> `complete` key
_LEDGER_KEYS = (
    ("total_tokens", "total_tokens"),
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_tokens", "cache_read_input_tokens"),
    ("cache_write_tokens", "cache_write_input_tokens"),
)


def _round_cost(x: float) -> float:
    # float sums of per-call costs carry binary noise (0.056100000000000004); 1e-10 USD is finer
    # than any provider reports, so round there
    return round(x, 10)


@dataclass
class _Sums:
    """Per `complete` key, the sum of the values that parsed; a key with an odd value is unknown
    (omitted: an undercount would pass for the whole usage), the value kept as evidence."""

    session: str
    table: str
    counts: dict[str, int | None] = field(default_factory=dict)
    costs: list[float] = field(default_factory=list)
    poisoned: set[str] = field(default_factory=set)
    odd: list[OddValue] = field(default_factory=list)

    def count(self, key: str, value: Any, rowid: int | None, column: str) -> None:
        if value is None:
            return  # unrecorded, as SQL's SUM skips NULL
        v = _counter(value)
        if v is None:
            self.poisoned.add(key)
            self.odd.append(OddValue(self.session, self.table, rowid, column, value,
                                     f"not a token count (integer 0..2^63-1): {key} is omitted from the complete"))
            return
        self.counts[key] = (self.counts.get(key) or 0) + v

    def cost(self, value: Any, rowid: int | None, column: str) -> None:
        if value is None:
            return
        v = _cost(value)
        if v is None:
            self.poisoned.add("cost_usd")
            self.odd.append(OddValue(self.session, self.table, rowid, column, value,
                                     "not a cost (finite number >= 0): cost_usd is omitted from the complete"))
            return
        self.costs.append(v)

    def record(self, column_of: dict[str, str]) -> UsageRecord:
        parts: dict[str, int | None] = {}
        for key in ("total_tokens", *(k for k, _ in _COMPLETE_KEYS)):
            v = None if key in self.poisoned else self.counts.get(key)
            if v is not None and v > INT64_MAX:
                self.odd.append(OddValue(self.session, self.table, None, f"SUM({column_of[key]})", v,
                                         f"the sum exceeds 2^63-1: {key} is omitted from the complete"))
                self.poisoned.add(key)
                v = None
            parts[key] = v
        cost: float | None = None
        if self.costs and "cost_usd" not in self.poisoned:
            try:
                cost = math.fsum(self.costs)
            except OverflowError:
                cost = math.inf
            if not math.isfinite(cost):
                self.odd.append(OddValue(self.session, self.table, None, f"SUM({column_of['cost_usd']})", cost,
                                         "the sum is not finite: cost_usd is omitted from the complete"))
                cost = None
        total = parts.pop("total_tokens")
        return _complete(total, parts, cost, derive_total="total_tokens" not in self.poisoned)


def _complete(total: int | None, parts: dict[str, int | None], cost: float | None,
              derive_total: bool = True) -> UsageRecord:
    inputs, outputs = parts.get("input_tokens"), parts.get("output_tokens")
    if total is None and derive_total and inputs is not None and outputs is not None \
            and inputs + outputs <= INT64_MAX:
        total = inputs + outputs  # spec §2.1: total = input + output
    rec: dict[str, Any] = {"type": "complete", "total_tokens": total}
    for key, _ in _COMPLETE_KEYS:
        if parts.get(key) is not None:
            rec[key] = parts[key]
    if cost is not None:
        rec["cost_usd"] = _round_cost(cost)
    return rec


@dataclass(frozen=True)
class UsageReport:
    record: UsageRecord  # the `complete` record
    source: str  # usage_ledger | message_metadata | session_accumulated | none
    odd: tuple[OddValue, ...] = ()  # values left out of `record` (kept as evidence by the importer)


def usage_report(conn: sqlite3.Connection, session_id: str) -> UsageReport:
    """The session's ``complete`` record, its source, and the values that did not parse (see
    ``usage_complete``)."""
    tables = _tables(conn)
    # 1. the ledger (schema 15+), one row per provider call: what newest goose sums for `complete`
    if "usage_ledger" in tables:
        lcols = _columns(conn, "usage_ledger")
        wanted = [c for c, _ in _LEDGER_KEYS] + ["cost"]
        sel = ", ".join(c if c in lcols else "NULL" for c in wanted)
        rows = conn.execute(f"SELECT id, {sel} FROM usage_ledger WHERE session_id = ? ORDER BY id",
                            (session_id,)).fetchall()
        if rows:
            sums = _Sums(session_id, "usage_ledger")
            for row in rows:
                for (col, key), v in zip(_LEDGER_KEYS, row[1:6], strict=True):
                    sums.count(key, v, row[0], col)
                sums.cost(row[6], row[0], "cost")
            column_of = {key: col for col, key in _LEDGER_KEYS} | {"cost_usd": "cost"}
            rec = sums.record(column_of)
            return UsageReport(rec, "usage_ledger", tuple(sums.odd))
    # 2. per-turn metadata.usage of the messages (never added to the ledger: same calls)
    cols = _columns(conn, "messages")
    if "metadata_json" in cols:
        sums = _Sums(session_id, "messages")
        found = False
        for rowid, meta_json in conn.execute(
            "SELECT id, metadata_json FROM messages WHERE session_id = ? AND metadata_json LIKE '%usage%'"
            " ORDER BY created_timestamp, id",
            (session_id,),
        ):
            meta = _loads_or_raw(meta_json)
            usage = meta.get("usage") if isinstance(meta, dict) else None
            if not isinstance(usage, dict):
                continue
            found = True
            for key, native in (("total_tokens", "totalTokens"), *_COMPLETE_KEYS):
                sums.count(key, usage.get(native), rowid, f"metadata_json.usage.{native}")
            sums.cost(usage.get("cost"), rowid, "metadata_json.usage.cost")
        if found:
            column_of = {key: f"metadata_json.usage.{native}"
                         for key, native in (("total_tokens", "totalTokens"), *_COMPLETE_KEYS)}
            rec = sums.record(column_of | {"cost_usd": "metadata_json.usage.cost"})
            return UsageReport(rec, "message_metadata", tuple(sums.odd))
    # 3. neither: the session's accumulated_* columns, goose's own `complete` source between
    #    2026-05-13 and the ledger; NULL or all-zero columns are schema defaults, not usage
    scols = _columns(conn, "sessions")
    acc = [(f"accumulated_{col}", key) for col, key in _LEDGER_KEYS]
    present = [(c, k) for c, k in acc if c in scols]
    has_cost = "accumulated_cost" in scols
    if present or has_cost:
        names = [c for c, _ in present] + (["accumulated_cost"] if has_cost else [])
        row = conn.execute(f"SELECT {', '.join(names)} FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is not None:
            d = dict(zip(names, row, strict=True))
            sums = _Sums(session_id, "sessions")
            for c, k in present:
                sums.count(k, d[c], None, c)
            if has_cost:
                sums.cost(d["accumulated_cost"], None, "accumulated_cost")
            if sums.odd or any(sums.counts.values()) or any(sums.costs):
                column_of = {k: c for c, k in acc} | {"cost_usd": "accumulated_cost"}
                rec = sums.record(column_of)
                return UsageReport(rec, "session_accumulated", tuple(sums.odd))
    # 4. nothing known: goose itself writes {"type":"complete","total_tokens":null} in that case
    return UsageReport({"type": "complete", "total_tokens": None}, "none")


def usage_complete_with_source(conn: sqlite3.Connection, session_id: str) -> tuple[UsageRecord, str]:
    """Like ``usage_complete``, also naming the source used: ``usage_ledger``,
    ``message_metadata``, ``session_accumulated`` or ``none``."""
    rep = usage_report(conn, session_id)
    return rep.record, rep.source


def usage_complete(conn: sqlite3.Connection, session_id: str) -> UsageRecord:
    """The ``complete`` record for the session (stream-json shape, spec §2.1).

    Source, in order, never mixed: (1) the ``usage_ledger`` rows of the session when the table
    exists and has any; (2) else the sum of the messages' ``metadata_json.usage``; (3) when both
    are absent, the ``sessions.accumulated_*`` columns (what goose reported between 2026-05-13 and
    the ledger), unless they are NULL/zero defaults; (4) else ``{"type":"complete",
    "total_tokens":null}``. Keys are omitted when unknown; ``total_tokens`` is always present
    (``input + output`` when no total was recorded but both parts were). ``cost_usd`` is the
    exact (fsum) sum rounded to 1e-10. A counter with a value that is no count (or whose sum
    exceeds 2^63-1) is unknown, so omitted (``usage_report`` lists those values).
    """
    return usage_report(conn, session_id).record
