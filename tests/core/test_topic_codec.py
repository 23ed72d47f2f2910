"""The topic-entry codec (contracts/topics.py): what the worker writes is what every reader decodes.

Property tests: any complete entry survives to_fields -> from_fields; the worker's encoder
(`event_fields`/`record_fields`, the tuple commit.lua appends) decodes to the same entry as
`TopicEntry.of_event`/`of_record`; arbitrary field maps never make the decoder raise. Plus the one
round trip through a real Redis stream, where bytes come back as Redis stores them.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.topics import (
    EVENT,
    EVENT_FIELDS,
    RECORD,
    RECORD_FIELDS,
    TopicEntry,
    TopicEntryError,
    event_fields,
    record_fields,
)

TEXT = st.text(min_size=1, max_size=40)
SEQ = st.integers(min_value=0, max_value=2**53)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def _pairs(flat: tuple) -> dict[bytes, bytes]:
    """A flat (name, value, ...) tuple as Redis gives it back: every value bytes."""
    it = iter(flat)
    return {name: value if isinstance(value, bytes) else str(value).encode() for name, value in zip(it, it, strict=True)}


@st.composite
def events(draw: st.DrawFn) -> dict:
    run, seq = draw(TEXT), draw(SEQ)
    extra = draw(st.dictionaries(st.sampled_from(["tool", "text", "lines", "x"]), JSON_VALUE, max_size=3))
    return {**extra, "eventId": f"{run}:{seq}", "runId": run, "seq": seq, "type": draw(TEXT),
            "timestamp": "2026-12-03T10:00:00.000Z"}


@st.composite
def records(draw: st.DrawFn) -> dict:
    run, k = draw(TEXT), draw(SEQ)
    return {"recordId": f"{run}:run:{k}", "runId": run, "seq": k, "state": draw(TEXT), "counts": {}}


@st.composite
def entries(draw: st.DrawFn) -> TopicEntry:
    kind = draw(st.sampled_from([EVENT, RECORD]))
    return TopicEntry(kind, draw(TEXT), draw(TEXT), draw(SEQ), draw(TEXT), draw(st.binary(max_size=60)))


@settings(max_examples=300, deadline=None)
@given(entries())
def test_a_complete_entry_round_trips(entry: TopicEntry) -> None:
    fields = entry.to_fields()
    assert tuple(fields) == (EVENT_FIELDS if entry.kind == EVENT else RECORD_FIELDS)
    assert TopicEntry.from_fields(fields, entry.kind) == entry
    assert TopicEntry.from_fields(fields) == entry  # the kind is told by the id field
    assert TopicEntry.from_fields({k.decode(): v for k, v in fields.items()}, entry.kind) == entry  # str keys


@settings(max_examples=200, deadline=None)
@given(events())
def test_the_workers_event_encoding_decodes_to_the_event(event: dict) -> None:
    decoded = TopicEntry.from_fields(_pairs(event_fields(event)), EVENT)
    assert decoded == TopicEntry.of_event(event)
    assert decoded.complete and decoded.document() == event
    assert decoded.to_fields() == _pairs(event_fields(event))


@settings(max_examples=200, deadline=None)
@given(records())
def test_the_workers_record_encoding_decodes_to_the_record(record: dict) -> None:
    decoded = TopicEntry.from_fields(_pairs(record_fields(record)), RECORD)
    assert decoded == TopicEntry.of_record(record)
    assert decoded.document() == record
    assert decoded.to_fields() == _pairs(record_fields(record))


FIELD_NAMES = st.sampled_from([b"eventId", b"recordId", b"runId", b"seq", b"type", b"state", b"data", b"junk"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELD_NAMES, st.binary(max_size=30), max_size=8), st.sampled_from([EVENT, RECORD, None]))
def test_the_decoder_never_raises_and_document_says_why(fields: dict[bytes, bytes], kind) -> None:
    entry = TopicEntry.from_fields(fields, kind)
    if entry.seq is not None:
        assert 0 <= entry.seq <= 2**53 and fields[b"seq"].isdigit()
    try:
        doc = entry.document()
    except TopicEntryError as exc:
        assert str(exc).startswith(("missing field data", "data is not JSON", "data is not a JSON object"))
    else:
        assert isinstance(doc, dict)


@pytest.mark.parametrize("seq, expected", [(b"7", 7), (b"-1", None), ("²".encode(), None), (b"9" * 17, None),
                                           (str(2**53 + 1).encode(), None), (b"\xff", None), (b"", None)])
def test_seq_is_a_non_negative_json_safe_integer_or_none(seq: bytes, expected) -> None:
    assert TopicEntry.from_fields({b"eventId": b"r:7", b"seq": seq, b"data": b"{}"}).seq == expected


def test_undecodable_envelope_fields_read_none_and_incomplete_entries_cannot_be_written() -> None:
    entry = TopicEntry.from_fields({b"eventId": b"\xff\xfe", b"runId": b"r", b"data": b"[1]"}, EVENT)
    assert (entry.id, entry.run, entry.seq, entry.label) == (None, "r", None, None)
    assert not entry.complete
    with pytest.raises(TopicEntryError, match="incomplete event entry"):
        entry.to_fields()
    with pytest.raises(TopicEntryError, match="not a JSON object"):
        entry.document()
    with pytest.raises(TopicEntryError, match="missing field data"):
        TopicEntry.from_fields({b"recordId": b"r:run:0"}).document()


def test_an_entry_survives_a_real_redis_stream(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    stream = "test:topic-codec"
    client.delete(stream)
    event = {"eventId": "team/r:3", "runId": "team/r", "seq": 3, "type": "command", "command": "ls\t-l ✓",
             "timestamp": "2026-12-03T10:00:00.000Z"}
    record = {"recordId": "team/r:run:0", "runId": "team/r", "seq": 0, "state": "started", "counts": {"command": 1}}
    client.xadd(stream, _pairs(event_fields(event)))
    client.xadd(stream, TopicEntry.of_record(record).to_fields())
    (_, ev_fields), (_, rec_fields) = client.xrange(stream)
    assert TopicEntry.from_fields(ev_fields).document() == event
    got = TopicEntry.from_fields(rec_fields)
    assert got.kind == RECORD and got.label == "started" and orjson.loads(got.data or b"") == record
    client.delete(stream)


def test_tail_skips_an_entry_it_cannot_decode_with_one_line_and_prints_the_rest(settings) -> None:
    """`tail` decodes with the codec: a malformed entry (not what a worker writes) is skipped with a
    line on stderr instead of a traceback, and what follows it is printed."""
    import subprocess
    import sys

    import redis

    from tests.support.fixtures import REPO
    from tests.support.redis_server import cli_env

    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.events_partitions()[0]
    good = {"eventId": "t/1:0", "runId": "t/1", "seq": 0, "type": "agent", "timestamp": "2026-12-03T10:00:00.000Z",
            "lines": [0, 0], "message": "after the junk"}
    bad_id = r.xadd(stream, {"eventId": "t/1:x", "runId": "t/1", "data": b"{truncated"}).decode()
    r.xadd(stream, TopicEntry.of_event(good).to_fields())
    out = subprocess.run([sys.executable, "-m", "services.cli", "tail", "--from-start", "--no-follow", "--no-runs",
                          "--json"], cwd=REPO, env=cli_env(settings), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [orjson.loads(line) for line in out.stdout.splitlines()] == [good]
    assert f"skipped {stream} {bad_id}: data is not JSON" in out.stderr and "Traceback" not in out.stderr
