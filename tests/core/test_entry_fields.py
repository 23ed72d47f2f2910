"""Raw entry fields: one encoder (`Entry.to_fields`) beside the one decoder (`Entry.from_fields`),
a round trip, and a decoder that is total: any field map gives an Entry or an EntryError."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.raw import INVALID_ENTRY, OVERSIZE
from services.sequencer import Entry, EntryError, Rejected, parse_batch, parse_fields
from services.sequencer.entries import MAX_SEQ
from tests.support.pipeline import REPO

RUN = st.from_regex(r"[A-Za-z0-9._:/@-]{1,40}", fullmatch=True)
LABEL = st.none() | st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)
FORMAT = st.none() | st.sampled_from(["goose", "claude-code", "codex", "gemini-cli", "opencode", "aider 0.9"])
SEQ = st.integers(0, MAX_SEQ)
TS = st.integers(0, 253402300799999)


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    kind = draw(st.sampled_from(["line", "eof", "abandon"]))
    common = dict(run=draw(RUN), seq=draw(SEQ), ts=draw(TS), sid="1-0", host=draw(LABEL), agent=draw(LABEL))
    if kind == "abandon":
        through = draw(st.integers(-1, 10_000))
        cuts = sorted(draw(st.sets(st.integers(0, max(through, 0)), max_size=6)))
        missing = tuple((a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if through >= 0)
        return Entry.of_abandon(common.pop("run"), common.pop("seq"), common.pop("ts"), through, missing, **common)
    labels = dict(parent=draw(st.none() | RUN), continues=draw(st.none() | RUN), format=draw(FORMAT))
    if kind == "eof":
        return Entry.of_eof(common.pop("run"), common.pop("seq"), common.pop("ts"),
                            draw(st.none() | st.integers(-(2**31), 2**31 - 1)), **common, **labels,
                            signal=draw(st.none() | st.integers(1, 127)))
    return Entry.of_line(common.pop("run"), common.pop("seq"), common.pop("ts"),
                         draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)),
                         stream=draw(st.sampled_from(["stdout", "stderr"])), **common, **labels)


def _normal(e: Entry) -> Entry:
    # Empty labels are not written (an empty label is no label).
    return e._replace(host=e.host or None, agent=e.agent or None, format=e.format or None)


@settings(max_examples=300, deadline=None)
@given(entries())
def test_to_fields_then_from_fields_gives_the_entry_back(entry):
    control = entry.kind == "abandon"
    assert parse_fields(entry.to_fields(), "1-0", control=control) == _normal(entry)
    assert Entry.from_fields(entry.to_fields(), "1-0", control=control) == _normal(entry)


FIELD_NAMES = [b"run", b"seq", b"ts", b"kind", b"stream", b"line", b"exit", b"signal", b"host", b"agent", b"format",
               b"parent", b"continues", b"through", b"missing", b"x"]
POISON_VALUES = [b"--5", b"-", b"+5", b"5" * 5000, "²".encode(), b"10" + b"0" * 30, b"1e3", b"\xff\xfe", b"",
                 b" 7 ", b"[[1,2]]", b"[" * 300 + b"]" * 300, b"[[5,1]]", b"[[0,9007199254740993]]",
                 b"abandon", b"eof", b"line", b"stderr", b"9" * 19, b"-" + b"9" * 19, b"NaN", b"{}", b"null"]


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELD_NAMES), st.sampled_from(POISON_VALUES) | st.binary(max_size=40),
                       max_size=10),
       st.booleans())
def test_any_field_map_parses_or_raises_entry_error(fields, control):
    fields.setdefault(b"run", b"r/1")
    try:
        entry = parse_fields(fields, "1700000000000-0", control=control)
    except EntryError as exc:
        assert str(exc)
        return
    assert 0 <= entry.seq <= MAX_SEQ
    assert entry.kind == ("abandon" if control else entry.kind) and (control or entry.kind != "abandon")
    orjson.dumps(entry.to_list())  # the entry can be held in a run state


@pytest.mark.parametrize("fields, reason", [
    ({b"seq": b"--5"}, "'seq' is not an integer"),
    ({b"seq": b"5" * 5000}, "'seq' is not an integer"),
    ({b"seq": b"9" * 19}, "'seq' is too large"),
    ({b"ts": "²".encode()}, "'ts'"),
    ({b"ts": b"--5"}, "'ts'"),
    ({b"ts": b"9" * 5000}, "'ts'"),
    ({b"kind": b"eof", b"exit": b"1" + b"0" * 30}, "'exit'"),
    ({b"kind": b"eof", b"exit": b"4294967296"}, "'exit' is out of range"),
    ({b"format": b"x" * 65}, "'format'"),
    ({b"format": b"go\x00ose"}, "'format'"),
])
def test_poison_fields_are_entry_errors_with_a_reason_and_keep_run_and_seq(fields, reason):
    base = {b"run": b"r/1", b"seq": b"3", b"ts": b"1", b"line": b"x"}
    with pytest.raises(EntryError) as info:
        parse_fields({**base, **fields}, "1-0")
    assert reason in str(info.value)
    if b"seq" not in fields:  # seq was valid: the run can report it missing
        assert (info.value.run, info.value.seq) == ("r/1", 3)


@pytest.mark.parametrize("fields, reason", [
    ({b"through": b"9" * 19}, "'through' is out of range"),
    ({b"through": b"-2"}, "'through' is out of range"),
    ({b"missing": b"[" * 600 + b"]" * 600}, "'missing'"),
    ({b"missing": b"[[3,1]]"}, "'missing'"),
    ({b"missing": b"[[0,11]]"}, "'missing'"),
    ({b"missing": b"[[0,1],[1,2]]"}, "'missing'"),
    ({b"missing": b"[[0.5,1]]"}, "'missing'"),
    ({b"missing": b"[[0,1]]" + b" " * 3_000_000}, "'missing'"),
    ({b"missing": orjson.dumps([[i, i] for i in range(0, 400_000, 2)]), b"through": b"1000000"}, "'missing'"),
])
def test_absurd_abandon_markers_are_entry_errors(fields, reason):
    base = {b"run": b"r/1", b"seq": b"10", b"ts": b"1", b"kind": b"abandon", b"through": b"10", b"missing": b"[]"}
    with pytest.raises(EntryError, match=reason):
        parse_fields({**base, **fields}, "1-0", control=True)


def test_kind_abandon_is_only_valid_on_the_control_stream_and_only_it_is():
    marker = {b"run": b"r/1", b"seq": b"1", b"ts": b"1", b"kind": b"abandon", b"through": b"1", b"missing": b"[]"}
    with pytest.raises(EntryError, match="raw stream") as info:
        parse_fields(marker, "1-0")
    assert info.value.run is None  # a forgery does not even mark the victim's seq lost
    assert parse_fields(marker, "1-0", control=True).through == 1
    with pytest.raises(EntryError, match="control stream"):
        parse_fields({b"run": b"r/1", b"seq": b"1", b"line": b"x"}, "1-0", control=True)


def test_the_format_label_is_parsed_carried_and_encoded():
    fields = {b"run": b"r/1", b"seq": b"0", b"ts": b"1", b"line": b"x", b"format": b"claude-code"}
    entry = parse_fields(fields, "1-0")
    assert entry.format == "claude-code" and entry.to_fields()[b"format"] == b"claude-code"
    assert parse_fields({**fields, b"format": b"my-agent 2"}, "1-0").format == "my-agent 2"  # kept, reported later


def _as_json(fields: dict[bytes, bytes]) -> dict[str, object]:
    """A stream entry's fields as the JSON object the raw-entry schema describes (typed values)."""
    out: dict[str, object] = {}
    for name, value in fields.items():
        key, text = name.decode(), value.decode("utf-8", "surrogatepass")
        if key in ("seq", "ts", "exit", "signal", "through"):
            out[key] = int(text)
        elif key == "missing":
            out[key] = orjson.loads(value)
        else:
            out[key] = text
    return out


@settings(max_examples=200, deadline=None)
@given(entries())
def test_the_published_raw_entry_schema_accepts_what_the_system_writes(entry):
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(REPO) / "contracts" / "schemas" / "raw-entry.schema.json").read_text())
    jsonschema.validate(_as_json(entry.to_fields()), schema)


LABEL_BYTES = st.none() | st.binary(max_size=12) | st.sampled_from(
    [b"", b"goose", b"codex", b"h\xff", b"run/a-1", b"bad run", b"x" * 70, "caf\u00e9".encode()])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(LABEL_BYTES, LABEL_BYTES, LABEL_BYTES, LABEL_BYTES, LABEL_BYTES), min_size=1, max_size=6))
def test_memoized_labels_equal_the_reference_decoding(raws):
    """The label memo (`labels_of`) gives what `decode_labels` gives, or the same EntryError,
    also when the same labels come again (from the memo) and for labels that failed before."""
    from services.sequencer.entries import decode_labels, labels_of

    for raw in raws + raws:
        fields = {name: value for name, value in zip((b"host", b"agent", b"format", b"parent", b"continues"), raw,
                                                     strict=True) if value is not None}
        try:
            want: object = decode_labels(raw)
        except EntryError as exc:
            want = ("error", str(exc))
        try:
            got: object = labels_of(fields)
        except EntryError as exc:
            got = ("error", str(exc))
        assert got == want


def _one_by_one(sids, fields, max_bytes):
    """What `parse_batch` must give: the size cap, then `parse_fields`, entry by entry."""
    out = []
    for sid, fmap in zip(sids, fields, strict=True):
        size = sum(map(len, fmap.values())) + sum(map(len, fmap))
        if size > max_bytes:
            out.append(Rejected(OVERSIZE, f"{size} bytes > {max_bytes}"))
            continue
        try:
            out.append(parse_fields(fmap, sid))
        except EntryError as exc:
            known = exc.run is not None and exc.seq is not None
            out.append(Rejected(INVALID_ENTRY, str(exc), exc.run if known else None, exc.seq if known else None))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(FIELD_NAMES), st.sampled_from(POISON_VALUES) | st.binary(max_size=40),
                                max_size=10) | entries().map(lambda e: e.to_fields()), max_size=20),
       st.sampled_from([10, 200, 1_000_000]))
def test_a_batch_parses_as_its_entries_one_by_one(fields, max_bytes):
    sids = [f"1700000000000-{i}" for i in range(len(fields))]
    assert parse_batch(sids, fields, max_bytes) == _one_by_one(sids, fields, max_bytes)


def test_a_batch_with_values_of_the_wrong_type_rejects_them_and_keeps_the_rest():
    good = {b"run": b"r/1", b"seq": b"0", b"line": b"x"}
    got = parse_batch(["1-0", "1-1", "1-2"], [good, {b"run": 5, b"seq": None}, good], 1000)
    assert got[0] == parse_fields(good, "1-0") and got[2] == parse_fields(good, "1-2")
    assert type(got[1]) is Rejected and got[1].reason == INVALID_ENTRY and got[1].detail.startswith(("unparseable", "'"))
