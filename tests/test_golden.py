"""Golden outputs of `goose-ingest normalize` for every shared goose transcript.

The golden files are checked in and were reviewed by reading them; regenerate with
`UPDATE_GOLDEN=1 pytest tests/test_golden.py` and review the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from contracts.events import harness_event_adapter
from tests.fixtures import GOLDEN, GOLDEN_EPOCH, REPO, TRANSCRIPTS


def _normalize(path) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "normalize", "--epoch", str(GOLDEN_EPOCH), str(path)],
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
