"""Expected events written from a format's spec, compared with what the normalizer makes of a capture.

An expectation (``tests/golden/<format>/<capture>.expected.json``) is written by hand from the spec's
mapping, never copied from the normalizer's output: the capture's exit code, its `sessionId`, the
events in order (each with only the fields the mapping decides; a field given as null must be
absent, e.g. `isSuccess` where the CLI cannot know it) and the `completed` usage (null: none).
A capture harness that re-records a scenario from the real CLI compares its capture the same way:
``mismatches(normalize(lines, exit), expectation)`` (ids, seqs and timestamps are not compared).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from services.normalizer import RunNormalizer


def load(path: Path) -> dict[str, Any]:
    return orjson.loads(path.read_bytes())


def normalize(lines: Iterable[str], exit_code: int | None, fmt: str | None = None,
              first_ts: int = 1_796_536_000_000) -> tuple[list[dict[str, Any]], RunNormalizer]:
    """The events of one run of stdout ``lines`` ending with ``exit_code`` (format detected unless given)."""
    norm = RunNormalizer("capture", fmt=fmt)
    events: list[dict[str, Any]] = []
    seq = 0
    for line in lines:
        events += norm.line(seq, first_ts + seq, line)
        seq += 1
    events += norm.end(seq, first_ts + seq, exit_code)  # the eof is the entry after the last line
    return events, norm


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return bool(got == want)


def mismatches(events: list[Mapping[str, Any]], usage: Mapping[str, Any] | None,
               expected: Mapping[str, Any]) -> list[str]:
    """What differs between a run's events and usage and an expectation (empty: it matches)."""
    out: list[str] = []
    want_events = expected["events"]
    if len(events) != len(want_events):
        out.append(f"{len(events)} events, expected {len(want_events)}: {[e['type'] for e in events]}")
    for i, (event, want) in enumerate(zip(events, want_events, strict=False)):
        for key, value in want.items():
            if value is None:
                if key in event:
                    out.append(f"event {i} ({event['type']}): {key} should be absent, is {event[key]!r}")
            elif key not in event or not _same(event[key], value):
                out.append(f"event {i} ({event['type']}): {key} = {event.get(key)!r}, expected {value!r}")
    session = expected.get("sessionId")
    if session is not None:
        out += [f"event {i}: sessionId {e.get('sessionId')!r}" for i, e in enumerate(events) if e.get("sessionId") != session]
    want_usage = expected.get("completed")
    if want_usage is None:
        if usage is not None:
            out.append(f"completed {dict(usage)!r}, expected none")
    elif usage is None or set(usage) != set(want_usage) or not all(_same(usage[k], v) for k, v in want_usage.items()):
        out.append(f"completed {usage!r}, expected {want_usage!r}")
    return out
