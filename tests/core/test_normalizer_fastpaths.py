"""The normaliser's fast paths give exactly what the reference path gives.

Fast paths: the batch loops of ``RunNormalizer.lines`` (goose's inline text delta, the formats'
dispatch tables), the timestamp formatter's cached second and millisecond table, the shell
classifier's shared (cached) kinds, the once-per-line bracket count of the depth guard, the
path normaliser's already-normal shortcut and the tool classifiers' per-name handler memo.
The reference: one ``line`` call per entry, ``timefmt._format``, ``classify_shell``, ``paths._resolve``,
``tools.classify_tool`` / ``classify_extended``.

Inputs are the shared fixtures' lines and mutations of them (a key dropped, a value replaced at
any depth), so the shapes the fast paths take are hit both as they are and just off them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.normalizer import Limits, RawLine, RunNormalizer
from services.normalizer.formats import goose as goose_format
from services.normalizer.paths import _resolve, normalize_path
from services.normalizer.shell import classify_shell, shell_kinds
from services.normalizer.timefmt import MAX_MS, MIN_MS, _format, format_ms
from services.normalizer.tools import (
    HandlerMemo,
    classify_extended,
    classify_mcp,
    classify_tool,
    mcp_handler,
    strip_mcp,
    tool_handler,
)
from tests.support.fixtures import SHARED, transcript_lines

FORMATS_DIRS = {"goose": "goose", "claude-code": "claude-code", "codex": "codex", "gemini-cli": "gemini-cli", "opencode": "opencode"}
FIXTURES = {
    fmt: [line for path in sorted((SHARED / "fixtures" / d).glob("*.jsonl")) for line in transcript_lines(Path(path))]
    for fmt, d in FORMATS_DIRS.items()
}
assert all(FIXTURES.values()), "no shared fixtures found"
T0 = 1_790_000_000_000
small = Limits(max_span_chars=40, max_pending_tools=2)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6) | st.sampled_from(["text", "toolRequest", "tool_use", "command_execution", "assistant"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path inside a parsed JSON value."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found.append((*prefix, i))
            found.extend(_paths(child, (*prefix, i)))
    return found


@st.composite
def fixture_line(draw: st.DrawFn, fmt: str) -> str:
    """A fixture line of the format, as it is or with one mutation at any depth."""
    line = draw(st.sampled_from(FIXTURES[fmt]))
    how = draw(st.sampled_from(["as is", "as is", "drop", "replace"]))
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    paths = _paths(record)
    if how == "as is" or not paths:
        return line
    path = draw(st.sampled_from(paths))
    parent = record
    for step in path[:-1]:
        parent = parent[step]
    if how == "drop":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return orjson.dumps(record).decode()


@st.composite
def runs(draw: st.DrawFn) -> tuple[str | None, list[tuple[str, str]], list[int]]:
    fmt = draw(st.sampled_from(list(FIXTURES)))
    items = draw(st.lists(st.tuples(fixture_line(fmt), st.sampled_from(["stdout"] * 5 + ["stderr"])), max_size=40))
    # Timestamps that repeat, step within a second and cross seconds (the formatter's cache).
    steps = draw(st.lists(st.sampled_from([0, 0, 1, 7, 999, 1000, 86_400_000]), min_size=len(items), max_size=len(items)))
    ts, stamps = T0 - 3, []
    for step in steps:
        ts += step
        stamps.append(ts)
    declared = draw(st.sampled_from([fmt, None]))
    return declared, items, stamps


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(runs(), st.sampled_from([Limits(), small]), st.integers(1, 5))
def test_batches_give_the_events_and_state_of_one_call_per_line(run, limits, pieces):
    fmt, items, stamps = run
    reference = RunNormalizer("r", limits, fmt)
    expected = []
    for seq, ((line, stream), ts) in enumerate(zip(items, stamps, strict=True)):
        expected.extend(reference.line(seq, ts, line, stream))
    expected.extend(reference.end(len(items), stamps[-1] if stamps else T0))

    batch = RunNormalizer("r", limits, fmt)
    entries = [RawLine(seq, ts, line, stream) for seq, ((line, stream), ts) in enumerate(zip(items, stamps, strict=True))]
    got: list[dict[str, Any]] = []
    size = max(1, len(entries) // pieces)
    for start in range(0, len(entries), size):
        # Resumed from bytes between batches, as a worker that lost the run would.
        batch = RunNormalizer.from_bytes(batch.to_bytes(), limits)
        got.extend(batch.lines(iter(entries[start : start + size])))
    got.extend(batch.end(len(items), stamps[-1] if stamps else T0))
    assert orjson.dumps(got) == orjson.dumps(expected)
    assert batch.to_bytes() == reference.to_bytes()
    assert batch.counts_by_type() == reference.counts_by_type()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(MIN_MS, MAX_MS) | st.integers(T0 - 2000, T0 + 2000), max_size=20))
def test_the_timestamp_cache_formats_like_the_reference(stamps):
    for ms in stamps:
        assert format_ms(ms) == _format(ms)


def test_the_timestamp_cache_at_the_edges():
    for ms in (MIN_MS, MIN_MS + 999, -1001, -1000, -999, -1, 0, 1, 999, 1000, T0, MAX_MS - 999, MAX_MS):
        assert format_ms(ms) == format_ms(ms) == _format(ms), ms


COMMANDS = ["cat a b", "cat > out", "sed -n 1,5p f", "rg -n foo src", "grep -r x .", "ls -la /tmp", "find . -name x",
            "bash -lc 'cat a'", "npm test", "", "cat 'unterminated"]


@given(st.sampled_from(COMMANDS) | st.text(max_size=30))
def test_shared_shell_kinds_are_the_classifier_s_result(command):
    kinds = shell_kinds(command)
    assert classify_shell(command) == (None if kinds is None else [dict(k) for k in kinds])


def test_changing_an_event_never_changes_a_later_one():
    """Kinds come from a shared cache: an event must own its fields (the redactor edits events)."""
    line = orjson.dumps({"type": "item.completed", "item": {"id": "i", "type": "command_execution",
                                                              "command": "cat /etc/hosts", "status": "completed"}}).decode()
    first = RunNormalizer("r", fmt="codex").lines([RawLine(0, T0, line)])
    for event in first:
        for key in list(event):
            if key not in ("eventId", "runId", "seq", "type"):
                event[key] = "[REDACTED]"
    again = RunNormalizer("r", fmt="codex").lines([RawLine(0, T0, line)])
    assert again[0]["path"] == "/etc/hosts"
    assert shell_kinds("cat /etc/hosts") == ({"type": "read", "path": "/etc/hosts"},)


# Paths built from the characters that matter to the shortcut (`/`, `.`), plus any text.
path_texts = st.text(alphabet="/.a", max_size=12) | st.text(max_size=12)


@settings(max_examples=1000)
@given(path_texts | path_texts.map(lambda p: "/" + p))
def test_the_already_normal_path_shortcut_gives_the_reference_result(path):
    assert normalize_path(path) == (_resolve(path) if path.startswith("/") else path)


def test_the_path_shortcut_at_the_edges():
    for path in ("/", "//", "/.", "/..", "/a/.", "/a/..", "/a/", "/.hidden", "/a/.b", "/a//b", "/a/b"):
        assert normalize_path(path) == _resolve(path), path


TOOL_NAMES = ["read", "Read", "READ", "write", "Edit", "MultiEdit", "NotebookEdit", "NotebookRead", "text_editor",
              "developer__shell", "shell", "Bash", "PowerShell", "Grep", "glob", "LS", "tree", "load_skill", "Skill",
              "todo__write", "TodoWrite", "x__todowrite", "mcp__fs__read", "mcp__todo__x", "mcp__", "__read", "a__b__c"]
tool_args = st.none() | json_values | st.fixed_dictionaries(
    {},
    optional={
        "path": st.sampled_from(["/a//b/../c/", "rel/x", "", "/"]) | json_values,
        "file_path": st.sampled_from(["/a/b.py", "/a/./b"]) | json_values,
        "command": st.sampled_from(["view", "write", "cat a b", "ls -la", "npm test"]) | json_values,
        "offset": st.integers(-2, 5) | json_values,
        "limit": st.integers(-2, 5),
        "pattern": st.text(max_size=5),
        "name": st.text(max_size=5),
    },
)


@settings(max_examples=500)
@given(st.lists(st.tuples(st.sampled_from(TOOL_NAMES) | st.text(max_size=10), tool_args), max_size=8))
def test_classifying_through_the_handler_memo_gives_the_reference_result(calls):
    # The formats' shared memos, and memos so small that they are forgotten between calls.
    goose_tiny, claude_tiny = HandlerMemo(tool_handler, most=2), HandlerMemo(mcp_handler, most=2)
    for name, args in calls:
        goose_expected = classify_tool(name, args)
        assert goose_format.classify(name, args) == goose_expected
        assert goose_tiny.classify(name, args) == goose_expected
        claude_expected = classify_extended(strip_mcp(name), args)
        assert classify_mcp(name, args) == claude_expected
        assert claude_tiny.classify(name, args) == claude_expected
