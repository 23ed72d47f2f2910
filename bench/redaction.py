"""Redaction micro-benchmark: the redactor against a no-op over the goose fixtures' events.

Corpus: the events the normaliser makes of the shared goose transcripts (every transcript, each
as its own run), repeated to about ``--events`` events; a second corpus is the same with a
secret-bearing command event (several families, structural arguments) every ``--dirty-every``
events. Each event goes through what the sequencer does per event with redaction on:
``tracker.observe`` of ``unknown`` payloads, then ``redact_event(event, tracker=...)``.

Variants, interleaved over ``--rounds`` rounds in the same process (CPU speed drifts here):
- ``no-op``: the same loop calling a function that returns the event unchanged (the floor);
- ``redact``: the configured default ``Redactor()`` (prefilter on);
- ``redact, no prefilter``: ``Redactor(prefilter=False)``, every rule on every string (the
  reference path; same output);
- ``normalize``: the normaliser producing these events from their lines (for scale: what a
  worker spends anyway per event).

Prints events/s (medians), microseconds per event, and the redactor's cost relative to the
normaliser. The worker-throughput cost of redaction (target < 25 %) is measured end to end by
``bench/pipeline.py`` (variant "1 worker, no redaction").

    python bench/redaction.py [--events 100000] [--rounds 5] [--dirty-every 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.normalizer import RunNormalizer  # noqa: E402
from services.redaction import Redactor, SecretFieldTracker  # noqa: E402
from tests.support.fixtures import TRANSCRIPTS, transcript_lines  # noqa: E402

T0 = 1_790_000_000_000
Event = dict[str, Any]


def normalize(lines: list[str], run: str) -> list[Event]:
    norm = RunNormalizer(run)
    events: list[Event] = []
    for seq, line in enumerate(lines):
        events.extend(norm.line(seq, T0 + seq, line))
    events.extend(norm.end(len(lines), T0 + len(lines)))
    return events


def corpus(total: int) -> tuple[list[list[str]], list[list[Event]]]:
    """Runs of lines and their events, the transcripts repeated until about `total` events."""
    transcripts = [transcript_lines(p) for p in TRANSCRIPTS]
    line_runs: list[list[str]] = []
    event_runs: list[list[Event]] = []
    n = 0
    while n < total:
        for lines in transcripts:
            events = normalize(lines, f"bench/{len(event_runs)}")
            line_runs.append(lines)
            event_runs.append(events)
            n += len(events)
    return line_runs, event_runs


def dirty(event_runs: list[list[Event]], every: int) -> list[list[Event]]:
    """The same runs with a secret-bearing event every `every` events."""
    out: list[list[Event]] = []
    i = 0
    for run in event_runs:
        new: list[Event] = []
        for event in run:
            new.append(event)
            i += 1
            if i % every == 0:
                new.append({
                    **{k: event[k] for k in ("eventId", "runId", "seq", "timestamp", "lines")},
                    "type": "unknown", "tool": "db__connect", "toolCallId": "toolu_01",
                    "raw": {"name": "db__connect", "arguments": {
                        "command": "curl -u deploy:hunter22 https://ci.example.com && mysql -uroot -ps3cret acme",
                        "env": {"DB_PASSWORD": "s3cret", "HOME": "/home/dev"},
                        "headers": {"Authorization": "Basic ZGVwbG95Omh1bnRlcjIy", "Cookie": "sid=0123abcd"}}},
                })
        out.append(new)
    return out


def run_redactor(redactor: Redactor | None) -> Callable[[list[list[Event]]], int]:
    def go(event_runs: list[list[Event]]) -> int:
        n = 0
        for run in event_runs:
            tracker = SecretFieldTracker()
            for event in run:
                if redactor is None:
                    _noop(event, tracker)
                else:  # what RunSequencer._redact does per event
                    if event["type"] == "unknown":
                        tracker.observe(event["raw"])
                    redactor.redact_event(event, tracker=tracker)
                n += 1
        return n

    return go


def _noop(event: Event, tracker: SecretFieldTracker) -> tuple[Event, Counter[str]]:
    return event, Counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events per corpus and round (about)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dirty-every", type=int, default=20, help="one secret-bearing event per this many")
    args = parser.parse_args()

    line_runs, clean_runs = corpus(args.events)
    corpora = {"goose fixtures": clean_runs, f"+ secrets 1/{args.dirty_every}": dirty(clean_runs, args.dirty_every)}
    variants: dict[str, Callable[[list[list[Event]]], int]] = {
        "no-op": run_redactor(None),
        "redact": run_redactor(Redactor()),
        "redact, no prefilter": run_redactor(Redactor(prefilter=False)),
    }
    n_lines = sum(len(lines) for lines in line_runs)
    n_events = sum(len(run) for run in clean_runs)
    rates: dict[tuple[str, str], list[float]] = {(c, v): [] for c in corpora for v in variants}
    norm_rates: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for i, lines in enumerate(line_runs):
            normalize(lines, f"bench/{i}")
        norm_rates.append(n_events / (time.perf_counter() - t0))
        for cname, runs in corpora.items():
            for vname, fn in variants.items():
                t0 = time.perf_counter()
                n = fn(runs)
                rates[(cname, vname)].append(n / (time.perf_counter() - t0))

    norm = statistics.median(norm_rates)
    print(f"corpus: {len(TRANSCRIPTS)} goose transcripts repeated: {n_lines:,} lines -> {n_events:,} events "
          f"per round; rounds: {args.rounds} (medians)")
    print(f"normalizer producing them: {norm:,.0f} events/s ({1e6 / norm:.2f} us/event)")
    print(f"{'corpus':<20} {'variant':<22} {'events/s':>11} {'us/event':>9} {'vs no-op':>9} {'+us vs no-op':>13} "
          f"{'% of normalize':>15}")
    for cname in corpora:
        floor = statistics.median(rates[(cname, "no-op")])
        for vname in variants:
            r = statistics.median(rates[(cname, vname)])
            extra = 1e6 / r - 1e6 / floor
            share = extra / (1e6 / norm) if vname != "no-op" else 0.0
            print(f"{cname:<20} {vname:<22} {r:>11,.0f} {1e6 / r:>9.2f} {r / floor:>9.2f} {extra:>13.2f} "
                  f"{share:>14.0%}")
    print("target: redaction < 25% of worker throughput (bench/pipeline.py, same run, redaction on vs off)")


if __name__ == "__main__":
    main()
