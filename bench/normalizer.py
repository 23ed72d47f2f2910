"""Normaliser throughput per input format against a floor measured in the same run.

Floor: `orjson.loads` + `orjson.dumps` of every line. Subject: the normaliser over the same
lines (one RunNormalizer per transcript repetition, events serialised with orjson), through the
batch API `lines(...)` (what the worker uses) and, for reference, one `line(...)` call per line.
Inputs are built before timing for every variant (the floor's lines, the subjects' entries), so
no variant pays for making its input.

A second floor, "I/O": `orjson.loads` of every line + `orjson.dumps` of every event the
normaliser emits for them (built beforehand). It is what any normaliser producing these events
must do; the ratio against it is the share of the time that is not the mapping itself. It
differs from the first floor where events are larger than lines (Codex: about one 400-byte event
per two 200-byte lines) or smaller (goose: text deltas merge into one event).
A third floor, "map floor": the least any mapping to these events costs in CPython. Each line is
parsed, its record type looked up in a dict, and as many envelope-only events as the normaliser
emits for that line are built (event id, run id, seq, type, cached timestamp text, lines, one
field) and serialised. No classification, pairing or state: the ratio ``lines()`` can reach at
most with plain dicts as events, however the mapping is designed.
Corpora: the shared transcripts of each format (goose, claude-code, codex, gemini-cli, opencode), repeated.
Variants are interleaved over several rounds because CPU speed here drifts over seconds, and
timed in process CPU time (``time.process_time``) because the machine is shared: wall time
would count other processes' turns on the CPU.

    python bench/normalizer.py [--lines 200000] [--rounds 5] [--format goose|claude-code|codex|gemini-cli|opencode]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.native import core_kind  # noqa: E402
from services.normalizer import FORMATS, RunNormalizer  # noqa: E402
from services.normalizer.timefmt import format_ms  # noqa: E402
from tests.support.fixtures import SHARED, transcript_lines  # noqa: E402

TARGET = 0.60
T0 = 1_790_000_000_000


def corpus(fmt: str, total: int) -> list[list[str]]:
    runs = [transcript_lines(p) for p in sorted((SHARED / "fixtures" / fmt).glob("*.jsonl"))]
    out, n = [], 0
    while n < total:
        for lines in runs:
            out.append(lines)
            n += len(lines)
    return out


Entries = list[list[tuple[int, int, str, str]]]


def entries_of(runs: list[list[str]]) -> Entries:
    return [[(seq, T0 + seq, line, "stdout") for seq, line in enumerate(lines)] for lines in runs]


def events_of(entries: Entries, fmt: str) -> list[list[dict[str, Any]]]:
    out = []
    for i, run in enumerate(entries):
        norm = RunNormalizer(f"bench/{i}", fmt=fmt)
        out.append(norm.lines(run) + norm.end(len(run), T0 + len(run)))
    return out


def floor(data: Corpus) -> int:
    loads, dumps = orjson.loads, orjson.dumps
    n = 0
    for lines in data.runs:
        for line in lines:
            try:
                dumps(loads(line))
            except orjson.JSONDecodeError:
                pass  # a non-JSON line (banner, cut-off line) costs the floor its failed parse only
            n += 1
    return n


def io_floor(data: Corpus) -> int:
    loads, dumps = orjson.loads, orjson.dumps
    n = 0
    for lines, events in zip(data.runs, data.events, strict=True):
        for line in lines:
            try:
                loads(line)
            except orjson.JSONDecodeError:
                pass
        for event in events:
            dumps(event)
        n += len(lines)
    return n


_TYPES = {"message": 0, "assistant": 1, "user": 2, "item.completed": 3, "item.started": 4}


def map_floor(data: Corpus) -> int:
    loads, dumps = orjson.loads, orjson.dumps
    types = _TYPES
    n = 0
    for i, (lines, per_line) in enumerate(zip(data.runs, data.per_line, strict=True)):
        run = f"bench/{i}"
        out: list[dict[str, Any]] = []
        k = 0
        stamp = ""
        for seq, line in enumerate(lines):
            try:
                record = loads(line)
            except orjson.JSONDecodeError:
                record = None
            rtype = record.get("type") if type(record) is dict else None
            if type(rtype) is str:
                types.get(rtype)
            for _ in range(per_line[seq]):
                stamp = format_ms(T0 + seq)
                out.append({"eventId": f"{run}:{k}", "runId": run, "seq": k, "type": "agent", "timestamp": stamp,
                            "lines": [seq, seq], "message": rtype})
                k += 1
        for event in out:
            dumps(event)
        n += len(lines)
    return n


def batched(data: Corpus) -> int:
    dumps = orjson.dumps
    n = 0
    for i, run in enumerate(data.entries):
        norm = RunNormalizer(f"bench/{i}", fmt=data.fmt)
        for event in norm.lines(run):
            dumps(event)
        for event in norm.end(len(run), T0 + len(run)):
            dumps(event)
        n += len(run)
    return n


def per_line(data: Corpus) -> int:
    dumps = orjson.dumps
    n = 0
    for i, run in enumerate(data.entries):
        norm = RunNormalizer(f"bench/{i}", fmt=data.fmt)
        for seq, ts, line, stream in run:
            for event in norm.line(seq, ts, line, stream):
                dumps(event)
        for event in norm.end(len(run), T0 + len(run)):
            dumps(event)
        n += len(run)
    return n


class Corpus(NamedTuple):
    fmt: str
    runs: list[list[str]]
    entries: Entries
    events: list[list[dict[str, Any]]]
    # Per run, how many of its events each line ends (the end-of-input ones counted on the last line).
    per_line: list[list[int]]


def per_line_counts(runs: list[list[str]], events: list[list[dict[str, Any]]]) -> list[list[int]]:
    out = []
    for lines, evs in zip(runs, events, strict=True):
        counts = [0] * max(1, len(lines))
        for event in evs:
            counts[min(event["lines"][1], len(counts) - 1)] += 1
        out.append(counts[: len(lines)] if lines else [])
    return out


def prepare(fmt: str, total: int) -> Corpus:
    runs = corpus(fmt, total)
    entries = entries_of(runs)
    events = events_of(entries, fmt)
    return Corpus(fmt, runs, entries, events, per_line_counts(runs, events))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--format", choices=FORMATS, action="append", help="only these formats (default: all)")
    args = parser.parse_args()
    variants: dict[str, Callable[[Corpus], int]] = {"floor": floor, "I/O": io_floor, "map floor": map_floor, "lines()": batched, "line()": per_line}
    formats = args.format or list(FORMATS)
    corpora = {fmt: prepare(fmt, args.lines) for fmt in formats}
    rates: dict[tuple[str, str], list[float]] = {(f, v): [] for f in formats for v in variants}
    for _ in range(args.rounds):
        for fmt in formats:
            for name, fn in variants.items():
                t0 = time.process_time()
                n = fn(corpora[fmt])
                rates[(fmt, name)].append(n / (time.process_time() - t0))
    print(f"lines per format and round: ~{args.lines}, rounds: {args.rounds} (medians, lines per CPU second); "
          f"core: {core_kind()} (GOOSE_INGEST_PURE_PYTHON=1: the Python one)")
    print(f"{'format':<12} {'floor':>11} {'I/O floor':>11} {'map floor':>11} {'lines()':>11} {'line()':>11} "
          f"{'ratio lines()':>14} {'ratio line()':>13} {'lines() / I/O':>14} {'map floor ratio':>16}")
    for fmt in formats:
        f = statistics.median(rates[(fmt, "floor")])
        io = statistics.median(rates[(fmt, "I/O")])
        b = statistics.median(rates[(fmt, "lines()")])
        p = statistics.median(rates[(fmt, "line()")])
        m = statistics.median(rates[(fmt, "map floor")])
        print(f"{fmt:<12} {f:>11,.0f} {io:>11,.0f} {m:>11,.0f} {b:>11,.0f} {p:>11,.0f} {b / f:>14.2f} {p / f:>13.2f} "
              f"{b / io:>14.2f} {m / f:>16.2f}")
    print(f"target: ratio >= {TARGET:.2f} of the orjson loads+dumps floor, for every format")


if __name__ == "__main__":
    main()
