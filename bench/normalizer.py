"""Normaliser throughput per input format against a floor measured in the same run.

Floor: `orjson.loads` + `orjson.dumps` of every line. Subject: the normaliser over the same
lines (one RunNormalizer per transcript repetition, events serialised with orjson), through the
batch API `lines(...)` (what the worker uses) and, for reference, one `line(...)` call per line.
Corpora: the shared transcripts of each format (goose, claude-code, codex), repeated.
Variants are interleaved over several rounds because CPU speed here drifts over seconds, and
timed in process CPU time (``time.process_time``) because the machine is shared: wall time
would count other processes' turns on the CPU.

    python bench/normalizer.py [--lines 200000] [--rounds 5] [--format goose|claude-code|codex]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.normalizer import FORMATS, RunNormalizer  # noqa: E402
from tests.fixtures import SHARED, transcript_lines  # noqa: E402

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


def floor(runs: list[list[str]], fmt: str) -> int:
    loads, dumps = orjson.loads, orjson.dumps
    n = 0
    for lines in runs:
        for line in lines:
            try:
                dumps(loads(line))
            except orjson.JSONDecodeError:
                pass  # a non-JSON line (banner, cut-off line) costs the floor its failed parse only
            n += 1
    return n


def batched(runs: list[list[str]], fmt: str) -> int:
    dumps = orjson.dumps
    n = 0
    for i, lines in enumerate(runs):
        norm = RunNormalizer(f"bench/{i}", fmt=fmt)
        for event in norm.lines([(seq, T0 + seq, line, "stdout") for seq, line in enumerate(lines)]):
            dumps(event)
        for event in norm.end(len(lines), T0 + len(lines)):
            dumps(event)
        n += len(lines)
    return n


def per_line(runs: list[list[str]], fmt: str) -> int:
    dumps = orjson.dumps
    n = 0
    for i, lines in enumerate(runs):
        norm = RunNormalizer(f"bench/{i}", fmt=fmt)
        for seq, line in enumerate(lines):
            for event in norm.line(seq, T0 + seq, line):
                dumps(event)
        for event in norm.end(len(lines), T0 + len(lines)):
            dumps(event)
        n += len(lines)
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--format", choices=FORMATS, action="append", help="only these formats (default: all)")
    args = parser.parse_args()
    variants: dict[str, Callable[[list[list[str]], str], int]] = {"floor": floor, "lines()": batched, "line()": per_line}
    formats = args.format or list(FORMATS)
    corpora = {fmt: corpus(fmt, args.lines) for fmt in formats}
    rates: dict[tuple[str, str], list[float]] = {(f, v): [] for f in formats for v in variants}
    for _ in range(args.rounds):
        for fmt in formats:
            for name, fn in variants.items():
                t0 = time.process_time()
                n = fn(corpora[fmt], fmt)
                rates[(fmt, name)].append(n / (time.process_time() - t0))
    print(f"lines per format and round: ~{args.lines}, rounds: {args.rounds} (medians, lines per CPU second)")
    print(f"{'format':<12} {'floor':>11} {'lines()':>11} {'line()':>11} {'ratio lines()':>14} {'ratio line()':>13}")
    for fmt in formats:
        f = statistics.median(rates[(fmt, "floor")])
        b = statistics.median(rates[(fmt, "lines()")])
        p = statistics.median(rates[(fmt, "line()")])
        print(f"{fmt:<12} {f:>11,.0f} {b:>11,.0f} {p:>11,.0f} {b / f:>14.2f} {p / f:>13.2f}")
    print(f"target: ratio >= {TARGET:.2f} of the orjson loads+dumps floor, for every format")


if __name__ == "__main__":
    main()
