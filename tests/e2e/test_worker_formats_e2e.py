"""goose, Claude Code, Codex, Gemini CLI and opencode runs mixed in the same shards, through real
worker processes (every shared transcript of the first three, one real capture of each of the others).

Half of the runs carry the `format` label (what a tap that knows its command sets), half do not
(the format is detected from the first JSON object). One worker is SIGKILLed mid-stream and
another restarted; every run must still end with exactly the events one pure pass gives, in
order, with no gap or duplicate, and replay must find no difference.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter

import pytest

from contracts import harness_event_adapter, run_record_adapter
from contracts.formats import BY_NAME, FORMAT_NAMES
from services.normalizer import RunNormalizer
from services.replay.command import compare
from services.sequencer import Entry
from services.tap.publisher import Publisher
from tests.support.fixtures import SHARED
from tests.support.pipeline import ended_runs, events_by_run, raw_entries, start_worker, stop, topic, wait_until

pytestmark = pytest.mark.e2e

FORMAT_DIRS = {fmt: fmt for fmt in FORMAT_NAMES}  # a format's shared fixtures are in the folder of its name
# Formats with real captures rather than transcripts: one capture each (the demo's) keeps the run short.
ONE_CAPTURE = {"gemini-cli", "opencode"}


def _transcripts() -> list[tuple[str, list[bytes]]]:
    out = []
    for fmt, folder in FORMAT_DIRS.items():
        paths = sorted((SHARED / "fixtures" / folder).glob("*.jsonl"))
        if fmt in ONE_CAPTURE:
            paths = [p for p in paths if p.name == BY_NAME[fmt].demo_transcript]
        for path in paths:
            out.append((fmt, path.read_bytes().splitlines()))
    assert {fmt for fmt, _ in out} == set(FORMAT_DIRS), "the shared fixtures of every format must be there"
    return out


def _expected(entries: list[Entry]) -> tuple[list[dict], str | None]:
    """One pure pass over a run's entries in seq order, as the contract extension defines it."""
    norm = RunNormalizer(entries[0].run)
    out: list[dict] = []
    for e in sorted(entries, key=lambda e: e.seq):
        if e.seq == 0:
            out += norm.apply_labels(e.format, e.agent, e.seq, e.ts)
        if e.kind == "eof":
            out += norm.end(e.seq, e.ts, e.exit, signal=e.signal)
            break
        out += norm.line(e.seq, e.ts, e.line, e.stream)
    return out, norm.format


def test_mixed_formats_in_the_same_shards_survive_a_killed_worker(settings, tmp_path):
    transcripts = _transcripts()
    runs: dict[str, str] = {}  # run -> the format its transcript is in

    def publish(run: str, fmt: str, labelled: bool, lines: list[bytes]) -> None:
        with Publisher(settings, run, {"host": "mix"}, format=fmt if labelled else None) as pub:
            for line in lines:
                pub.add_line(line, "stdout")
            pub.add_eof(0)

    jobs = []
    for copy in range(3):
        for i, (fmt, lines) in enumerate(transcripts):
            labelled = (copy + i) % 2 == 0
            run = f"mix/{copy}/{fmt}-{i}-{'l' if labelled else 'd'}"
            runs[run] = fmt
            jobs.append(threading.Thread(target=publish, args=(run, fmt, labelled, lines)))

    log = tmp_path / "workers.log"
    workers = [start_worker(settings, log) for _ in range(3)]
    try:
        for job in jobs:
            job.start()
        wait_until(lambda: len(topic(settings, settings.layout.events_partition(0))) > 20, timeout=60)
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        stop(workers[1])
        workers[1] = start_worker(settings, log)
        for job in jobs:
            job.join()
        wait_until(lambda: ended_runs(settings) >= set(runs), timeout=180)
    finally:
        for w in workers:
            stop(w)

    entries_by_run: dict[str, list[Entry]] = {}
    for entry in raw_entries(settings):
        entries_by_run.setdefault(entry.run, []).append(entry)
    published = events_by_run(settings)
    assert set(published) == set(runs)
    for run, fmt in runs.items():
        got = published[run]
        assert [e["eventId"] for e in got] == [f"{run}:{n}" for n in range(len(got))], f"gap or duplicate in {run}"
        want, decided = _expected(entries_by_run[run])
        assert decided == fmt, f"{run}: format decided as {decided}, transcript is {fmt}"
        assert got == want, run
        for event in got:
            harness_event_adapter.validate_python(event)
    records = topic(settings, settings.layout.runs_partition(0))
    for record in records:
        run_record_adapter.validate_python(record)
    ended = {r["runId"]: r for r in records if r["state"] == "ended"}
    assert {run: ended[run].get("format") for run in runs} == runs, "every run record names the run's format"
    states = Counter((r["runId"], r["state"]) for r in records)
    assert all(states[(run, "started")] == 1 and states[(run, "ended")] == 1 for run in runs)
    # every format really produced events (the fixtures are not empty to the normalizers)
    per_format = Counter(runs[e["runId"]] for v in published.values() for e in v)
    assert all(per_format[f] > 0 for f in FORMAT_DIRS), per_format
    assert compare(settings) == 0
