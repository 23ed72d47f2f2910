"""The archive's format (pure: bytes in, bytes out; no I/O). See docs/archive.md.

Two datasets, both Parquet (zstd) so DuckDB, Spark, Trino, Athena and ClickHouse read them as they
are, partitioned Hive-style (`name=value/` path segments) so those engines prune by date and shard:

- **Raw segments** (the log of record): one object per (stream kind, shard, first and last stream id),
  ``raw/date=YYYY-MM-DD/shard=NNN/<raw|control>-<first ms>-<seq>-<last ms>-<seq>.parquet``. The `fields` column holds every
  field of every entry in Redis order, byte-exact; the other columns are conveniences for queries.
- **Event lake** (analytics-shaped): the topics' events and run records with the columns of the
  PostgreSQL sink's `events` and `run_records` tables, computed by the sink's own pure row functions
  (services/export/postgres/rows.py) so the two cannot drift,
  ``events/date=YYYY-MM-DD/type=<type>/part-<shard>-<first>-<last>.parquet`` and
  ``runs/date=YYYY-MM-DD/part-<shard>-<first>-<last>.parquet`` (ids as in raw names).

Why every object's name carries the FIRST and the LAST stream id of its segment (issue 32): an
object is only ever created, never replaced (the store's create-only put), so no later write can
remove an archived entry. Two objects of one name hold the same ids of one stream, i.e. the same
entries (a stream id names one entry for good), so the second create finding the first is a success.
Two objects with different names may overlap (a segment rewritten after a crash between the write
and its acknowledgement, cut elsewhere; a second archive before its fence): every reader keeps
one copy per stream id (services/archive/reader.py; the lake's SQL by event and record id), so an
overlap is never a double count. The consumer skips what it has archived already (its position
per stream, recovered from the store's names), so overlaps are the exception, not the rule.

Ids are zero-padded to 20 digits (a uint64's width) so object names sort like the ids.
"""

from __future__ import annotations

import contextlib
import gc
import io
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contracts.stream_ids import StreamId
from services.export.postgres import rows as pg_rows

FORMAT_VERSION = 1  # in each file's key-value metadata (`goose_ingest_archive`); bump only additively
COMPRESSION = "zstd"
RAW_PREFIX = "raw"
EVENTS_PREFIX = "events"
RUNS_PREFIX = "runs"
STREAM_KINDS = ("raw", "control")  # the `stream` column and the object name's first word
_ID_WIDTH = 20
_MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: the last instant a date partition can name
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

_ID_TOKEN = rf"(\d{{{_ID_WIDTH}}})-(\d{{{_ID_WIDTH}}})"
# `<first id>-<last id>` since issue 32; `<first id>` alone in archives written before (still read).
_RAW_KEY = re.compile(rf"^raw/date=(\d{{4}}-\d{{2}}-\d{{2}})/shard=(\d+)/(raw|control)-{_ID_TOKEN}(?:-{_ID_TOKEN})?\.parquet$")
_LAKE_KEY = re.compile(
    rf"^(events|runs)/date=(\d{{4}}-\d{{2}}-\d{{2}})/(?:type=([^/]+)/)?part-(\d+)-{_ID_TOKEN}(?:-{_ID_TOKEN})?\.parquet$")


class SegmentError(ValueError):
    """An object that is not a segment of this format (corrupt, truncated, another schema)."""


# ---------------------------------------------------------------------------------- stream ids


def id_parts(entry_id: str) -> tuple[int, int]:
    """`<ms>-<seq>` as two integers (they order like the ids). ValueError if it is not an id."""
    return StreamId.parse(entry_id)


def _id_token(entry_id: str) -> str:
    ms, seq = id_parts(entry_id)
    return f"{ms:0{_ID_WIDTH}d}-{seq:0{_ID_WIDTH}d}"


def _token_id(ms: str, seq: str) -> str:
    return f"{int(ms)}-{int(seq)}"


def date_of_ms(ms: int) -> str:
    """`YYYY-MM-DD` (UTC) of a stream id's milliseconds; clamped into year 1970..9999."""
    return datetime.fromtimestamp(min(max(ms, 0), _MAX_MS) / 1000, UTC).strftime("%Y-%m-%d")


# ---------------------------------------------------------------------------------- raw segments


@dataclass(frozen=True)
class ArchivedEntry:
    """One stream entry as archived: where it was and every field, byte-exact, in Redis order."""

    shard: int
    stream: str  # "raw" or "control" (STREAM_KINDS)
    id: str  # the stream id, `<ms>-<seq>`
    fields: dict[bytes, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class RawSegmentKey:
    date: str
    shard: int
    stream: str
    first_id: str
    last_id: str | None = None  # None: a name from before issue 32 (first id only)


RAW_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("id_ms", pa.uint64(), nullable=False),
        pa.field("id_seq", pa.uint64(), nullable=False),
        pa.field("run", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("kind", pa.string()),
        pa.field("ts", pa.string()),
        pa.field("line", pa.binary()),
        pa.field(
            "fields",
            pa.list_(pa.struct([pa.field("name", pa.binary(), nullable=False), pa.field("value", pa.binary(), nullable=False)])),
            nullable=False,
        ),
    ],
    metadata={b"goose_ingest_archive": f"raw/{FORMAT_VERSION}".encode()},
)


def raw_segment_key(stream_kind: str, shard: int, first_id: str, last_id: str) -> str:
    """The object name of the segment of `stream_kind` ("raw"/"control") on `shard` that holds the
    entries from stream id `first_id` to `last_id`: a function of these four only (see the module
    docstring); filed under the date of its first id."""
    if stream_kind not in STREAM_KINDS:
        raise ValueError(f"stream kind must be one of {STREAM_KINDS}, not {stream_kind!r}")
    if shard < 0:
        raise ValueError(f"shard must be >= 0, not {shard}")
    ms, _ = id_parts(first_id)
    return (f"{RAW_PREFIX}/date={date_of_ms(ms)}/shard={shard:03d}/"
            f"{stream_kind}-{_id_token(first_id)}-{_id_token(last_id)}.parquet")


def raw_shard_prefix(date: str, shard: int) -> str:
    """The folder of one day's raw and control segments of one shard."""
    return f"{RAW_PREFIX}/date={date}/shard={shard:03d}/"


def parse_raw_segment_key(key: str) -> RawSegmentKey:
    """The parts of a raw segment's object name; ValueError for any other name."""
    m = _RAW_KEY.match(key)
    if m is None:
        raise ValueError(f"not a raw segment name: {key[:200]!r}")
    last = _token_id(m.group(6), m.group(7)) if m.group(6) else None
    return RawSegmentKey(date=m.group(1), shard=int(m.group(2)), stream=m.group(3), first_id=_token_id(m.group(4), m.group(5)),
                         last_id=last)


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace")


def _int_or_none(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if _INT64[0] <= number <= _INT64[1] else None


_CONVENIENCE = (b"run", b"seq", b"kind", b"ts", b"line")  # the fields with a column of their own
_FIELD_STRUCT = pa.struct([pa.field("name", pa.binary(), nullable=False), pa.field("value", pa.binary(), nullable=False)])


def encode_raw_segment(records: Sequence[ArchivedEntry]) -> bytes:
    """A raw segment (Parquet bytes) of `records`, in the order given (the consumer gives them in
    stream-id order). ValueError for an empty segment or an id that is not a stream id."""
    return _write(raw_table(records), **_RAW_WRITE_OPTIONS)


class RawSegmentWriter:
    """A raw segment written row group by row group as entries come (`add`), finished by `finish`:
    the same file as encode_raw_segment of all of them at once, while what is held in memory is the
    compressed bytes, not the entries."""

    def __init__(self) -> None:
        self._sink = pa.BufferOutputStream()
        self._writer = pq.ParquetWriter(self._sink, RAW_SCHEMA, compression=COMPRESSION, **_RAW_WRITE_OPTIONS)
        self.rows = 0

    def add(self, records: Sequence[ArchivedEntry]) -> None:
        if records:
            self._writer.write_table(raw_table(records))
            self.rows += len(records)

    def finish(self) -> bytes:
        if not self.rows:
            raise ValueError("a segment holds at least one entry")
        self._writer.close()
        return bytes(self._sink.getvalue())


def raw_table(records: Sequence[ArchivedEntry]) -> pa.Table:
    """The Arrow table of a raw segment (see encode_raw_segment).

    Columnar on purpose (measured: a Python dict per field made it ~3x slower): the `fields` column
    is built from two flat binary arrays and their offsets, Arrow's own layout; the convenience
    columns are gathered as bytes in the same pass (plain dict lookups measured 3.5x faster than
    Arrow's `map_lookup`) and converted by Arrow, with Python only for what Arrow refuses (invalid
    UTF-8, a `seq` that is not a number)."""
    if not records:
        raise ValueError("a segment holds at least one entry")
    n = len(records)
    names: list[bytes] = []
    values: list[bytes] = []
    offsets: list[int] = [0] * (n + 1)
    conv: dict[bytes, list[bytes | None]] = {name: [None] * n for name in _CONVENIENCE}
    run, seq, kind, ts, line = (conv[name] for name in _CONVENIENCE)
    for i, rec in enumerate(records):
        f = rec.fields
        get = f.get
        run[i], seq[i], kind[i], ts[i], line[i] = get(b"run"), get(b"seq"), get(b"kind"), get(b"ts"), get(b"line")
        names.extend(f.keys())
        values.extend(f.values())
        offsets[i + 1] = len(names)
    kinds = [rec.stream for rec in records]
    if not set(kinds) <= set(STREAM_KINDS):
        bad = next(k for k in kinds if k not in STREAM_KINDS)
        raise ValueError(f"stream kind must be one of {STREAM_KINDS}, not {bad!r}")
    ids = pa.array([rec.id for rec in records], pa.string())
    id_ms, id_seq = _id_columns(ids)
    offsets_arr = pa.array(offsets, pa.int32())
    name_arr, value_arr = _binary(names), _binary(values)
    pairs = pa.StructArray.from_arrays([name_arr, value_arr], fields=list(_FIELD_STRUCT))
    fields = pa.ListArray.from_arrays(offsets_arr, pairs, type=RAW_SCHEMA.field("fields").type)

    def binary(values: list[bytes | None]) -> pa.Array:
        return pa.array(values, pa.binary())

    columns = [
        pa.array([rec.shard for rec in records], pa.int32()), pa.array(kinds, pa.string()), ids, id_ms, id_seq,
        _as_text(binary(run)), _as_int(binary(seq)), _as_text(binary(kind)), _as_text(binary(ts)), binary(line), fields,
    ]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


def _binary(items: list[bytes]) -> pa.Array:
    """A non-null binary array of `items` by one pa.array call. (Building it from its two buffers,
    offsets by itertools.accumulate and the joined bytes, measured 3-4x slower with pyarrow 26 on
    the bench's 50,000-entry segments: 140-150 ms against 32-48 ms for names and values.) ValueError
    past the 2 GiB an int32 offset can address, where Arrow would split the array into chunks (the
    segment limits keep a segment far below: ARCHIVE_SEGMENT_MAX_BYTES <= 512 MiB)."""
    built = pa.array(items, pa.binary())
    if isinstance(built, pa.ChunkedArray):
        raise ValueError("a segment's fields exceed 2 GiB")
    return built


def _id_columns(ids: pa.Array) -> tuple[pa.Array, pa.Array]:
    """`<ms>-<seq>` ids as two uint64 columns; ValueError (from id_parts) for one that is not an id."""
    try:
        parts = pc.split_pattern(ids, "-", max_splits=1)
        if pc.min(pc.list_value_length(parts)).as_py() == 2:
            return (pc.cast(pc.list_element(parts, 0), pa.uint64()), pc.cast(pc.list_element(parts, 1), pa.uint64()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    pairs = [id_parts(i) for i in ids.to_pylist()]  # the slow path says which id is wrong
    return pa.array([p[0] for p in pairs], pa.uint64()), pa.array([p[1] for p in pairs], pa.uint64())


def _as_text(column: pa.Array) -> pa.Array:
    try:
        return pc.cast(column, pa.string())
    except pa.ArrowInvalid:  # invalid UTF-8 somewhere: replaced, as the column is only a convenience
        return pa.array([_text(v) for v in column.to_pylist()], pa.string())


def _as_int(column: pa.Array) -> pa.Array:
    try:
        return pc.cast(column, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a value that is not a number: null
        return pa.array([_int_or_none(v) for v in column.to_pylist()], pa.int64())


def decode_raw_segment(data: bytes) -> list[ArchivedEntry]:
    """The entries of a raw segment, in their order. SegmentError if it is not one (corrupt,
    truncated, another schema): the caller names the object and goes on with the others.

    Flat arrays, the mirror of raw_table: the `fields` column is read as its offsets and its two
    flat name/value arrays, each converted by Arrow in one call, and each entry's dict is a slice of
    them (no per-field Arrow scalar, no struct-to-dict conversion). Names are converted through
    their dictionary (a few distinct names: one bytes object each, its hash computed once). Reading
    is ~5 % of the time; building the Python objects is the rest, and CPython's cyclic collector
    took as long again (a full collection triggered by the new entries traverses everything the
    process holds: a replay holds every entry read so far), so it is paused while they are built
    (_no_cyclic_gc): the entries form no cycles. Another thread's collections are only delayed by
    it, for the ~0.2-0.5 s a full segment (50,000-100,000 entries) takes to decode."""
    table = _read(data, ["shard", "stream", "id", "fields"])
    missing = {"shard", "stream", "id", "fields"} - set(table.column_names)
    if missing:
        raise SegmentError(f"not a raw segment (no column {sorted(missing)[0]})")
    try:
        lists = table.column("fields").combine_chunks()
        if lists.null_count:
            raise SegmentError("not a raw segment (an entry without fields)")
        with _no_cyclic_gc():
            shards = table.column("shard").to_pylist()
            streams = table.column("stream").to_pylist()
            ids = table.column("id").to_pylist()
            offsets = lists.offsets.to_pylist()
            pairs = lists.values  # offsets index into the whole child array (a slice keeps its offset)
            names = _binary_list(pairs.field("name"))
            values = pairs.field("value").to_pylist()
            fields = [dict(zip(names[lo:hi], values[lo:hi], strict=True)) for lo, hi in zip(offsets[:-1], offsets[1:], strict=True)]
            return list(map(ArchivedEntry, shards, streams, ids, fields))  # one length: columns of one table
    except (TypeError, KeyError, ValueError, pa.ArrowException) as exc:
        if isinstance(exc, SegmentError):
            raise
        raise SegmentError(f"not a raw segment ({exc})") from None


def segment_ids(data: bytes) -> list[tuple[int, int]]:
    """The stream ids of a raw segment, as (ms, seq), read from its two id columns only."""
    table = _read(data, ["id_ms", "id_seq"])
    if table.num_columns != 2:
        raise SegmentError("not a raw segment (no id columns)")
    return list(zip(table.column("id_ms").to_pylist(), table.column("id_seq").to_pylist(), strict=True))


def _binary_list(column: pa.Array) -> list[bytes]:
    """A binary array of few distinct values (field names) as Python bytes, through its dictionary:
    equal values are one object, so building the entries' dicts hashes each name once."""
    encoded = pc.dictionary_encode(column)
    distinct: list[bytes] = encoded.dictionary.to_pylist()
    return list(map(distinct.__getitem__, encoded.indices.to_pylist()))


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """CPython's cyclic collector paused for the block (reference counting still frees everything
    as usual) and restored as it was: for building many acyclic objects at once. Collections that
    would have run meanwhile run at the next allocation after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Statistics (min/max per row group, for pruning) on the small columns only, and dictionary
# encoding only where values repeat: on the lines and field values both cost time and gained
# nothing on varied lines (measured: a third of the write time). Readers see no difference.
_RAW_WRITE_OPTIONS: dict[str, Any] = {
    "write_statistics": ["shard", "stream", "id", "id_ms", "id_seq", "run", "seq", "kind", "ts"],
    "use_dictionary": ["shard", "stream", "run", "kind", "fields.list.element.name"],
}


def _write(table: pa.Table, **options: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=COMPRESSION, **options)
    return sink.getvalue()


def _read(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The table of a Parquet object, only `columns` when given (those it has): a raw segment is
    decoded from shard, stream, id and fields, without the convenience columns (`line` again)."""
    try:
        source = pa.BufferReader(data)
        if columns is not None:
            present = set(pq.read_schema(source).names)
            columns = [c for c in columns if c in present]
        return pq.read_table(pa.BufferReader(data), columns=columns)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SegmentError(f"not a Parquet file ({str(exc)[:200]})") from None


# ---------------------------------------------------------------------------------- event lake

EVENT_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("run_key", pa.string(), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("tool", pa.string()),
        pa.field("tool_call_id", pa.string()),
        pa.field("success", pa.bool_()),
        pa.field("exit_code", pa.int32()),
        pa.field("path", pa.string()),
        pa.field("command", pa.string()),
        pa.field("duration_ms", pa.int64()),
        pa.field("code", pa.string()),
        pa.field("error_class", pa.string()),
        pa.field("data", pa.string(), nullable=False),
    ],
    metadata={b"goose_ingest_archive": f"events/{FORMAT_VERSION}".encode()},
)

RUN_SCHEMA = pa.schema(
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("run_key", pa.string(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("host", pa.string()),
        pa.field("agent", pa.string()),
        pa.field("format", pa.string()),
        pa.field("model", pa.string()),
        pa.field("parent_run_key", pa.string()),
        pa.field("continues_run_key", pa.string()),
        pa.field("exit_code", pa.int32()),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("total_tokens", pa.int64()),
        pa.field("cache_read_tokens", pa.int64()),
        pa.field("cache_write_tokens", pa.int64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("counts", pa.string(), nullable=False),
        pa.field("data", pa.string(), nullable=False),
    ],
    metadata={b"goose_ingest_archive": f"runs/{FORMAT_VERSION}".encode()},
)


@dataclass(frozen=True)
class TopicEntry:
    """One topic entry as read: the partition's shard (0 on a single node), its id and fields."""

    shard: int
    id: str
    fields: Mapping[bytes, bytes]


@dataclass(frozen=True)
class LakeObject:
    """One object of the event lake to write: its name and its Parquet bytes."""

    key: str
    data: bytes
    rows: int


@dataclass(frozen=True)
class LakeRejected:
    """A topic entry the lake has no row for (the sink would dead-letter it too), and why."""

    shard: int
    id: str
    reason: str


@dataclass(frozen=True)
class LakeSegment:
    objects: list[LakeObject]
    rejected: list[LakeRejected]


def _ts_us(ts: str) -> datetime:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _json_text(doc: Mapping[str, Any], key: str) -> str | None:
    """`data ->> 'key'` as PostgreSQL computes it: a string as it is, JSON null or absent as NULL,
    any other value as its JSON text."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _json_int(doc: Mapping[str, Any], key: str, bounds: tuple[int, int]) -> int | None:
    """The generated integer columns: a JSON number becomes the integer or the row is refused (as
    the server's cast refuses `1.5` or a value beyond the column); anything else is NULL."""
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) or not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{key} {value!r} does not fit its column")
    return value


def event_row(row: pg_rows.EventRow) -> dict[str, Any]:
    """The `events` table's columns of one event (0001_tables.sql's generated columns, in Python)
    plus `error_class` (0003's `errorClass`). ValueError where the server would refuse the row."""
    doc = orjson.loads(row.data)
    seq = doc["seq"]
    if seq > _INT32[1]:
        raise ValueError(f"seq {seq} does not fit its column")
    success = doc.get("isSuccess")
    return {
        "ts": _ts_us(row.ts),
        "event_id": row.event_id,
        "run_key": doc["runId"],
        "seq": seq,
        "type": doc["type"],
        "tool": _json_text(doc, "tool"),
        "tool_call_id": _json_text(doc, "toolCallId"),
        "success": success if isinstance(success, bool) else None,
        "exit_code": _json_int(doc, "exitCode", _INT32),
        "path": _json_text(doc, "path"),
        "command": _json_text(doc, "command"),
        "duration_ms": _json_int(doc, "durationMs", _INT64),
        "code": _json_text(doc, "code"),
        "error_class": _json_text(doc, "errorClass"),
        "data": row.data.decode("utf-8"),
    }


def record_row(row: pg_rows.RecordRow) -> dict[str, Any]:
    """The `run_records` table's columns of one lifecycle record (the sink's RecordRow)."""
    for name, value, bounds in (("k", row.k, _INT32), ("seq", row.seq, _INT32), ("exit_code", row.exit_code, _INT32)):
        if value is not None and not bounds[0] <= value <= bounds[1]:
            raise ValueError(f"{name} {value} does not fit its column")
    for name in ("input_tokens", "output_tokens", "total_tokens", "cache_read_tokens", "cache_write_tokens"):
        value = getattr(row, name)
        if value is not None and not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"{name} {value} does not fit its column")
    values = dict(zip(pg_rows.RECORD_COLUMNS, row.values(), strict=True))
    values["ts"] = _ts_us(row.ts)
    return values


def _lake_token(shard: int, first_id: str, last_id: str) -> str:
    return f"part-{shard:03d}-{_id_token(first_id)}-{_id_token(last_id)}.parquet"


def events_object_key(date: str, event_type: str, shard: int, first_id: str, last_id: str) -> str:
    return f"{EVENTS_PREFIX}/date={date}/type={event_type}/{_lake_token(shard, first_id, last_id)}"


def runs_object_key(date: str, shard: int, first_id: str, last_id: str) -> str:
    return f"{RUNS_PREFIX}/date={date}/{_lake_token(shard, first_id, last_id)}"


@dataclass(frozen=True)
class LakeKey:
    dataset: str  # "events" or "runs"
    date: str
    event_type: str | None
    shard: int
    first_id: str
    last_id: str | None = None  # None: a name from before issue 32


def parse_lake_key(key: str) -> LakeKey:
    m = _LAKE_KEY.match(key)
    if m is None or (m.group(1) == "events") != (m.group(3) is not None):
        raise ValueError(f"not an event-lake object name: {key[:200]!r}")
    last = _token_id(m.group(7), m.group(8)) if m.group(7) else None
    return LakeKey(m.group(1), m.group(2), m.group(3), int(m.group(4)), _token_id(m.group(5), m.group(6)), last)


def _ceiling(entry_id: str) -> str:
    """The latest sane event time for an entry: its own time plus SANE_AHEAD. A function of the
    entry (not of the archive's clock as in the sink) so that a rewrite gives the same objects."""
    ms, _ = id_parts(entry_id)
    ahead = int(pg_rows.SANE_AHEAD.total_seconds() * 1000)
    return pg_rows.rfc3339(datetime.fromtimestamp(min(ms + ahead, _MAX_MS) / 1000, UTC))


def encode_event_rows(events: Sequence[TopicEntry], records: Sequence[TopicEntry]) -> LakeSegment:
    """The event-lake objects of one segment of topic entries: `events` from the events topic and
    `records` from the runs topic (each in stream-id order, one partition each). The objects of a
    dataset are named after that dataset's first and last entry ids (see the module docstring); rows are split
    by date (of the event's or record's time, made sane as the sink does) and, for events, by type."""
    rejected: list[LakeRejected] = []
    objects: list[LakeObject] = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in events:
        ref = pg_rows.EntryRef(str(entry.shard), entry.id)
        try:
            row = pg_rows.sane(pg_rows.parse_event(ref, entry.fields), _ceiling(entry.id))
            values = event_row(row)
        except ValueError as exc:  # rows._Invalid is a ValueError
            rejected.append(LakeRejected(entry.shard, entry.id, str(exc)))
            continue
        groups.setdefault((row.ts[:10], values["type"]), []).append(values)
    if events:
        first, last = events[0], events[-1]
        for (date, event_type), rows in sorted(groups.items()):
            table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
            objects.append(LakeObject(events_object_key(date, event_type, first.shard, first.id, last.id), _write(table),
                                      len(rows)))
    run_groups: dict[str, list[dict[str, Any]]] = {}
    for entry in records:
        ref = pg_rows.EntryRef(str(entry.shard), entry.id)
        try:
            rec = pg_rows.parse_record(ref, entry.fields)
            values = record_row(rec)
        except ValueError as exc:
            rejected.append(LakeRejected(entry.shard, entry.id, str(exc)))
            continue
        ceiling = _ceiling(entry.id)
        date = rec.ts[:10] if pg_rows.SANE_FROM <= rec.ts <= ceiling else pg_rows.entry_time(entry.id)[:10]
        run_groups.setdefault(date, []).append(values)
    if records:
        first, last = records[0], records[-1]
        for date, rows in sorted(run_groups.items()):
            table = pa.Table.from_pylist(rows, schema=RUN_SCHEMA)
            objects.append(LakeObject(runs_object_key(date, first.shard, first.id, last.id), _write(table), len(rows)))
    return LakeSegment(objects, rejected)


def decode_event_rows(data: bytes) -> list[dict[str, Any]]:
    """The rows of an `events/` object (column name -> value). SegmentError if it is not one."""
    return _decode_rows(data, EVENT_SCHEMA)


def decode_run_rows(data: bytes) -> list[dict[str, Any]]:
    """The rows of a `runs/` object (column name -> value). SegmentError if it is not one."""
    return _decode_rows(data, RUN_SCHEMA)


def _decode_rows(data: bytes, schema: pa.Schema) -> list[dict[str, Any]]:
    table = _read(data)
    missing = set(schema.names) - set(table.column_names)
    if missing:
        raise SegmentError(f"not an event-lake object (no column {sorted(missing)[0]})")
    rows: list[dict[str, Any]] = table.select(schema.names).to_pylist()
    return rows


def entries_size(entries: Iterable[ArchivedEntry]) -> int:
    """The bytes of field names and values: what the size cut of a segment counts."""
    return sum(len(k) + len(v) for e in entries for k, v in e.fields.items())


__all__ = [
    "ArchivedEntry", "LakeObject", "LakeRejected", "LakeSegment", "RawSegmentKey", "SegmentError", "TopicEntry",
    "decode_event_rows", "decode_raw_segment", "decode_run_rows", "encode_event_rows", "encode_raw_segment",
    "parse_lake_key", "parse_raw_segment_key", "raw_segment_key", "raw_shard_prefix",
]  # fmt: skip
