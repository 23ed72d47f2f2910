"""The archive's format (services/archive/segments.py): raw segments round-trip byte-exact, object
names follow from the first id only and sort like the ids, the event lake has the PostgreSQL sink's
columns, and a damaged object is refused with SegmentError (never taken as a segment)."""

from __future__ import annotations

import gc
import io
from datetime import UTC, datetime

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.archive import segments as sg

_field_names = st.binary(min_size=1, max_size=12)
_fields = st.dictionaries(_field_names, st.binary(max_size=64), min_size=1, max_size=8)
_ids = st.tuples(st.integers(0, 2**48), st.integers(0, 2**64 - 1)).map(lambda t: f"{t[0]}-{t[1]}")
_entries = st.lists(
    st.builds(sg.ArchivedEntry, shard=st.integers(0, 999), stream=st.sampled_from(sg.STREAM_KINDS), id=_ids, fields=_fields),
    min_size=1, max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(_entries)
def test_raw_segment_round_trips_arbitrary_bytes(entries: list[sg.ArchivedEntry]) -> None:
    decoded = sg.decode_raw_segment(sg.encode_raw_segment(entries))
    assert decoded == entries
    for got, want in zip(decoded, entries, strict=True):
        assert list(got.fields.items()) == list(want.fields.items())  # Redis order, not just equal dicts


def _reference_encode(entries: list[sg.ArchivedEntry]) -> bytes:
    """The path raw_table replaced: one Python dict per field, the rows through Arrow's generic
    from_pylist, default Parquet options. Kept here only as the reference the fast path must equal."""
    rows = []
    for e in entries:
        f = e.fields
        ms, _, seq = e.id.partition("-")
        number = sg._int_or_none(f.get(b"seq"))
        rows.append({"shard": e.shard, "stream": e.stream, "id": e.id, "id_ms": int(ms), "id_seq": int(seq or 0),
                     "run": sg._text(f.get(b"run")), "seq": number, "kind": sg._text(f.get(b"kind")),
                     "ts": sg._text(f.get(b"ts")), "line": f.get(b"line"),
                     "fields": [{"name": k, "value": v} for k, v in f.items()]})
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=sg.RAW_SCHEMA), sink, compression="zstd")
    return sink.getvalue()


def _reference_decode(data: bytes) -> list[sg.ArchivedEntry]:
    """Arrow's generic to_pylist of the whole table, a struct per field (the path decode replaced)."""
    return [sg.ArchivedEntry(r["shard"], r["stream"], r["id"], {p["name"]: p["value"] for p in r["fields"]})
            for r in pq.read_table(io.BytesIO(data)).to_pylist()]


@settings(max_examples=100, deadline=None)
@given(_entries)
def test_flat_array_paths_equal_the_dict_per_field_reference(entries: list[sg.ArchivedEntry]) -> None:
    """Both directions against the reference: the fast decoder reads what the old encoder wrote (an
    archive written before the change), the reference decoder reads what the fast encoder writes (any
    other Parquet reader), and every column of the two files is equal, not only `fields`."""
    fast, old = sg.encode_raw_segment(entries), _reference_encode(entries)
    assert sg.decode_raw_segment(old) == _reference_decode(fast) == entries
    assert pq.read_table(io.BytesIO(fast)).equals(pq.read_table(io.BytesIO(old)))
    assert pq.read_schema(io.BytesIO(fast)).metadata == pq.read_schema(io.BytesIO(old)).metadata


def test_decode_leaves_the_cyclic_collector_as_it_was() -> None:
    """decode_raw_segment pauses the collector while it builds the entries (docstring): it must
    restore it, enabled or disabled, also when the object is refused."""
    data = sg.encode_raw_segment([sg.ArchivedEntry(0, "raw", "1-0", {b"a": b"b"})])
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert sg.decode_raw_segment(data)[0].fields == {b"a": b"b"}
            assert gc.isenabled() is enabled
            with pytest.raises(sg.SegmentError):
                sg.decode_raw_segment(data[: len(data) // 2])
            assert gc.isenabled() is enabled
            with pytest.raises(RuntimeError), sg._no_cyclic_gc():  # an error while the entries are built
                assert not gc.isenabled()
                raise RuntimeError("boom")
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_raw_convenience_columns_and_duckdb(tmp_path) -> None:
    entries = [
        sg.ArchivedEntry(1, "raw", "1764756000000-0", {b"run": b"r1", b"seq": b"7", b"kind": b"line", b"ts": b"1764756000000",
                                                       b"stream": b"stdout", b"line": b"{\"a\":1}\xff"}),
        sg.ArchivedEntry(1, "raw", "1764756000000-1", {b"run": b"r1", b"seq": b"not-a-number", b"kind": b"eof"}),
    ]
    data = sg.encode_raw_segment(entries)
    assert pq.read_metadata(io.BytesIO(data)).row_group(0).column(0).compression == "ZSTD"
    (tmp_path / "seg.parquet").write_bytes(data)
    rows = duckdb.sql(f"SELECT shard, stream, id, id_ms, id_seq, run, seq, kind, line, len(fields) FROM '{tmp_path}/seg.parquet'").fetchall()
    assert rows == [
        (1, "raw", "1764756000000-0", 1764756000000, 0, "r1", 7, "line", b"{\"a\":1}\xff", 6),
        (1, "raw", "1764756000000-1", 1764756000000, 1, "r1", None, "eof", None, 3),
    ]


def test_convenience_columns_survive_odd_values() -> None:
    """Invalid UTF-8 in a text field is replaced there (the `fields` column keeps the bytes); a seq
    that is not a number, or beyond int64, is null."""
    entries = [
        sg.ArchivedEntry(0, "raw", "5-0", {b"run": b"r\xff", b"seq": b"99999999999999999999999", b"ts": b"\xc3("}),
        sg.ArchivedEntry(0, "raw", "5-1", {b"run": b"ok", b"seq": b"12"}),
    ]
    table = pq.read_table(io.BytesIO(sg.encode_raw_segment(entries)))
    assert table.column("run").to_pylist() == ["r\ufffd", "ok"]
    assert table.column("seq").to_pylist() == [None, 12]
    assert table.column("ts").to_pylist() == ["\ufffd(", None]
    assert sg.decode_raw_segment(sg.encode_raw_segment(entries)) == entries


def test_raw_key_follows_from_first_and_last_id_and_sorts() -> None:
    key = sg.raw_segment_key("control", 3, "1764756000000-5", "1764756000002-1")
    assert key == ("raw/date=2025-12-03/shard=003/control-00000001764756000000-00000000000000000005"
                   "-00000001764756000002-00000000000000000001.parquet")
    assert sg.parse_raw_segment_key(key) == sg.RawSegmentKey("2025-12-03", 3, "control", "1764756000000-5",
                                                             "1764756000002-1")
    ids = ["1764756000000-9", "1764756000000-10", "1764756000001-0", "1764756000000-0"]
    keys = [sg.raw_segment_key("raw", 0, i, i) for i in ids]
    assert [sg.parse_raw_segment_key(k).first_id for k in sorted(keys)] == sorted(ids, key=sg.id_parts)


def test_raw_names_from_before_issue_32_still_parse() -> None:
    key = "raw/date=2025-12-03/shard=003/control-00000001764756000000-00000000000000000005.parquet"
    assert sg.parse_raw_segment_key(key) == sg.RawSegmentKey("2025-12-03", 3, "control", "1764756000000-5", None)
    lake = "events/date=2025-12-03/type=read/part-001-00000001764756000000-00000000000000000005.parquet"
    assert sg.parse_lake_key(lake).last_id is None
    assert sg.parse_lake_key(sg.events_object_key("2025-12-03", "read", 1, "5-0", "9-1")).last_id == "9-1"


@pytest.mark.parametrize("bad", ["", "x", "raw/date=2025-12-03/shard=003/raw-1-2.parquet", "events/date=2025-12-03/part-000-1-1.parquet"])
def test_parse_raw_key_refuses_other_names(bad: str) -> None:
    with pytest.raises(ValueError):
        sg.parse_raw_segment_key(bad)


@pytest.mark.parametrize("kind,first", [("tap", "1-0"), ("raw", "nope"), ("raw", "1-x")])
def test_raw_key_refuses_bad_input(kind: str, first: str) -> None:
    with pytest.raises(ValueError):
        sg.raw_segment_key(kind, 0, first, "2-0")


def test_encode_refuses_empty_and_bad_ids() -> None:
    with pytest.raises(ValueError):
        sg.encode_raw_segment([])
    with pytest.raises(ValueError):
        sg.encode_raw_segment([sg.ArchivedEntry(0, "raw", "12", {b"a": b"b"}), sg.ArchivedEntry(0, "raw", "bad", {b"a": b"b"})])


@pytest.mark.parametrize("damage", [
    lambda d: d[: len(d) // 2],  # a half-written object
    lambda d: b"",
    lambda d: b"PAR1" + b"\x00" * 64 + b"PAR1",
    lambda d: d[:100] + bytes(200) + d[300:],
])
def test_damaged_segment_is_refused(damage) -> None:
    data = sg.encode_raw_segment([sg.ArchivedEntry(0, "raw", f"{i}-0", {b"line": b"x" * 50}) for i in range(1, 50)])
    with pytest.raises(sg.SegmentError):
        sg.decode_raw_segment(damage(data))


def test_another_parquet_file_is_not_a_raw_segment() -> None:
    lake = sg.encode_event_rows([_event(0, "1764756000000-0", "r", 0)], [])
    with pytest.raises(sg.SegmentError, match="no column"):
        sg.decode_raw_segment(lake.objects[0].data)


# ------------------------------------------------------------------------------------ event lake


def _event(shard: int, entry_id: str, run: str, seq: int, ts: str = "2025-12-03T10:00:00.000Z", **extra) -> sg.TopicEntry:
    doc = {"eventId": f"{run}:{seq}", "runId": run, "seq": seq, "type": "agent", "timestamp": ts, **extra}
    return sg.TopicEntry(shard, entry_id, {b"eventId": doc["eventId"].encode(), b"runId": run.encode(),
                                            b"type": str(doc["type"]).encode(), b"data": orjson.dumps(doc)})


def _record(shard: int, entry_id: str, run: str, k: int, state: str, ts: str = "2025-12-03T10:00:00.000Z", **extra) -> sg.TopicEntry:
    doc = {"recordId": f"{run}:run:{k}", "runId": run, "state": state, "timestamp": ts, "seq": k, "counts": {"agent": 2}, **extra}
    return sg.TopicEntry(shard, entry_id, {b"recordId": doc["recordId"].encode(), b"runId": run.encode(), b"data": orjson.dumps(doc)})


def test_event_lake_columns_match_the_sink() -> None:
    events = [
        _event(2, "1764756000000-0", "r", 0, type="command", tool="shell", toolCallId="c1", isSuccess=False, exitCode=3,
               command="ls", durationMs=12, errorClass="nonzero-exit"),
        _event(2, "1764756000000-1", "r", 1, type="agent", ts="2025-12-04T00:00:00.001Z", path=["a"], code=5),
        _event(2, "1764756000000-2", "r", 2, type="agent", exitCode=1.5),  # the server's cast refuses it too
        sg.TopicEntry(2, "1764756000000-3", {b"eventId": b"x"}),
    ]
    records = [_record(2, "1764756000001-0", "r", 1, "ended", host="h", agent="goose", exitCode=0, inputTokens=5, costUsd=1)]
    seg = sg.encode_event_rows(events, records)
    keys = [o.key for o in seg.objects]
    assert keys == [
        "events/date=2025-12-03/type=command/part-002-00000001764756000000-00000000000000000000"
        "-00000001764756000000-00000000000000000003.parquet",
        "events/date=2025-12-04/type=agent/part-002-00000001764756000000-00000000000000000000"
        "-00000001764756000000-00000000000000000003.parquet",
        "runs/date=2025-12-03/part-002-00000001764756000001-00000000000000000000"
        "-00000001764756000001-00000000000000000000.parquet",
    ]
    assert [(r.id, r.reason.split(" ")[0]) for r in seg.rejected] == [("1764756000000-2", "exitCode"), ("1764756000000-3", "missing")]
    shell = sg.decode_event_rows(seg.objects[0].data)[0]
    assert {k: v for k, v in shell.items() if k != "data"} == {
        "ts": datetime(2025, 12, 3, 10, tzinfo=UTC), "event_id": "r:0", "run_key": "r", "seq": 0, "type": "command",
        "tool": "shell", "tool_call_id": "c1", "success": False, "exit_code": 3, "path": None, "command": "ls",
        "duration_ms": 12, "code": None, "error_class": "nonzero-exit",
    }
    agent = sg.decode_event_rows(seg.objects[1].data)[0]
    assert (agent["path"], agent["code"]) == ('["a"]', "5")  # ->> gives a non-string value's JSON text
    run = sg.decode_run_rows(seg.objects[2].data)[0]
    assert (run["record_id"], run["k"], run["host"], run["exit_code"], run["input_tokens"], run["cost_usd"]) == ("r:run:1", 1, "h", 0, 5, 1.0)
    assert sg.parse_lake_key(keys[0]) == sg.LakeKey("events", "2025-12-03", "command", 2, "1764756000000-0", "1764756000000-3")
    assert sg.parse_lake_key(keys[2]) == sg.LakeKey("runs", "2025-12-03", None, 2, "1764756000001-0", "1764756000001-0")


def test_event_with_insane_time_is_filed_under_its_entry_time() -> None:
    seg = sg.encode_event_rows([_event(0, "1764756000000-0", "r", 0, ts="9999-01-01T00:00:00.000Z")], [])
    assert seg.objects[0].key.startswith("events/date=2025-12-03/")
    assert sg.decode_event_rows(seg.objects[0].data)[0]["ts"] == datetime(2025, 12, 3, 10, tzinfo=UTC)


def test_lake_names_follow_from_the_first_and_last_id() -> None:
    """Objects are created, never replaced (issue 32): the same entries give the same names (the
    second create finds the first one: the same rows), a superset gives names of its own (an overlap
    the readers dedupe by event and record id, never a replacement of the first by fewer rows)."""
    first = [_event(0, "1764756000000-0", "r", 0, type="command"), _event(0, "1764756000000-1", "r", 1)]
    again = first + [_event(0, "1764756000000-2", "r", 2, type="read", ts="2025-12-04T01:00:00.000Z")]
    before = {o.key for o in sg.encode_event_rows(first, []).objects}
    assert before == {o.key for o in sg.encode_event_rows(list(first), []).objects}
    after = {o.key for o in sg.encode_event_rows(again, []).objects}
    assert not before & after


def test_segment_written_row_group_by_row_group_decodes_the_same() -> None:
    """RawSegmentWriter (the building block for holding compressed bytes instead of entries,
    docs/archive.md "Memory"): the same entries, in the same order, as encode_raw_segment."""
    entries = [sg.ArchivedEntry(1, "raw", f"{1764756000000 + i}-0", {b"run": b"r", b"seq": str(i).encode(), b"line": bytes([i % 256]) * 9})
               for i in range(250)]
    writer = sg.RawSegmentWriter()
    for lo in range(0, 250, 100):
        writer.add(entries[lo:lo + 100])
    data = writer.finish()
    assert sg.decode_raw_segment(data) == sg.decode_raw_segment(sg.encode_raw_segment(entries)) == entries
    assert pq.read_metadata(io.BytesIO(data)).num_row_groups == 3
    with pytest.raises(ValueError):
        sg.RawSegmentWriter().finish()
