"""RunSequencer: ordering, de-duplication, lifecycle and abandonment, as pure functions."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import run_record_adapter
from services.native import PURE_ENV
from services.sequencer import Entry, RunSequencer, plan_abandon
from services.sequencer.run import BUFFERED, DEAD, DUPLICATE, PROCESSED
from tests.support.fakes import RaisingRedactor
from tests.support.fixtures import TRANSCRIPTS, transcript_lines
from tests.support.pipeline import REPO

LINES = transcript_lines(TRANSCRIPTS[0])


def line(seq: int, text: str | None = None, **labels) -> Entry:
    return Entry("r", seq, 1000 + seq, "line", "stdout", LINES[seq % len(LINES)] if text is None else text,
                 None, labels.get("host"), labels.get("agent"), f"{seq}-0",
                 parent=labels.get("parent"), continues=labels.get("continues"))


def eof(seq: int, exit_code: int | None = 0) -> Entry:
    return Entry("r", seq, 1000 + seq, "eof", "stdout", "", exit_code, None, None, f"{seq}-0")


def feed(sequencer: RunSequencer, entries) -> tuple[list, list, list]:
    events, records, disp = [], [], []
    for e in entries:
        out = sequencer.accept(e)
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
    sequencer = RunSequencer("r")
    events, records, _ = [], [], []
    for e in shuffled:
        # Resume from serialized state at random points, as different workers would.
        if rnd.random() < 0.3:
            sequencer = RunSequencer.from_state(orjson.loads(orjson.dumps(sequencer.to_state())))
        out = sequencer.accept(e)
        events += out.events
        records += out.records
    want_events, want_records, _ = one_pass(n)
    assert events == want_events
    assert records == want_records


def test_dispositions_and_lifecycle():
    sequencer = RunSequencer("r")
    _, records, disp = feed(sequencer, [line(1), line(0, host="h1", agent="goose/1.56.0"), line(0), eof(2, 3), line(3), line(1)])
    # A held entry is counted once, as buffered, when it arrives.
    assert disp == [(1, BUFFERED, None), (0, PROCESSED, None), (0, DUPLICATE, None),
                    (2, PROCESSED, None), (3, DEAD, "after-end"), (1, DUPLICATE, None)]
    assert [r["state"] for r in records] == ["started", "ended"]
    assert records[-1]["exitCode"] == 3 and records[-1]["host"] == "h1" and records[-1]["agent"] == "goose/1.56.0"
    for r in records:
        run_record_adapter.validate_python(r)


def test_entries_beyond_the_window_are_dead_lettered_so_the_hold_is_bounded():
    sequencer = RunSequencer("r", max_buffered=2)
    _, _, disp = feed(sequencer, [line(5), line(1), line(2), line(3)])
    assert disp == [(5, DEAD, "out-of-window"), (1, BUFFERED, None), (2, BUFFERED, None), (3, DEAD, "out-of-window")]
    assert len(sequencer.buffer) == 2


def test_abandon_plan_and_apply_report_gaps_and_end_the_run():
    sequencer = RunSequencer("r")
    feed(sequencer, [line(0), line(1), line(3), line(4), line(7)])
    through, missing = plan_abandon(sequencer)
    assert (through, missing) == (7, [[2, 2], [5, 6]])
    marker = Entry("r", 7, 99_000, "abandon", "stdout", "", None, None, None, "0-0", through, tuple(map(tuple, missing)))
    events, records, disp = feed(sequencer, [marker, line(2), line(8), marker])
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
    sequencer = RunSequencer("r")
    feed(sequencer, [line(0), line(2), line(3)])
    again = RunSequencer.from_state(orjson.loads(orjson.dumps(sequencer.to_state())))
    assert again.to_state() == sequencer.to_state()
    assert sorted(again.buffer) == [2, 3]


# ---------------------------------------------------------------- lost seqs, caps, guarded mode
def test_a_lost_seq_is_skipped_at_once_and_reported_missing():
    sequencer = RunSequencer("r")
    events, records, _ = feed(sequencer, [line(0), line(2)])
    out = sequencer.lose(1, 5_000)
    events += out.events
    tail_events, tail_records, _ = feed(sequencer, [eof(3)])
    warnings = [e for e in events + tail_events if e["type"] == "warning"]
    assert [(w["code"], w["lines"]) for w in warnings] == [("missing-entries", [1, 1])]
    assert tail_records[-1]["state"] == "ended" and tail_records[-1]["missing"] == [[1, 1]]


def test_a_lost_first_seq_starts_nothing_until_the_run_has_an_entry():
    sequencer = RunSequencer("r")
    assert sequencer.lose(0, 1).events == [] and sequencer.state == "new"
    events, records, _ = feed(sequencer, [line(1), eof(2)])
    assert events[0]["code"] == "missing-entries" and records[-1]["missing"] == [[0, 0]]


def test_abandon_covers_lost_seqs_far_beyond_the_window():
    sequencer = RunSequencer("r", max_buffered=4)
    _, _, disp = feed(sequencer, [line(0), line(2), line(10**12)])
    assert disp[-1] == (10**12, DEAD, "out-of-window")
    through, missing = plan_abandon(sequencer)
    assert through == 10**12 and missing == [[1, 1], [3, 10**12]]
    marker = Entry("r", through, 9_000, "abandon", "stdout", "", None, None, None, "0-0", through,
                   tuple(map(tuple, missing)))
    events, records, _ = feed(sequencer, [marker])
    assert [e["lines"] for e in events if e["type"] == "warning"] == [[1, 1], [3, 10**12]]
    assert records[-1]["state"] == "abandoned" and records[-1]["missing"] == [[1, 1], [3, 10**12]]


def test_the_held_bytes_cap_dead_letters_and_loses_the_entry():
    sequencer = RunSequencer("r", max_held_bytes=300)
    _, _, disp = feed(sequencer, [line(1, "a" * 100), line(2, "b" * 200), line(3, "c")])
    assert [d[1:] for d in disp] == [(BUFFERED, None), (DEAD, "hold-limit"), (BUFFERED, None)]
    assert sequencer.lost == {2: 1002}
    events, records, _ = feed(sequencer, [line(0), eof(4)])
    assert records[-1]["missing"] == [[2, 2]]


def test_held_changes_name_only_what_changed_since_the_last_commit():
    sequencer = RunSequencer("r")
    feed(sequencer, [line(2), line(3)])
    first = sequencer.take_held_changes()
    assert [e.seq for e in first.added] == [2, 3] and first.removed == []
    feed(sequencer, [line(5), line(0)])  # 5 held; 0 processed, then 1 is still missing
    second = sequencer.take_held_changes()
    assert [e.seq for e in second.added] == [5] and second.removed == []
    feed(sequencer, [line(1)])  # takes 2, 3; 5 waits for 4
    third = sequencer.take_held_changes()
    assert third.added == [] and third.removed == [2, 3]
    again = RunSequencer.from_state(orjson.loads(orjson.dumps(sequencer.to_state(include_held=False))),
                                    held=dict(sequencer.buffer), calls=sequencer.norm.side_snapshot()[0])
    assert again.to_state() == sequencer.to_state() and again.take_held_changes() == ([], [], [], [])


def test_guarded_mode_loses_only_the_entry_that_raises():
    entries = [line(0, text='{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"ok"}]}}'),
               line(1, text="BOOM on stderr"), line(2), eof(3)]
    sequencer = RunSequencer("r", redactor=RaisingRedactor("BOOM", MemoryError))
    sequencer.guarded = True
    events, records, disp = feed(sequencer, entries)
    assert (1, DEAD, "processing-error") in disp
    assert records[-1]["state"] == "ended" and records[-1]["missing"] == [[1, 1]]
    assert not any("BOOM" in orjson.dumps(e).decode() for e in events)


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, len(LINES) - 1))
def test_guarded_mode_gives_the_same_output_when_nothing_raises(rnd, n):
    entries = [line(i) for i in range(n)] + [eof(n)]
    rnd.shuffle(entries)
    plain = feed(RunSequencer("r"), entries)
    guarded_sequencer = RunSequencer("r")
    guarded_sequencer.guarded = True
    assert feed(guarded_sequencer, entries) == plain


# --------------------------------------------------------------------------- accept_many (the batch path)
from services.normalizer import RunNormalizer  # noqa: E402
from services.redaction import Redactor  # noqa: E402
from services.sequencer import Outcome  # noqa: E402
from services.sequencer.entries import LINE  # noqa: E402
from services.sequencer.run import COMPLETED  # noqa: E402
from tests.support.fixtures import SHARED  # noqa: E402

FORMAT_TRANSCRIPTS = [(p.parent.name, transcript_lines(p)) for p in sorted((SHARED / "fixtures").glob("*/*.jsonl"))]
SECRET_LINES = [  # lines that make the redactor (and its secret-field tracker) work
    '{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"key AKIAIOSFODNN7EXAMPLE"}]}}',
    "export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    '{"password": "hunter2hunter2", "user": "x"}',
    "not json at all",
]


def _batch_outcome(sequencer: RunSequencer, entries: list[Entry], batched: bool, out):
    if batched:
        sequencer.accept_many(entries, out)
    else:
        for e in entries:
            sequencer.accept(e, out)


def _summary(out) -> tuple:
    return (out.events, out.records, [(d.entry.seq, d.outcome, d.reason, d.detail) for d in out.dispositions],
            out.redactions)


@settings(max_examples=120, deadline=None)
@given(st.randoms(use_true_random=False), st.sampled_from(range(len(FORMAT_TRANSCRIPTS))), st.booleans(),
       st.floats(0, 0.3), st.floats(0, 0.3))
def test_accept_many_gives_what_one_accept_per_entry_gives(rnd, t, redact, disorder, secrets):
    """Any transcript of any format, delivered in batches with duplicates, reordering, stderr,
    secrets and an eof (sometimes followed by late entries), from states that went through
    to_state/from_state between batches: the batch path and the reference path agree on events,
    records, dispositions, redaction counts and the stored state."""
    fmt, lines = FORMAT_TRANSCRIPTS[t]
    lines = list(lines)
    for _ in range(int(secrets * len(lines))):
        lines.insert(rnd.randrange(len(lines) + 1), rnd.choice(SECRET_LINES))
    entries = [Entry("r", i, 1000 + i, LINE, "stderr" if rnd.random() < 0.05 else "stdout", text, None,
                     "h" if i % 7 == 0 else None, "a" if i == 3 else None, f"{i}-0",
                     format=fmt if i == 0 else None) for i, text in enumerate(lines)]
    entries.append(eof(len(lines)))
    stream = list(entries)
    for _ in range(int(disorder * len(stream))):  # swaps and duplicates
        i, j = rnd.randrange(len(stream)), rnd.randrange(len(stream))
        if rnd.random() < 0.5:
            stream[i], stream[j] = stream[j], stream[i]
        else:
            stream.insert(j, stream[i])
    if rnd.random() < 0.3:
        stream += [line(len(lines) + 1), stream[0]]  # after the end: dead letter, duplicate
    redactor = Redactor() if redact else None
    ref = RunSequencer("r", redactor=redactor)
    fast = RunSequencer("r", redactor=redactor)
    pos = 0
    while pos < len(stream):
        size = rnd.choice([1, 2, 5, 50, 500])
        chunk = stream[pos:pos + size]
        pos += size
        want, got = Outcome(), Outcome()
        if rnd.random() < 0.3:  # resume from stored state, as another worker would
            state = orjson.dumps(ref.to_state())
            ref = RunSequencer.from_state(orjson.loads(state), redactor=redactor)
            fast = RunSequencer.from_state(orjson.loads(state), redactor=redactor)
        _batch_outcome(ref, chunk, False, want)
        _batch_outcome(fast, chunk, True, got)
        assert _summary(got) == _summary(want)
        assert fast.to_state() == ref.to_state()
        assert fast.take_held_changes() == ref.take_held_changes()


def _two_turns() -> list[Entry]:
    turn = transcript_lines(TRANSCRIPTS[1])
    lines = turn + turn  # two turns: the first completion is in the middle of the batch
    return [Entry("r", i, 1000 + i, LINE, "stdout", text, None, None, None, f"{i}-0") for i, text in enumerate(lines)]


def normalizer_calls_of_one_accept_many() -> int:
    """How many times `accept_many` over `_two_turns` calls `RunNormalizer.lines`. Counted by
    replacing the method, which only the Python core sees (compiled code calls it directly), so
    the test asks a Python-core process."""
    entries = _two_turns()
    fast = RunSequencer("r")
    fast.accept(entries[0])
    calls = []
    real = RunNormalizer.lines

    def spy(self, batch):
        calls.append(1)
        return real(self, batch)

    RunNormalizer.lines = spy
    try:
        fast.accept_many(entries[1:])
    finally:
        RunNormalizer.lines = real
    return len(calls)


def test_accept_many_emits_a_completed_record_at_the_line_that_completes_a_turn():
    """A usage in the middle of a batch: the `completed` record carries that line's seq and the
    counts of that moment, as with one accept per line (the batch path checks between lines);
    the whole in-order batch is one normalizer call."""
    entries = _two_turns()
    turn_lines = len(entries) // 2
    ref, fast = RunSequencer("r"), RunSequencer("r")
    ref.accept(entries[0])
    fast.accept(entries[0])
    want = feed(ref, entries[1:])
    out = fast.accept_many(entries[1:])
    code = "from tests.core.test_sequencer import normalizer_calls_of_one_accept_many as n; print(n())"
    calls = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, PURE_ENV: "1"})
    assert calls.stdout.split() == ["1"]
    completed = [r for r in out.records if r["state"] == COMPLETED]
    assert [r["seq"] for r in completed][:1] == [turn_lines - 1]
    assert out.events == want[0] and out.records == want[1]
    assert [(d.entry.seq, d.outcome) for d in out.dispositions] == [(d[0], d[1]) for d in want[2]]


def test_a_seq_lost_as_oversize_is_named_so_across_a_state_round_trip():
    """An oversize entry ahead of the run (held back by a gap) keeps its reason in the stored state,
    so the warning says why it never arrived, as replay says it; without a reason nothing changes."""
    sequencer = RunSequencer("r")
    feed(sequencer, [line(0)])
    assert sequencer.lose(2, 5_000, reason="oversize").events == []  # seq 1 has not come yet
    st = sequencer.to_state()
    assert st["lostWhy"] == [[2, "oversize"]]
    again = RunSequencer.from_state(orjson.loads(orjson.dumps(st)))
    events, records, _ = feed(again, [line(1), eof(3)])
    (warning,) = [e for e in events if e["type"] == "warning"]
    assert warning["message"] == "raw entries 2..2 of this run never arrived: dead-lettered (oversize)"
    assert records[-1]["missing"] == [[2, 2]] and "lostWhy" not in again.to_state()
    plain = RunSequencer("r")
    feed(plain, [line(0)])
    plain.lose(1, 5_000)
    assert "lostWhy" not in plain.to_state()
    events, _, _ = feed(plain, [eof(2)])
    assert plain.missing == [[1, 1]]
