"""`goose-ingest normalize` driven as a user would: a subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import orjson
import pytest

from contracts.events import harness_event_adapter
from tests.support.fixtures import FIXTURES, GOLDEN_EPOCH, REPO, SHARED


def normalize(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "normalize", "--epoch", str(GOLDEN_EPOCH), *args],
        input=stdin,
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )


def events(proc: subprocess.CompletedProcess[bytes]) -> list[dict]:
    out = [orjson.loads(line) for line in proc.stdout.splitlines()]
    for event in out:
        harness_event_adapter.validate_python(event)
    return out


def test_the_run_is_named_after_the_whole_stem(tmp_path):
    src = FIXTURES / "b-v1.4x-error-then-complete.jsonl"
    proc = normalize(str(src))
    assert proc.returncode == 0, proc.stderr
    assert {e["runId"] for e in events(proc)} == {"b-v1.4x-error-then-complete"}


def test_a_sqlite_file_is_refused_with_what_to_use_instead(tmp_path):
    db = tmp_path / "sessions.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (x)")
    proc = normalize(str(db))
    assert proc.returncode == 2 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and "SQLite database" in lines[0] and "import-sessions" in lines[0]


def test_a_sqlite_file_on_stdin_is_refused_too(tmp_path):
    db = tmp_path / "sessions.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (x)")
    proc = normalize("-", stdin=db.read_bytes())
    assert proc.returncode == 2 and proc.stdout == b"" and b"import-sessions" in proc.stderr


def test_goose_output_format_json_is_refused_with_what_to_use_instead():
    proc = normalize(str(FIXTURES / "a-read-edit-test-finish.output-format-json.json"))
    assert proc.returncode == 2 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and "--output-format stream-json" in lines[0] and "JSON document" in lines[0]


def test_a_refused_document_prints_nothing_even_after_stderr_events(tmp_path):
    err = tmp_path / "err.txt"
    err.write_text("WARN something\n")
    proc = normalize("--stderr", str(err), str(FIXTURES / "a-read-edit-test-finish.output-format-json.json"))
    assert proc.returncode == 2 and proc.stdout == b""


def test_a_stream_with_a_stderr_file_still_prints_everything(tmp_path):
    err = tmp_path / "err.txt"
    err.write_text("WARN something\n")
    proc = normalize("--stderr", str(err), str(SHARED / "fixtures" / "codex" / "a-read-edit-test.jsonl"))
    assert proc.returncode == 0
    out = events(proc)
    assert out[0]["type"] == "warning" and out[0]["message"] == "WARN something" and len(out) == 14


@pytest.mark.parametrize("depth", [100, 300, 600, 1100])
@pytest.mark.parametrize("fmt", [None, "goose", "claude-code", "codex", "gemini-cli", "opencode"])
def test_deeply_nested_lines_never_crash(tmp_path, depth, fmt):
    src = tmp_path / "deep.jsonl"
    src.write_text('{"type":"x","a":' + "[" * depth + "]" * depth + "}\n" + '{"type":"y"}\n')
    proc = normalize(*(["--format", fmt] if fmt else []), str(src))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    first = events(proc)[0]
    if depth > 1024:  # orjson's parser refuses it: a non-JSON line
        assert first["type"] == "warning"
    else:  # kept whole; beyond 200 levels as the line's text
        assert first["type"] == "unknown"
        assert isinstance(first["raw"], str) == (depth > 200)


@pytest.mark.parametrize("digits,expected", [(30, ["read"]), (5000, ["warning", "warning", "unknown"])])
def test_huge_integers_never_crash(tmp_path, digits, expected):
    """30 digits parse as a float (never a count or a line number); 5000 do not parse at all."""
    big = "9" * digits
    src = tmp_path / "big.jsonl"
    src.write_text(
        f'{{"type":"result","subtype":"success","usage":{{"input_tokens":{big},"output_tokens":-{big}}},"total_cost_usd":{big}}}\n'
        f'{{"type":"assistant","message":{{"id":"m","content":[{{"type":"tool_use","id":"t","name":"Read","input":{{"file_path":"/a","offset":{big}}}}}]}}}}\n'
        '{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t"}]}}\n'
    )
    proc = normalize("--format", "claude-code", str(src))
    assert proc.returncode == 0, proc.stderr
    out = events(proc)
    assert [e["type"] for e in out] == expected
    assert "startLine" not in out[0]


@pytest.mark.parametrize("fmt", ["goose", "claude-code", "codex", "gemini-cli", "opencode"])
def test_format_flag_forces_the_format(tmp_path, fmt):
    src = tmp_path / "one.jsonl"
    src.write_text('{"type":"turn.started"}\n')
    proc = normalize("--format", fmt, str(src))
    assert proc.returncode == 0
    types = [e["type"] for e in events(proc)]
    assert types == ([] if fmt == "codex" else ["unknown"])


def test_an_unknown_format_is_a_usage_error():
    proc = normalize("--format", "aider", "-", stdin=b"")
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"aider" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    proc = normalize(str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and proc.stdout == b""
    assert len(proc.stderr.decode().splitlines()) == 1 and b"cannot read" in proc.stderr
