"""Bad input ends in a dead letter with a reason or a documented event; the worker carries on."""

from __future__ import annotations

import pytest
import redis

from contracts.keys import shard_of
from services.replay.command import compare
from tests.support.pipeline import (
    dead_letters,
    ended_runs,
    events_by_run,
    start_worker,
    stop,
    topic,
    wait_until,
)

pytestmark = pytest.mark.e2e

TEXT = '{"type":"message","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"%s"}]}}'


@pytest.fixture
def worker(settings, tmp_path):
    proc = start_worker(settings, tmp_path / "worker.log", GOOSE_INGEST_RUN_IDLE_TIMEOUT_S="1.5",
                        GOOSE_INGEST_MAX_LINE_BYTES="1048576")
    yield proc
    stop(proc)
    assert proc.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]


def _xadd(settings, fields: dict, run: str = "bad/run") -> None:
    r = redis.Redis.from_url(settings.redis_url)
    r.xadd(settings.layout.raw_stream(shard_of(run, settings.shards)), fields)


def _good_run(settings, run: str, n: int = 2) -> None:
    for seq in range(n):
        _xadd(settings, {"run": run, "seq": seq, "ts": 1_790_000_000_000 + seq, "line": TEXT % f"part {seq}"}, run)
    _xadd(settings, {"run": run, "seq": n, "ts": 1_790_000_000_000 + n, "kind": "eof", "exit": 0}, run)


def _reasons(settings) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in dead_letters(settings):
        out.setdefault(d["reason"].decode(), []).append(d)
    return out


def test_invalid_entries_are_dead_lettered_with_reason_and_original_fields(settings, worker):
    bad = [
        {"seq": 0, "ts": 1, "line": "x"},  # no run
        {"run": "bad/a", "ts": 1, "line": "x"},  # no seq
        {"run": "bad/b", "seq": "-1", "ts": 1, "line": "x"},  # negative seq
        {"run": "bad/c", "seq": "zero", "ts": 1, "line": "x"},  # non-integer seq
        {"run": "bad run", "seq": 0, "ts": 1, "line": "x"},  # not a run key
        {"run": b"bad/\xff", "seq": 0, "ts": 1, "line": "x"},  # non-UTF-8 run
        {"run": "bad/d", "seq": 0, "ts": "yesterday", "line": "x"},  # unusable ts
        {"run": "bad/e", "seq": 0, "ts": 1, "kind": "lines", "line": "x"},  # unknown kind
        {"run": "bad/f", "seq": 0, "ts": 1},  # line entry without a line
        {"run": "bad/g", "seq": 0, "ts": 1, "stream": "stdin", "line": "x"},  # unknown stream
        {"run": "bad/h", "seq": str(2**60), "ts": 1, "line": "x"},  # beyond 2**53
    ]
    for fields in bad:
        _xadd(settings, fields)
    _good_run(settings, "bad/after-the-junk")
    wait_until(lambda: "bad/after-the-junk" in ended_runs(settings), timeout=30)
    # The junk and the good run may sit on different shards: wait for the junk's dead letters too.
    wait_until(lambda: len(_reasons(settings).get("invalid-entry", [])) >= len(bad), timeout=30)
    reasons = _reasons(settings)
    invalid = reasons["invalid-entry"]
    assert len(invalid) == len(bad)
    details = sorted(d["detail"].decode() for d in invalid)
    assert any("missing 'run'" in d for d in details) and any("negative" in d for d in details)
    assert any("too large" in d for d in details) and any("not a run key" in d for d in details)
    # The original fields travel with the reason.
    assert any(d.get("raw.run") == b"bad/\xff" for d in invalid)
    assert all(d["source"].startswith(settings.layout.raw_stream(0).rsplit(".", 1)[0].encode()) for d in invalid)


def test_oversize_line_is_dead_lettered_and_the_run_goes_on(settings, worker):
    run = "bad/oversize"
    _xadd(settings, {"run": run, "seq": 0, "ts": 1, "line": TEXT % "before"}, run)
    _xadd(settings, {"run": run, "seq": 1, "ts": 2, "line": "x" * 10_000_000}, run)
    _xadd(settings, {"run": run, "seq": 2, "ts": 3, "line": TEXT % "after"}, run)
    _xadd(settings, {"run": run, "seq": 3, "ts": 4, "kind": "eof"}, run)
    wait_until(lambda: run in ended_runs(settings), timeout=30)
    (oversize,) = _reasons(settings)["oversize"]
    assert oversize["raw.seq"] == b"1" and len(oversize["raw.line"]) == 10_000_000
    events = events_by_run(settings)[run]
    # The 10 MB entry never arrived as far as the run is concerned: the gap is reported once the
    # run is abandoned; like every warning it passes the pending span, which eof then flushes.
    assert [e["type"] for e in events] == ["warning", "agent"]
    assert events[0]["code"] == "missing-entries" and events[0]["lines"] == [1, 1]
    # the warning names why (issue 22: it said only "never arrived")
    assert events[0]["message"] == "raw entries 1..1 of this run never arrived: dead-lettered (oversize)"
    assert events[1]["message"] == "beforeafter" and events[1]["lines"] == [0, 2]
    (ended,) = [r for r in topic(settings, settings.layout.runs_partition(0)) if r["runId"] == run and r["state"] == "ended"]
    assert ended["missing"] == [[1, 1]]


def test_non_utf8_and_non_json_lines_become_documented_events(settings, worker):
    run = "bad/bytes"
    _xadd(settings, {"run": run, "seq": 0, "ts": 1, "line": b"\xff\xfe goose banner \xc3"}, run)
    _xadd(settings, {"run": run, "seq": 1, "ts": 2, "line": "{not json"}, run)
    _xadd(settings, {"run": run, "seq": 2, "ts": 3, "kind": "eof", "exit": 3}, run)
    wait_until(lambda: run in ended_runs(settings), timeout=30)
    events = events_by_run(settings)[run]
    assert [e["type"] for e in events] == ["warning", "warning", "error"]
    assert events[0]["message"] == "\ufffd\ufffd goose banner \ufffd"
    assert events[2]["message"] == "goose exited with code 3"


def test_seq_gap_that_never_fills_is_abandoned_and_reported(settings, worker):
    run = "bad/gap"
    for seq in (0, 1, 3, 4):
        _xadd(settings, {"run": run, "seq": seq, "ts": 10 + seq, "line": TEXT % f"s{seq}"}, run)
    wait_until(lambda: run in ended_runs(settings), timeout=30)
    records = [r for r in topic(settings, settings.layout.runs_partition(0)) if r["runId"] == run]
    assert [r["state"] for r in records] == ["started", "abandoned"]
    assert records[-1]["missing"] == [[2, 2]]
    events = events_by_run(settings)[run]
    assert [e["type"] for e in events] == ["warning", "agent"]
    assert events[0]["code"] == "missing-entries" and events[0]["lines"] == [2, 2]
    assert events[1]["message"] == "s0s1s3s4" and events[1]["lines"] == [0, 4]
    # The late entry and anything after the end are dead letters, not events.
    _xadd(settings, {"run": run, "seq": 2, "ts": 12, "line": TEXT % "late"}, run)
    _xadd(settings, {"run": run, "seq": 9, "ts": 19, "line": TEXT % "later"}, run)
    wait_until(lambda: len(_reasons(settings).get("after-end", [])) == 2, timeout=30)
    assert len(events_by_run(settings)[run]) == 2
    # The abandonment is in the raw log, so replay rebuilds exactly what was published.
    assert compare(settings, run) == 0


def test_entries_after_eof_duplicates_and_far_future_seqs(settings, worker):
    run = "bad/after-eof"
    _good_run(settings, run)
    _xadd(settings, {"run": run, "seq": 1, "ts": 99, "line": TEXT % "duplicate"}, run)
    _xadd(settings, {"run": run, "seq": 5, "ts": 99, "line": TEXT % "after eof"}, run)
    other = "bad/far-future"
    _xadd(settings, {"run": other, "seq": 10**9, "ts": 1, "line": TEXT % "far"}, other)
    _good_run(settings, other)
    wait_until(lambda: {run, other} <= ended_runs(settings), timeout=30)
    wait_until(lambda: len(_reasons(settings).get("out-of-window", [])) == 1, timeout=30)
    wait_until(lambda: len(_reasons(settings).get("after-end", [])) == 1, timeout=30)
    assert [e["message"] for e in events_by_run(settings)[run]] == ["part 0part 1"]
    assert compare(settings) == 0
