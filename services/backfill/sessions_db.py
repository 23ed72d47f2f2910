"""Read-only access to goose's ``sessions.db`` (spec: goose-stream-format.md §9).

Pure reading, no broker. Safe while goose writes: the database is opened with ``mode=ro`` (never
created), a 30 s busy timeout, and every read is a single statement, i.e. one consistent WAL
snapshot. (SQLite may still create the ``-shm``/``-wal`` side files next to a WAL database, as
any reader does.)

Supported schema versions: 6 … 17. Columns are discovered per database (``PRAGMA table_info``),
so only the columns that exist at that version are read.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

MIN_SCHEMA = 6
MAX_SCHEMA = 17
BUSY_TIMEOUT_MS = 30_000
_MS_THRESHOLD = 10_000_000_000  # created_timestamp values above this are milliseconds


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


# --- sessions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionInfo:
    id: str
    session_type: str | None
    working_dir: str | None
    created_at: datetime | None  # parsed as UTC; None when absent or unparseable
    created_at_raw: str | None  # the column as stored
    name: str | None
    parent_session_id: str | None = None  # schema 15+
    provider_name: str | None = None
    model: str | None = None  # model_config_json.model_name


def _parse_ts(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        if v > _MS_THRESHOLD:
            v /= 1000
        return datetime.fromtimestamp(v, tz=UTC)
    text = str(value).strip()
    if not text:
        return None
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)  # 'YYYY-MM-DD HH:MM:SS[.fff][+00:00]' and the T form
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)  # goose stores UTC text
    return dt.astimezone(UTC)


def _model_name(model_config_json: Any) -> str | None:
    if not isinstance(model_config_json, str):
        return None
    try:
        cfg = json.loads(model_config_json)
    except ValueError:
        return None
    name = cfg.get("model_name") if isinstance(cfg, dict) else None
    return name if isinstance(name, str) else None


def list_sessions(
    conn: sqlite3.Connection, since: datetime | None = None, session_id: str | None = None
) -> list[SessionInfo]:
    """Sessions ordered by (created_at, id). ``since`` (naive = UTC) keeps sessions created at or
    after it; a session whose created_at cannot be parsed is kept (never silently dropped)."""
    cols = _columns(conn, "sessions")
    wanted = ["id", "session_type", "working_dir", "created_at", "name", "parent_session_id",
              "provider_name", "model_config_json"]
    present = [c for c in wanted if c in cols]
    sql = f"SELECT {', '.join(present)} FROM sessions"
    params: tuple[str, ...] = ()
    if session_id is not None:
        sql += " WHERE id = ?"
        params = (session_id,)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    out: list[tuple[tuple[bool, datetime, str], SessionInfo]] = []
    for row in conn.execute(sql, params).fetchall():
        d = dict(zip(present, row, strict=True))
        created = _parse_ts(d.get("created_at"))
        if since is not None and created is not None and created < since:
            continue
        info = SessionInfo(
            id=d["id"],
            session_type=d.get("session_type"),
            working_dir=d.get("working_dir"),
            created_at=created,
            created_at_raw=None if d.get("created_at") is None else str(d["created_at"]),
            name=d.get("name"),
            parent_session_id=d.get("parent_session_id"),
            provider_name=d.get("provider_name"),
            model=_model_name(d.get("model_config_json")),
        )
        key = (created is None, created or datetime.min.replace(tzinfo=UTC), str(d["id"]))
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


def _loads_or_raw(text: Any) -> Any:
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _seconds(created: Any) -> int:
    try:
        v = int(created)
    except (TypeError, ValueError):
        return 0
    return v // 1000 if v > _MS_THRESHOLD else v


def _line(message_id: str, role: str, created: int, content: Any, metadata: Any) -> str:
    msg: dict[str, Any] = {"id": message_id, "role": role, "created": created, "content": content}
    if metadata is not None:
        msg["metadata"] = metadata
    return json.dumps({"type": "message", "message": msg}, ensure_ascii=False, separators=(",", ":"))


def read_messages(conn: sqlite3.Connection, session_id: str) -> list[SourceMessage]:
    """The session's messages in transcript order: ``ORDER BY created_timestamp, id``.

    Before schema 7 there is no ``message_id`` column: the id is ``msg_<session_id>_<rowid>``,
    exactly what goose's schema-7 migration assigns; a NULL ``message_id`` at a later schema
    gets the same deterministic id.
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
    out: list[SourceMessage] = []
    for rowid, mid, role, content_json, created_ts, metadata_json in conn.execute(sql, (session_id,)).fetchall():
        message_id = mid if isinstance(mid, str) and mid else f"msg_{session_id}_{rowid}"
        created = _seconds(created_ts)
        content = _loads_or_raw(content_json)
        metadata = _loads_or_raw(metadata_json)
        role = role if isinstance(role, str) else str(role)
        out.append(
            SourceMessage(
                rowid=rowid,
                message_id=message_id,
                role=role,
                created=created,
                content=content,
                metadata=metadata,
                line=_line(message_id, role, created, content, metadata),
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


def _round_cost(x: float) -> float:
    # float sums of per-call costs carry binary noise (0.056100000000000004); 1e-10 USD is finer
    # than any provider reports, so round there
    return round(x, 10)


def _complete(total: int | None, parts: dict[str, int | None], cost: float | None) -> UsageRecord:
    inputs, outputs = parts.get("input_tokens"), parts.get("output_tokens")
    if total is None and inputs is not None and outputs is not None:
        total = inputs + outputs  # spec §2.1: total = input + output
    rec: dict[str, Any] = {"type": "complete", "total_tokens": total}
    for key, _ in _COMPLETE_KEYS:
        if parts.get(key) is not None:
            rec[key] = parts[key]
    if cost is not None:
        rec["cost_usd"] = _round_cost(cost)
    return rec


def usage_complete_with_source(conn: sqlite3.Connection, session_id: str) -> tuple[UsageRecord, str]:
    """Like ``usage_complete``, also naming the source used: ``usage_ledger``,
    ``message_metadata``, ``session_accumulated`` or ``none``."""
    tables = _tables(conn)
    # 1. the ledger (schema 15+), one row per provider call: what newest goose sums for `complete`
    if "usage_ledger" in tables:
        row = conn.execute(
            "SELECT COUNT(*), SUM(total_tokens), SUM(input_tokens), SUM(output_tokens),"
            " SUM(cache_read_tokens), SUM(cache_write_tokens), SUM(cost), COUNT(cost)"
            " FROM usage_ledger WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if row and row[0]:
            ledger_costs = [r[0] for r in conn.execute(
                "SELECT cost FROM usage_ledger WHERE session_id = ? AND cost IS NOT NULL ORDER BY id", (session_id,)
            )]
            parts = {"input_tokens": row[2], "output_tokens": row[3],
                     "cache_read_input_tokens": row[4], "cache_write_input_tokens": row[5]}
            return _complete(row[1], parts, math.fsum(ledger_costs) if ledger_costs else None), "usage_ledger"
    # 2. per-turn metadata.usage of the messages (never added to the ledger: same calls)
    cols = _columns(conn, "messages")
    if "metadata_json" in cols:
        sums: dict[str, int | None] = {k: None for k, _ in _COMPLETE_KEYS}
        total: int | None = None
        costs: list[float] = []
        found = False
        for (meta_json,) in conn.execute(
            "SELECT metadata_json FROM messages WHERE session_id = ? AND metadata_json LIKE '%usage%'"
            " ORDER BY created_timestamp, id",
            (session_id,),
        ):
            meta = _loads_or_raw(meta_json)
            usage = meta.get("usage") if isinstance(meta, dict) else None
            if not isinstance(usage, dict):
                continue
            found = True
            for key, native in _COMPLETE_KEYS:
                v = usage.get(native)
                if isinstance(v, int) and not isinstance(v, bool):
                    sums[key] = (sums[key] or 0) + v
            v = usage.get("totalTokens")
            if isinstance(v, int) and not isinstance(v, bool):
                total = (total or 0) + v
            c = usage.get("cost")
            if isinstance(c, (int, float)) and not isinstance(c, bool):
                costs.append(float(c))
        if found:
            return _complete(total, sums, math.fsum(costs) if costs else None), "message_metadata"
    # 3. neither: the session's accumulated_* columns, goose's own `complete` source between
    #    2026-05-13 and the ledger; NULL or all-zero columns are schema defaults, not usage
    scols = _columns(conn, "sessions")
    acc = ["accumulated_total_tokens", "accumulated_input_tokens", "accumulated_output_tokens",
           "accumulated_cache_read_tokens", "accumulated_cache_write_tokens", "accumulated_cost"]
    present = [c for c in acc if c in scols]
    if present:
        row = conn.execute(f"SELECT {', '.join(present)} FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is not None:
            d = dict(zip(present, row, strict=True))
            if any(isinstance(v, (int, float)) and v for v in d.values()):
                parts = {
                    "input_tokens": d.get("accumulated_input_tokens"),
                    "output_tokens": d.get("accumulated_output_tokens"),
                    "cache_read_input_tokens": d.get("accumulated_cache_read_tokens"),
                    "cache_write_input_tokens": d.get("accumulated_cache_write_tokens"),
                }
                cost = d.get("accumulated_cost")
                return (
                    _complete(d.get("accumulated_total_tokens"), parts, float(cost) if cost is not None else None),
                    "session_accumulated",
                )
    # 4. nothing known: goose itself writes {"type":"complete","total_tokens":null} in that case
    return {"type": "complete", "total_tokens": None}, "none"


def usage_complete(conn: sqlite3.Connection, session_id: str) -> UsageRecord:
    """The ``complete`` record for the session (stream-json shape, spec §2.1).

    Source, in order, never mixed: (1) the ``usage_ledger`` rows of the session when the table
    exists and has any; (2) else the sum of the messages' ``metadata_json.usage``; (3) when both
    are absent, the ``sessions.accumulated_*`` columns (what goose reported between 2026-05-13 and
    the ledger), unless they are NULL/zero defaults; (4) else ``{"type":"complete",
    "total_tokens":null}``. Keys are omitted when unknown; ``total_tokens`` is always present
    (``input + output`` when no total was recorded but both parts were). ``cost_usd`` is the
    exact (fsum) sum rounded to 1e-10.
    """
    return usage_complete_with_source(conn, session_id)[0]
