"""Golden outputs of `goose-ingest normalize` for every shared transcript of every format.

The golden files are checked in and were reviewed by reading them against the fixtures' `.md`
files; regenerate with `UPDATE_GOLDEN=1 pytest tests/core/test_golden.py` and review the diff.
goose's are in tests/golden/, Claude Code's and Codex's in tests/golden/<format>/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import orjson
import pytest

from contracts.events import harness_event_adapter
from services.normalizer import RunNormalizer
from tests.support.fixtures import GOLDEN, GOLDEN_EPOCH, REPO, SHARED, TRANSCRIPTS, transcript_lines

NEW_FORMATS = ("claude-code", "codex")
NEW_TRANSCRIPTS = [(fmt, p) for fmt in NEW_FORMATS for p in sorted((SHARED / "fixtures" / fmt).glob("*.jsonl"))]


def _normalize(path, *extra: str) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "normalize", "--epoch", str(GOLDEN_EPOCH), *extra, str(path)],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    return proc.stdout


def test_every_fixture_has_a_golden_file():
    assert TRANSCRIPTS, "no shared transcripts found"
    names = {p.name.replace(".jsonl", ".events.jsonl") for p in TRANSCRIPTS}
    assert names == {p.name for p in GOLDEN.glob("*.events.jsonl")}


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.stem)
def test_golden(path):
    out = _normalize(path)
    golden = GOLDEN / path.name.replace(".jsonl", ".events.jsonl")
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_bytes(out)
    assert out == golden.read_bytes()
    for line in out.splitlines():
        harness_event_adapter.validate_python(orjson.loads(line))


def test_every_new_format_fixture_has_a_golden_file():
    for fmt in NEW_FORMATS:
        fixtures = {p.name.replace(".jsonl", ".events.jsonl") for f, p in NEW_TRANSCRIPTS if f == fmt}
        assert fixtures, f"no shared {fmt} transcripts found"
        assert fixtures == {p.name for p in (GOLDEN / fmt).glob("*.events.jsonl")}


@pytest.mark.parametrize("fmt,path", NEW_TRANSCRIPTS, ids=lambda v: v if isinstance(v, str) else v.stem)
def test_golden_new_formats(fmt, path):
    """Detected from the stream itself, and the same bytes when the format is given."""
    out = _normalize(path)
    golden = GOLDEN / fmt / path.name.replace(".jsonl", ".events.jsonl")
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_bytes(out)
    assert out == golden.read_bytes()
    assert _normalize(path, "--format", fmt) == out
    for line in out.splitlines():
        harness_event_adapter.validate_python(orjson.loads(line))


def _expected_order(md_path) -> list[str]:
    """The event types of the `In order:` list of a fixture's .md file."""
    types = []
    for line in md_path.read_text().splitlines():
        head, _, rest = line.partition(". `")
        if head.isdigit() and "`" in rest:
            types.append(rest.split("`", 1)[0])
    return types


@pytest.mark.parametrize("fmt,path", NEW_TRANSCRIPTS, ids=lambda v: v if isinstance(v, str) else v.stem)
def test_new_format_goldens_follow_the_fixture_notes(fmt, path):
    """The golden event types, in order, are those the fixture's .md lists."""
    events = [orjson.loads(line) for line in (GOLDEN / fmt / path.name.replace(".jsonl", ".events.jsonl")).read_bytes().splitlines()]
    expected = _expected_order(path.with_suffix(".md"))
    assert expected, path
    assert [e["type"] for e in events] == expected


def _notes_usage(md_text: str) -> dict | None:
    """The `completed` record a fixture's .md states (None: it says there is none)."""
    for line in md_text.splitlines():
        if line.startswith("Lifecycle `completed` record:"):
            pairs = re.findall(r"`(\w+)` ([0-9]+(?:\.[0-9]+)?)", line)
            return {k: (float(v) if "." in v else int(v)) for k, v in pairs}
        if line.startswith("No `completed` lifecycle record"):
            return None
    raise AssertionError("the notes state no lifecycle record")


@pytest.mark.parametrize("fmt,path", NEW_TRANSCRIPTS, ids=lambda v: v if isinstance(v, str) else v.stem)
def test_new_format_usage_and_session_follow_the_fixture_notes(fmt, path):
    md_text = path.with_suffix(".md").read_text()
    norm = RunNormalizer(path.stem)
    events = []
    for seq, line in enumerate(transcript_lines(path)):
        events += norm.line(seq, GOLDEN_EPOCH + seq, line)
    events += norm.end(seq + 1, GOLDEN_EPOCH + seq + 1)
    assert norm.format == fmt
    assert norm.usage == _notes_usage(md_text)
    session = re.search(r"`sessionId`: `([^`]+)`", md_text).group(1)
    assert {e.get("sessionId") for e in events if "sessionId" in e} == {session}
    if "every event emitted after the first id-bearing record" not in md_text:
        assert all(e.get("sessionId") == session for e in events)


def _events(path):
    return [orjson.loads(line) for line in (GOLDEN / f"{path}.events.jsonl").read_bytes().splitlines()]


def test_read_edit_test_finish_reads_as_a_reader_expects():
    events = _events("a-read-edit-test-finish")
    types = [e["type"] for e in events]
    assert types[:2] == ["reasoning", "agent"]
    assert types.count("list") == 1 and types.count("read") == 2 and types.count("write") == 2
    reads = [e["path"] for e in events if e["type"] == "read"]
    assert reads == ["src/widgets/pager.py", "tests/test_pager.py"]
    (command,) = [e for e in events if e["type"] == "command"]
    assert command["command"] == "python3 -m pytest -q tests"
    assert command["exitCode"] == 0 and command["isSuccess"] is True
    assert types[-1] == "agent" and "error" not in types and "unknown" not in types


def test_tool_error_fixture_marks_failures_on_the_tool_events():
    events = _events("b-tool-error-error-notification")
    failing = [e for e in events if e["type"] == "command"][0]
    assert failing["isSuccess"] is False and failing["exitCode"] == 101
    edits = [e for e in events if e["type"] == "write"]
    assert [e["isSuccess"] for e in edits] == [False, True]
    assert [e["type"] for e in events].count("error") == 1
    assert events[-1]["type"] == "error"
    assert "529" in events[-1]["message"]
