"""Pure core of the PostgreSQL sink: topic entries in, typed rows or dead letters out.

No I/O here. A topic entry is the plain field map of `harness.events` (eventId, runId, seq,
type, data) or `harness.runs` (recordId, runId, seq, state, data); `data` is the whole event
or record as JSON and is stored verbatim as `jsonb`, the typed columns are read from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson

from contracts.deadletters import POSTGRES_INVALID_ENTRY, POSTGRES_REJECTED
from contracts.events import EVENT_TYPES
from contracts.runs import RUN_STATES
from contracts.stream_ids import StreamId
from contracts.topics import EVENT, RECORD, TopicEntry, TopicEntryError

# Dead-letter reasons of the sink (the `reason` field of its dead-letter entries): contracts/deadletters.py.
INVALID_ENTRY = POSTGRES_INVALID_ENTRY
REJECTED = POSTGRES_REJECTED

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
# An event's time must fall in [SANE_FROM, the sink's clock + SANE_AHEAD] to choose its monthly
# partition: any other (a tap's clock in 1970 or 9999, a hostile `ts`) would make partitions that
# retention never drops, or crash on a year past 9999. Such an event is filed under the time its
# topic entry was written (the broker's clock, in its id); `data` keeps the original timestamp.
SANE_FROM = "2000-01-01T00:00:00.000Z"
SANE_AHEAD = timedelta(days=1)
_RECORD_K = re.compile(r":run:(\d+)$")
_EVENT_TYPES = frozenset(EVENT_TYPES)
_RUN_STATES = frozenset(RUN_STATES)

# What the sink sends for an event; the server generates the typed columns from `data` (0001_tables.sql).
EVENT_COLUMNS = ("ts", "data")
RECORD_COLUMNS = (
    "record_id", "run_key", "k", "state", "ts", "seq", "host", "agent", "format", "model",
    "parent_run_key", "continues_run_key", "exit_code", "input_tokens", "output_tokens",
    "total_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd", "counts", "data",
)  # fmt: skip


class EntryRef(NamedTuple):
    """Where a row came from: the topic partition and the stream entry id."""

    stream: str
    entry_id: str


class EventRow(NamedTuple):
    """An event to write (a NamedTuple: built per event on the hot path, cheaper than a dataclass)."""

    ref: EntryRef
    event_id: str
    ts: str  # RFC 3339 text, parsed by PostgreSQL (the partition key: see SANE_FROM)
    data: bytes  # the event's JSON exactly as published
    clamped: bool = False  # ts is the entry's time, not the event's (which `data` keeps)

    @property
    def month(self) -> str:
        """`YYYY-MM` of the event's timestamp: the monthly partition it belongs to."""
        return self.ts[:7]

    def copy_line(self) -> bytes:
        """The row in COPY text format. Compact JSON holds no raw tab or newline, but a broken
        producer's might: escape them with the backslash so the row structure always holds."""
        data = self.data
        if b"\\" in data:
            data = data.replace(b"\\", b"\\\\")
        if b"\n" in data or b"\r" in data or b"\t" in data:
            data = data.replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")
        return self.ts.encode() + b"\t" + data + b"\n"


@dataclass(frozen=True)
class RecordRow:
    ref: EntryRef
    record_id: str
    run_key: str
    k: int
    state: str
    ts: str
    seq: int
    host: str | None
    agent: str | None
    format: str | None
    model: str | None
    parent_run_key: str | None
    continues_run_key: str | None
    exit_code: int | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cost_usd: float | None
    counts: str  # JSON object
    data: str

    def values(self) -> tuple[Any, ...]:
        return (
            self.record_id, self.run_key, self.k, self.state, self.ts, self.seq, self.host, self.agent,
            self.format, self.model, self.parent_run_key, self.continues_run_key, self.exit_code,
            self.input_tokens, self.output_tokens, self.total_tokens, self.cache_read_tokens,
            self.cache_write_tokens, self.cost_usd, self.counts, self.data,
        )  # fmt: skip


@dataclass(frozen=True)
class RefusedEntry:
    """An entry the sink will not write (its dead letter is built from it after the commit)."""

    ref: EntryRef
    reason: str
    detail: str
    fields: Mapping[str, bytes]


@dataclass(frozen=True)
class Parsed:
    """One batch, parsed: rows to write, entries to dead-letter, events skipped by retention."""

    events: list[EventRow]
    records: list[RecordRow]
    dead: list[RefusedEntry]
    expired: int
    clamped: int = 0  # events filed under their entry's time (their own was not sane)


class _Invalid(ValueError):
    pass


def _opt(obj: Mapping[str, Any], key: str, kind: type) -> Any:
    """obj[key] when it has the type the column needs, else None (the jsonb keeps the original)."""
    value = obj.get(key)
    if kind is int and isinstance(value, bool):
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value if isinstance(value, kind) else None


def _document(entry: TopicEntry) -> dict[str, Any]:
    try:
        return entry.document()
    except TopicEntryError as exc:
        raise _Invalid(str(exc)) from None


def _timestamp(doc: Mapping[str, Any]) -> str:
    ts = doc.get("timestamp")
    if not isinstance(ts, str) or not _TIMESTAMP.match(ts):
        raise _Invalid("timestamp missing or not RFC 3339 UTC with milliseconds")
    try:
        datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")  # a month 13 or a 25th hour passes the pattern
    except ValueError:
        raise _Invalid(f"timestamp {ts[:40]!r} is not a valid date and time") from None
    return ts


def rfc3339(when: datetime) -> str:
    """A UTC instant as the contract writes timestamps (milliseconds, `Z`)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def entry_time(entry_id: str) -> str:
    """The time a stream entry was written: the milliseconds of its id, as RFC 3339."""
    ms, _ = entry_id_parts(entry_id)
    return rfc3339(datetime.fromtimestamp(ms / 1000, UTC))


def sane(row: EventRow, ceiling: str) -> EventRow:
    """The row with its partition key within [SANE_FROM, ceiling]: else its entry's time."""
    if SANE_FROM <= row.ts <= ceiling:
        return row
    return row._replace(ts=min(max(entry_time(row.ref.entry_id), SANE_FROM), ceiling), clamped=True)


def _nonneg_int(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Invalid(f"{key} missing or not a non-negative integer")
    return value


def parse_event(ref: EntryRef, fields: Mapping[bytes, bytes]) -> EventRow:
    """Check the envelope; the typed columns are the server's business (generated from `data`)."""
    entry = TopicEntry.from_fields(fields, EVENT)
    doc = _document(entry)
    event_id = doc.get("eventId")
    if not isinstance(event_id, str) or not event_id or event_id != entry.id:
        raise _Invalid("eventId missing or different from the entry's")
    run_key = doc.get("runId")
    if not isinstance(run_key, str) or not run_key:
        raise _Invalid("runId missing")
    if doc.get("type") not in _EVENT_TYPES:
        raise _Invalid(f"unknown event type {doc.get('type')!r}")
    seq = _nonneg_int(doc, "seq")
    if event_id != f"{run_key}:{seq}":
        # The table's key is (run, seq, ts): it stands for eventId only while the contract holds.
        raise _Invalid("eventId is not <runId>:<seq>")
    return EventRow(ref=ref, event_id=event_id, ts=_timestamp(doc), data=entry.data or b"")


def parse_record(ref: EntryRef, fields: Mapping[bytes, bytes]) -> RecordRow:
    entry = TopicEntry.from_fields(fields, RECORD)
    doc = _document(entry)
    record_id = doc.get("recordId")
    run_key = doc.get("runId")
    if not isinstance(record_id, str) or record_id != entry.id:
        raise _Invalid("recordId missing or different from the entry's")
    if not isinstance(run_key, str) or not run_key or not record_id.startswith(run_key + ":run:"):
        raise _Invalid("runId missing or not the recordId's run")
    match = _RECORD_K.search(record_id)
    if match is None:
        raise _Invalid("recordId does not end in :run:<k>")
    state = doc.get("state")
    if state not in _RUN_STATES:
        raise _Invalid(f"unknown run state {state!r}")
    counts = doc.get("counts")
    if not isinstance(counts, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in counts.values()
    ):
        raise _Invalid("counts missing or not an object of integers")
    return RecordRow(
        ref=ref,
        record_id=record_id,
        run_key=run_key,
        k=int(match.group(1)),
        state=state,
        ts=_timestamp(doc),
        seq=_nonneg_int(doc, "seq"),
        host=_opt(doc, "host", str),
        agent=_opt(doc, "agent", str),
        format=_opt(doc, "format", str),
        model=_opt(doc, "model", str),
        parent_run_key=_opt(doc, "parentRunId", str),
        continues_run_key=_opt(doc, "continuesRunId", str),
        exit_code=_opt(doc, "exitCode", int),
        input_tokens=_opt(doc, "inputTokens", int),
        output_tokens=_opt(doc, "outputTokens", int),
        total_tokens=_opt(doc, "totalTokens", int),
        cache_read_tokens=_opt(doc, "cacheReadInputTokens", int),
        cache_write_tokens=_opt(doc, "cacheWriteInputTokens", int),
        cost_usd=_opt(doc, "costUsd", float),
        counts=orjson.dumps(counts).decode(),
        data=(entry.data or b"").decode("utf-8", "replace"),
    )


def month_start(month: str) -> datetime:
    """The first instant (UTC) of a `YYYY-MM` month."""
    return datetime(int(month[:4]), int(month[5:7]), 1, tzinfo=UTC)


def parse_topic_batch(
    event_entries: Sequence[tuple[str, str, Mapping[bytes, bytes]]],
    record_entries: Sequence[tuple[str, str, Mapping[bytes, bytes]]],
    horizon: str,
    ceiling: str | None = None,
) -> Parsed:
    """Parse (stream, entry id, fields) triples. An event whose time is before SANE_FROM or after
    `ceiling` (RFC 3339: the sink's clock + SANE_AHEAD) is filed under its entry's time (`sane`).
    Events older than `horizon` (an RFC 3339 timestamp: now minus the retention) are counted as
    expired: their partition is dropped or about to be, so writing them would only re-create it."""
    events: list[EventRow] = []
    records: list[RecordRow] = []
    dead: list[RefusedEntry] = []
    expired = clamped = 0
    for stream, entry_id, fields in event_entries:
        ref = EntryRef(stream, entry_id)
        try:
            row = parse_event(ref, fields)
        except _Invalid as exc:
            dead.append(RefusedEntry(ref, INVALID_ENTRY, str(exc), _str_keys(fields)))
            continue
        if ceiling is not None:
            row = sane(row, ceiling)
            clamped += row.clamped
        if row.ts < horizon:
            expired += 1
        else:
            events.append(row)
    for stream, entry_id, fields in record_entries:
        ref = EntryRef(stream, entry_id)
        try:
            records.append(parse_record(ref, fields))
        except _Invalid as exc:
            dead.append(RefusedEntry(ref, INVALID_ENTRY, str(exc), _str_keys(fields)))
    return Parsed(events, records, dead, expired, clamped)


def _str_keys(fields: Mapping[bytes, bytes]) -> dict[str, bytes]:
    return {k.decode("utf-8", "replace"): v for k, v in fields.items()}


def entry_id_parts(entry_id: str) -> tuple[int, int]:
    """`<ms>-<seq>` of a stream entry id as two integers (they order like the ids)."""
    return StreamId.parse(entry_id)


def positions(refs: list[EntryRef]) -> dict[str, tuple[int, int, int]]:
    """Per stream: the highest entry id (ms, seq) among `refs` and how many entries there were."""
    out: dict[str, tuple[int, int, int]] = {}
    for ref in refs:
        ms, seq = entry_id_parts(ref.entry_id)
        prev = out.get(ref.stream)
        if prev is None:
            out[ref.stream] = (ms, seq, 1)
        else:
            top = max((prev[0], prev[1]), (ms, seq))
            out[ref.stream] = (top[0], top[1], prev[2] + 1)
    return out
