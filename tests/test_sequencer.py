"""RunSequencer: ordering, de-duplication, lifecycle and abandonment, as pure functions."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import run_record_adapter
from services.sequencer import Entry, RunSequencer, plan_abandon
from services.sequencer.run import BUFFERED, DEAD, DUPLICATE, PROCESSED
from tests.fixtures import TRANSCRIPTS, transcript_lines

LINES = transcript_lines(TRANSCRIPTS[0])


def line(seq: int, text: str | None = None, **labels) -> Entry:
    return Entry("r", seq, 1000 + seq, "line", "stdout", LINES[seq % len(LINES)] if text is None else text,
                 None, labels.get("host"), labels.get("agent"), f"{seq}-0",
                 parent=labels.get("parent"), continues=labels.get("continues"))


def eof(seq: int, exit_code: int | None = 0) -> Entry:
    return Entry("r", seq, 1000 + seq, "eof", "stdout", "", exit_code, None, None, f"{seq}-0")


def feed(seq: RunSequencer, entries) -> tuple[list, list, list]:
    events, records, disp = [], [], []
    for e in entries:
        out = seq.accept(e)
        events += out.events
        records += out.records
        disp += [(d[0].seq, d[1], d[2]) for d in out.dispositions]
    return events, records, disp


def one_pass(n: int):
    return feed(RunSequencer("r"), [line(i) for i in range(n)] + [eof(n)])


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, len(LINES) - 1), st.integers(0, 10))
def test_any_delivery_order_with_duplicates_gives_the_one_pass_output(rnd, n, dupes):
    entries = [line(i) for i in range(n)] + [eof(n)]
    shuffled = entries + [rnd.choice(entries) for _ in range(dupes)]
    rnd.shuffle(shuffled)
    seq = RunSequencer("r")
    events, records, _ = [], [], []
    for e in shuffled:
        # Resume from serialized state at random points, as different workers would.
        if rnd.random() < 0.3:
            seq = RunSequencer.from_state(orjson.loads(orjson.dumps(seq.to_state())))
        out = seq.accept(e)
        events += out.events
        records += out.records
    want_events, want_records, _ = one_pass(n)
    assert events == want_events
    assert records == want_records


def test_dispositions_and_lifecycle():
    seq = RunSequencer("r")
    _, records, disp = feed(seq, [line(1), line(0, host="h1", agent="goose/1.56.0"), line(0), eof(2, 3), line(3), line(1)])
    # A held entry is counted once, as buffered, when it arrives.
    assert disp == [(1, BUFFERED, None), (0, PROCESSED, None), (0, DUPLICATE, None),
                    (2, PROCESSED, None), (3, DEAD, "after-end"), (1, DUPLICATE, None)]
    assert [r["state"] for r in records] == ["started", "ended"]
    assert records[-1]["exitCode"] == 3 and records[-1]["host"] == "h1" and records[-1]["agent"] == "goose/1.56.0"
    for r in records:
        run_record_adapter.validate_python(r)


def test_entries_beyond_the_window_are_dead_lettered_so_the_hold_is_bounded():
    seq = RunSequencer("r", max_buffered=2)
    _, _, disp = feed(seq, [line(5), line(1), line(2), line(3)])
    assert disp == [(5, DEAD, "out-of-window"), (1, BUFFERED, None), (2, BUFFERED, None), (3, DEAD, "out-of-window")]
    assert len(seq.buffer) == 2


def test_abandon_plan_and_apply_report_gaps_and_end_the_run():
    seq = RunSequencer("r")
    feed(seq, [line(0), line(1), line(3), line(4), line(7)])
    through, missing = plan_abandon(seq)
    assert (through, missing) == (7, [[2, 2], [5, 6]])
    marker = Entry("r", 7, 99_000, "abandon", "stdout", "", None, None, None, "0-0", through, tuple(map(tuple, missing)))
    events, records, disp = feed(seq, [marker, line(2), line(8), marker])
    gaps = [e for e in events if e["type"] == "warning"]
    assert [g["lines"] for g in gaps] == [[2, 2], [5, 6]]
    assert records[-1]["state"] == "abandoned" and records[-1]["missing"] == [[2, 2], [5, 6]]
    assert disp[-3:] == [(2, DEAD, "after-end"), (8, DEAD, "after-end"), (7, DUPLICATE, None)]


def test_labels_parent_and_continuation_reach_the_records():
    _, records, _ = feed(RunSequencer("r"), [line(0, parent="ns/20260101_1", continues="ns/x"), eof(1)])
    assert all(r["parentRunId"] == "ns/20260101_1" and r["continuesRunId"] == "ns/x" for r in records)
    for r in records:
        run_record_adapter.validate_python(r)


def test_usage_of_the_last_complete_is_on_completed_and_ended():
    complete1 = '{"type":"complete","total_tokens":10,"input_tokens":7,"output_tokens":3}'
    complete2 = '{"type":"complete","total_tokens":20,"input_tokens":14,"output_tokens":6,"cost_usd":0.5}'
    _, records, _ = feed(RunSequencer("r"), [line(0, complete1), line(1, complete2), eof(2)])
    assert [r["state"] for r in records] == ["started", "completed", "completed", "ended"]
    assert records[1]["totalTokens"] == 10 and records[2]["totalTokens"] == 20
    assert records[3]["costUsd"] == 0.5 and records[3]["inputTokens"] == 14


def test_state_survives_json_round_trip_with_held_entries():
    seq = RunSequencer("r")
    feed(seq, [line(0), line(2), line(3)])
    again = RunSequencer.from_state(orjson.loads(orjson.dumps(seq.to_state())))
    assert again.to_state() == seq.to_state()
    assert sorted(again.buffer) == [2, 3]
