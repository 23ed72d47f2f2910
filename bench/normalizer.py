"""Normaliser throughput against a floor measured in the same run.

Floor: `orjson.loads` + `orjson.dumps` of every line. Subject: the normaliser over the same
lines (one RunNormalizer per transcript repetition, events serialised with orjson).
Variants are interleaved over several rounds because CPU speed here drifts over seconds.

    python bench/normalizer.py [--lines 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.normalizer import RunNormalizer  # noqa: E402
from tests.fixtures import TRANSCRIPTS, transcript_lines  # noqa: E402


def corpus(total: int) -> list[list[str]]:
    runs = [transcript_lines(p) for p in TRANSCRIPTS]
    out, n = [], 0
    while n < total:
        for lines in runs:
            out.append(lines)
            n += len(lines)
    return out


def floor(runs: list[list[str]]) -> int:
    loads, dumps = orjson.loads, orjson.dumps
    n = 0
    for lines in runs:
        for line in lines:
            dumps(loads(line))
            n += 1
    return n


def normalize(runs: list[list[str]]) -> int:
    dumps = orjson.dumps
    n = 0
    for i, lines in enumerate(runs):
        norm = RunNormalizer(f"bench/{i}")
        for seq, line in enumerate(lines):
            for event in norm.line(seq, 1_790_000_000_000 + seq, line):
                dumps(event)
        for event in norm.end(len(lines), 1_790_000_000_000 + len(lines)):
            dumps(event)
        n += len(lines)
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs = corpus(args.lines)
    rates: dict[str, list[float]] = {"floor": [], "normalizer": []}
    for _ in range(args.rounds):
        for name, fn in (("floor", floor), ("normalizer", normalize)):
            t0 = time.perf_counter()
            n = fn(runs)
            rates[name].append(n / (time.perf_counter() - t0))
    f, s = statistics.median(rates["floor"]), statistics.median(rates["normalizer"])
    print(f"lines per round: {sum(map(len, runs))}, rounds: {args.rounds} (medians)")
    print(f"floor (orjson loads+dumps): {f:,.0f} lines/s")
    print(f"normalizer:                 {s:,.0f} lines/s")
    print(f"ratio normalizer/floor:     {s / f:.2f}  (target >= 0.60)")


if __name__ == "__main__":
    main()
