"""The real Gemini CLI and opencode captures of ../shared/fixtures/ against expectations written by
hand from each spec's mapping (tests/golden/<format>/<capture>.expected.json, compared by
tests/support/expectations.py), and against the checked-in bytes of `goose-ingest normalize`
(tests/golden/<format>/<capture>.events.jsonl; `UPDATE_GOLDEN=1` regenerates, review the diff).
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from contracts.events import harness_event_adapter
from tests.support.expectations import load, mismatches, normalize
from tests.support.fixtures import GOLDEN, GOLDEN_EPOCH, REPO, SHARED, transcript_lines

FORMATS = ("gemini-cli", "opencode")
CAPTURES = [(fmt, p) for fmt in FORMATS for p in sorted((SHARED / "fixtures" / fmt).glob("*.jsonl"))]


def _ids(value):
    return value if isinstance(value, str) else value.stem


def test_every_capture_has_an_expectation_and_a_golden_file():
    for fmt in FORMATS:
        captures = {p.stem for f, p in CAPTURES if f == fmt}
        assert captures, f"no shared {fmt} captures found"
        assert captures == {p.name.removesuffix(".expected.json") for p in (GOLDEN / fmt).glob("*.expected.json")}
        assert captures == {p.name.removesuffix(".events.jsonl") for p in (GOLDEN / fmt).glob("*.events.jsonl")}


@pytest.mark.parametrize("fmt,path", CAPTURES, ids=_ids)
def test_the_capture_gives_the_events_the_spec_expects(fmt, path):
    expected = load(GOLDEN / fmt / f"{path.stem}.expected.json")
    events, norm = normalize(transcript_lines(path), expected["exit"])
    assert norm.format == fmt  # detected from the first record
    assert mismatches(events, norm.usage, expected) == []
    for event in events:
        harness_event_adapter.validate_python(event)


def test_an_expectation_that_differs_is_reported():
    """The comparison can fail: a wrong field, a field that must be absent, a wrong usage."""
    path = SHARED / "fixtures" / "gemini-cli" / "tools.jsonl"
    expected = load(GOLDEN / "gemini-cli" / "tools.expected.json")
    events, norm = normalize(transcript_lines(path), 0)
    events[1]["durationMs"] += 1
    events[3]["isSuccess"] = True
    found = mismatches(events[:-1], {**norm.usage, "costUsd": 1.0}, expected)
    assert any("durationMs" in m for m in found) and any("isSuccess should be absent" in m for m in found)
    assert any(m.startswith("22 events") for m in found) and any(m.startswith("completed") for m in found)


def _normalize_cli(path, *extra: str) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "normalize", "--epoch", str(GOLDEN_EPOCH), *extra, str(path)],
        capture_output=True, cwd=REPO, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


@pytest.mark.parametrize("fmt,path", CAPTURES, ids=_ids)
def test_golden_bytes(fmt, path):
    out = _normalize_cli(path)
    golden = GOLDEN / fmt / f"{path.stem}.events.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_bytes(out)
    assert out == golden.read_bytes()
    assert _normalize_cli(path, "--format", fmt) == out


@pytest.mark.parametrize("fmt,path", CAPTURES, ids=_ids)
def test_stderr_lines_are_plain_warnings_before_the_run(fmt, path):
    """Gemini prints retries and stack traces on stderr only (spec 8.6.10, 8.6.13): each non-blank
    line is a warning without errorClass; opencode's stderr is empty in these captures."""
    stderr = path.with_suffix(".stderr")
    lines = [line for line in stderr.read_text().splitlines() if line.strip()]
    events = [orjson.loads(line) for line in _normalize_cli(path, "--stderr", str(stderr)).splitlines()]
    warnings = events[: len(lines)]
    assert [w["type"] for w in warnings] == ["warning"] * len(lines)
    assert [w["message"] for w in warnings] == [line.strip() for line in lines]
    assert not any("errorClass" in w for w in warnings)
