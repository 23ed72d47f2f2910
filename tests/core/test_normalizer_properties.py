"""Property tests of the normaliser: it never raises, resumes exactly, and honours the contract."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.events import harness_event_adapter
from services.normalizer import Limits, RunNormalizer
from tests.support.fixtures import TRANSCRIPTS, transcript_lines

ALL_LINES = [line for path in TRANSCRIPTS for line in transcript_lines(path)]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
ids = st.sampled_from(["", "m1", "m2", "call_1", "call_2"]) | st.none() | st.integers(0, 9)
names = st.sampled_from(
    ["shell", "read", "Write", "edit", "text_editor", "developer__shell", "grep", "glob", "tree", "list",
     "load_skill", "skill", "todo__todo_write", "github__x", "a__b__c", "read_image"]
) | st.text(max_size=10)
args = st.fixed_dictionaries(
    {},
    optional={
        "path": st.sampled_from(["/a//b/../c/", "rel/./x", "", "/"]) | json_values,
        "command": st.sampled_from(["cat a b", "ls -la", "sed -n 1,5p f", "rg foo src", "npm test", "view", "undo_edit"]) | json_values,
        "offset": st.integers(-2, 5) | json_values,
        "limit": st.integers(-2, 5),
        "pattern": st.text(max_size=5),
        "name": st.text(max_size=5),
        "dir": st.text(max_size=5),
    },
)
blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10) | json_values}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=10)}),
    st.fixed_dictionaries({"type": st.just("redactedThinking"), "data": st.text(max_size=5)}),
    st.fixed_dictionaries(
        {"type": st.just("toolRequest"), "id": ids,
         "toolCall": st.fixed_dictionaries({"status": st.sampled_from(["success", "error"]),
                                            "value": st.fixed_dictionaries({"name": names, "arguments": args | json_values})})}
    ),
    st.fixed_dictionaries(
        {"type": st.just("toolResponse"), "id": ids,
         "toolResult": st.fixed_dictionaries(
             {"status": st.sampled_from(["success", "error", "weird"]) | json_values,
              "value": st.fixed_dictionaries({}, optional={"isError": st.booleans() | json_values,
                                                           "structuredContent": st.fixed_dictionaries({"exit_code": st.integers(-1, 3) | json_values})}) | json_values})}
    ),
    json_values,
)
records = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("message"),
         "message": st.fixed_dictionaries({"id": ids, "role": st.sampled_from(["assistant", "user"]) | json_values,
                                           "content": st.lists(blocks, max_size=4) | json_values})},
        optional={"id": ids},
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["error", "complete", "notification", "model_change"])},
                          optional={"error": json_values, "message": json_values, "total_tokens": json_values,
                                    "cost_usd": json_values}),
    json_values,
)
lines = st.one_of(
    records.map(lambda r: orjson.dumps(r).decode()),
    st.binary(max_size=60).map(lambda b: b.decode("utf-8", "replace")),
    st.sampled_from(ALL_LINES),
)
streams = st.sampled_from(["stdout", "stdout", "stdout", "stderr"])
runs = st.lists(st.tuples(lines, streams), max_size=40)
small = Limits(max_span_chars=24, max_pending_tools=3, max_pending_tool_bytes=600)


def _feed(norm: RunNormalizer, items, start: int = 0) -> list[dict]:
    out = []
    for i, (line, stream) in enumerate(items, start):
        out.extend(norm.line(i, 1_790_000_000_000 + i, line, stream))
    return out


def _assert_contract(events: list[dict]) -> None:
    for n, event in enumerate(events):
        assert event["seq"] == n and event["eventId"] == f"r:{n}"
        assert all(value is not None for value in event.values()), event
        harness_event_adapter.validate_python(event)
        assert orjson.loads(orjson.dumps(event)) == event


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(runs, st.sampled_from([Limits(), small]), st.none() | st.integers(-3, 3))
def test_arbitrary_input_never_raises_and_events_honour_the_contract(items, limits, exit_code):
    norm = RunNormalizer("r", limits)
    events = _feed(norm, items)
    events += norm.end(len(items), 1_790_000_000_000 + len(items), exit_code)
    _assert_contract(events)
    assert norm.span is None and norm.pending == []


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(runs, st.sets(st.integers(0, 40)), st.sampled_from([Limits(), small]))
def test_cutting_a_run_and_resuming_from_bytes_gives_the_same_events(items, cuts, limits):
    one_pass = RunNormalizer("r", limits)
    expected = _feed(one_pass, items) + one_pass.end(len(items), 7)

    pieces: list[dict] = []
    norm = RunNormalizer("r", limits)
    for i, item in enumerate(items):
        if i in cuts:
            norm = RunNormalizer.from_bytes(norm.to_bytes(), limits)
        pieces.extend(_feed(norm, [item], i))
    norm = RunNormalizer.from_bytes(norm.to_bytes(), limits)
    pieces.extend(norm.end(len(items), 7))
    assert orjson.dumps(pieces) == orjson.dumps(expected)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_as_a_line_never_raise(data):
    norm = RunNormalizer("r")
    events = norm.line(0, 0, data.decode("utf-8", "replace")) + norm.end(1, 1)
    _assert_contract(events)


def test_fixture_transcripts_resume_at_every_line():
    for path in TRANSCRIPTS:
        items = [(line, "stdout") for line in transcript_lines(path)]
        expected = _feed(RunNormalizer("r"), items)
        got = []
        norm = RunNormalizer("r")
        for i, item in enumerate(items):
            norm = RunNormalizer.from_bytes(norm.to_bytes())
            got.extend(_feed(norm, [item], i))
        assert got == expected, path.name
