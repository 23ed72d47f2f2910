"""Property tests of the normaliser for every input format (goose, Claude Code, Codex, Gemini CLI,
opencode, detected).

Arbitrary input never raises and every event honours the contract; cutting a run anywhere and
resuming from serialized state gives identical events; the batch API gives the same events as
one call per line; JSON values no consumer can take (deep, huge) never raise.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.events import harness_event_adapter
from services.normalizer import Limits, RawLine, RunNormalizer
from services.normalizer.machinery import MAX_JSON_DEPTH, json_depth
from tests.support.fixtures import SHARED, TRANSCRIPTS, transcript_lines

FIXTURE_LINES = [
    line
    for path in [*TRANSCRIPTS, *sorted((SHARED / "fixtures" / "claude-code").glob("*.jsonl")),
                 *sorted((SHARED / "fixtures" / "codex").glob("*.jsonl")),
                 *sorted((SHARED / "fixtures" / "gemini-cli").glob("*.jsonl")),
                 *sorted((SHARED / "fixtures" / "opencode").glob("*.jsonl"))]
    for line in transcript_lines(Path(path))
]
assert FIXTURE_LINES, "no shared fixtures found"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
ids = st.sampled_from(["", "m1", "m2", "t1", "t2", "item_1"]) | st.none() | st.integers(0, 9)
tool_names = st.sampled_from(
    ["Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "NotebookRead", "Bash", "PowerShell", "Grep", "Glob", "LS",
     "Skill", "TodoWrite", "Task", "WebFetch", "mcp__fs__read", "mcp__todo__x", "mcp__gh__search"]
) | st.text(max_size=8)
args = st.fixed_dictionaries(
    {},
    optional={
        "file_path": st.sampled_from(["/a//b/../c/", "rel/./x", "", "/"]) | json_values,
        "notebook_path": st.sampled_from(["/n/../d.ipynb", ""]) | json_values,
        "command": st.sampled_from(["cat a b", "ls -la", "sed -n 1,5p f", "rg foo src", "npm test"]) | json_values,
        "offset": st.integers(-2, 5) | json_values,
        "limit": st.integers(-2, 5),
        "pattern": st.text(max_size=5),
        "skill": st.text(max_size=5),
        "path": st.text(max_size=5),
    },
)
sessions = st.sampled_from(["S1", "S2", ""]) | json_values
c_blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10) | json_values}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=10) | json_values}),
    st.fixed_dictionaries({"type": st.just("redacted_thinking"), "data": st.text(max_size=5)}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": ids, "name": tool_names}, optional={"input": args | json_values}),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": ids},
        optional={"content": st.sampled_from(["Exit code 1\nx", "Error: Exit code 2", "ok"]) | json_values,
                  "is_error": st.booleans() | json_values},
    ),
    json_values,
)
c_records = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["assistant", "user"]),
         "message": st.fixed_dictionaries({"id": ids, "content": st.lists(c_blocks, max_size=3) | json_values}) | json_values},
        optional={"session_id": sessions, "error": st.sampled_from(["server_error", ""]) | json_values},
    ),
    st.fixed_dictionaries(
        {"type": st.just("system"), "subtype": st.sampled_from(["init", "api_retry", "status", "task_started"]) | json_values},
        optional={"mcp_servers": st.lists(st.fixed_dictionaries({"name": json_values, "status": st.sampled_from(["failed", "ok"])}), max_size=2) | json_values,
                  "error": json_values, "error_status": json_values, "attempt": json_values, "max_retries": json_values,
                  "session_id": sessions},
    ),
    st.fixed_dictionaries(
        {"type": st.just("result")},
        optional={"subtype": st.sampled_from(["success", "error_max_turns"]) | json_values, "is_error": st.booleans() | json_values,
                  "errors": json_values, "result": json_values, "terminal_reason": json_values, "total_cost_usd": json_values,
                  "usage": st.fixed_dictionaries({}, optional={"input_tokens": json_values, "output_tokens": json_values,
                                                               "cache_read_input_tokens": json_values,
                                                               "cache_creation_input_tokens": json_values}) | json_values},
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["rate_limit_event", "stream_event", "error", "conversation_reset"])},
                          optional={"rate_limit_info": json_values, "error": json_values, "message": json_values}),
)
x_items = st.fixed_dictionaries(
    {"id": ids, "type": st.sampled_from(["agent_message", "reasoning", "plan", "command_execution", "file_change", "mcp_tool_call",
                                         "web_search", "collab_tool_call", "todo_list", "error", "other"]) | json_values},
    optional={"text": json_values, "command": st.sampled_from(["bash -lc 'cat a'", "ls", ""]) | json_values,
              "exit_code": st.integers(-1, 2) | json_values, "status": st.sampled_from(["completed", "failed", "declined", "in_progress"]) | json_values,
              "changes": st.lists(st.fixed_dictionaries({"path": st.sampled_from(["/a/../b", "", "rel"]) | json_values}), max_size=2) | json_values,
              "server": st.sampled_from(["fs", "todo"]) | json_values, "tool": st.sampled_from(["read", "write"]) | json_values,
              "arguments": args | json_values, "message": json_values},
)
x_records = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["item.started", "item.completed", "item.updated"]), "item": x_items | json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["thread.started", "turn.started", "turn.completed", "turn.failed", "error", "x"])},
                          optional={"thread_id": json_values, "usage": json_values, "error": json_values, "message": json_values}),
)
# Gemini CLI (gemini-cli-stream-format section 2): every field of every record may break its schema.
g_tool_names = st.sampled_from(["read_file", "write_file", "replace", "run_shell_command", "glob", "grep_search",
                                "list_directory", "activate_skill", "write_todos", "tracker_create_task",
                                "mcp_fs_read", "mcp_x", "google_web_search"]) | json_values
g_outputs = st.sampled_from(["Command exited with code: 1", "Command exited with code: 99999999999999999999",
                             "Command terminated by signal: SIGKILL", "", "ok"]) | json_values
g_records = st.one_of(
    st.fixed_dictionaries({"type": st.just("init")}, optional={"session_id": sessions, "model": json_values}),
    st.fixed_dictionaries({"type": st.just("message"), "role": st.sampled_from(["user", "assistant", "system"]) | json_values},
                          optional={"content": st.text(max_size=10) | json_values, "delta": json_values}),
    st.fixed_dictionaries({"type": st.just("tool_use")},
                          optional={"tool_name": g_tool_names, "tool_id": ids, "parameters": args | json_values,
                                    "timestamp": st.sampled_from(["2026-12-06T05:33:32.252Z", "junk"]) | json_values}),
    st.fixed_dictionaries({"type": st.just("tool_result")},
                          optional={"tool_id": ids, "status": st.sampled_from(["success", "error"]) | json_values,
                                    "output": g_outputs, "error": json_values,
                                    "timestamp": st.sampled_from(["2026-12-06T05:33:33.000Z", "0001-01-01T00:00:00Z"]) | json_values}),
    st.fixed_dictionaries({"type": st.just("error")},
                          optional={"severity": st.sampled_from(["warning", "error"]) | json_values, "message": json_values}),
    st.fixed_dictionaries({"type": st.just("result")},
                          optional={"status": json_values, "error": st.fixed_dictionaries({}, optional={"type": json_values, "message": json_values}) | json_values,
                                    "stats": st.fixed_dictionaries({}, optional={"input_tokens": json_values, "output_tokens": json_values,
                                                                                 "cached": json_values}) | json_values}),
)
# opencode (opencode-run-json-format section 2), with the `sessionID` that names the format.
o_tools = st.sampled_from(["read", "write", "edit", "bash", "glob", "grep", "list", "skill", "todowrite", "apply_patch",
                           "invalid", "task", "fs_read"]) | json_values
o_states = st.fixed_dictionaries(
    {"status": st.sampled_from(["completed", "error", "running"]) | json_values},
    optional={"input": args | json_values, "metadata": st.fixed_dictionaries({}, optional={"exit": st.integers(-2, 2) | json_values,
                                                                                        "files": json_values}) | json_values,
              "time": st.fixed_dictionaries({}, optional={"start": json_values, "end": json_values}) | json_values,
              "error": json_values},
)
o_parts = st.fixed_dictionaries(
    {},
    optional={"text": st.text(max_size=10) | json_values, "synthetic": json_values, "tool": o_tools, "callID": ids,
              "state": o_states | json_values, "reason": st.sampled_from(["stop", "length", "content-filter", "tool-calls"]) | json_values,
              "tokens": st.fixed_dictionaries({}, optional={"input": json_values, "output": json_values, "reasoning": json_values,
                                                            "cache": json_values}) | json_values,
              "cost": json_values},
)
o_records = st.fixed_dictionaries(
    {"type": st.sampled_from(["step_start", "text", "reasoning", "tool_use", "step_finish", "error", "done", "x"]) | json_values,
     "sessionID": sessions},
    optional={"part": o_parts | json_values,
              "error": st.fixed_dictionaries({}, optional={"name": st.sampled_from(["APIError", "ContextOverflowError"]) | json_values,
                                                           "data": st.fixed_dictionaries({}, optional={"message": json_values, "statusCode": json_values}) | json_values}) | json_values},
)
lines = st.one_of(
    st.one_of(c_records, x_records, g_records, o_records, json_values).map(lambda r: orjson.dumps(r).decode()),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "replace")),
    st.integers(0, len(FIXTURE_LINES) - 1).map(FIXTURE_LINES.__getitem__),
)
streams = st.sampled_from(["stdout", "stdout", "stdout", "stderr"])
runs = st.lists(st.tuples(lines, streams), max_size=30)
formats = st.sampled_from([None, "goose", "claude-code", "codex", "gemini-cli", "opencode"])
labels = st.tuples(st.none() | st.sampled_from(["goose", "claude-code", "codex", "gemini-cli", "opencode", "aider", ""]),
                   st.none() | st.sampled_from(["claude/2", "codex-exec", "goose/1", "gemini/0.61", "opencode", "x"]))
small = Limits(max_span_chars=24, max_pending_tools=3, max_pending_tool_bytes=600)
T0 = 1_790_000_000_000


def _feed(norm: RunNormalizer, items, start: int = 0) -> list[dict]:
    out = []
    for i, (line, stream) in enumerate(items, start):
        out.extend(norm.line(i, T0 + i, line, stream))
    return out


def _assert_contract(events: list[dict], run: str = "r") -> None:
    for n, event in enumerate(events):
        assert event["seq"] == n and event["eventId"] == f"{run}:{n}"
        assert all(value is not None for value in event.values()), event
        harness_event_adapter.validate_python(event)
        assert orjson.loads(orjson.dumps(event)) == event


def _start(fmt, label, limits) -> tuple[RunNormalizer, list[dict]]:
    norm = RunNormalizer("r", limits, fmt)
    return norm, norm.apply_labels(label[0], label[1], 0, T0)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(runs, formats, labels, st.sampled_from([Limits(), small]), st.none() | st.integers(-3, 3),
       st.none() | st.integers(1, 15))
def test_arbitrary_input_never_raises_and_events_honour_the_contract(items, fmt, label, limits, exit_code, signal):
    norm, events = _start(fmt, label, limits)
    events += _feed(norm, items)
    events += norm.end(len(items), T0 + len(items), exit_code, signal=signal)
    _assert_contract(events)
    assert norm.span is None and norm.pending == []


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(runs, st.sets(st.integers(0, 30)), formats, labels, st.sampled_from([Limits(), small]))
def test_cutting_a_run_and_resuming_from_bytes_gives_the_same_events(items, cuts, fmt, label, limits):
    one_pass, expected = _start(fmt, label, limits)
    expected += _feed(one_pass, items) + one_pass.end(len(items), 7)

    norm, pieces = _start(fmt, label, limits)
    for i, item in enumerate(items):
        if i in cuts:
            norm = RunNormalizer.from_bytes(norm.to_bytes(), limits)
        pieces.extend(_feed(norm, [item], i))
    norm = RunNormalizer.from_bytes(norm.to_bytes(), limits)
    pieces.extend(norm.end(len(items), 7))
    assert orjson.dumps(pieces) == orjson.dumps(expected)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(runs, formats, st.sampled_from([Limits(), small]))
def test_the_batch_api_gives_the_same_events_as_one_call_per_line(items, fmt, limits):
    reference = RunNormalizer("r", limits, fmt)
    expected = _feed(reference, items)
    batch = RunNormalizer("r", limits, fmt)
    got = batch.lines([RawLine(i, T0 + i, line, stream) for i, (line, stream) in enumerate(items)])
    assert orjson.dumps(got) == orjson.dumps(expected)
    assert batch.to_bytes() == reference.to_bytes()


HOLE = "@@HOLE@@"


def _with(record, text: str) -> str:
    """The record as JSON with `text` (JSON no writer may produce: too deep, too large) at HOLE."""
    return orjson.dumps(record).decode().replace(f'"{HOLE}"', text)


def _nested(depth: int, use_list: bool) -> str:
    return ("[" * depth + "1" + "]" * depth) if use_list else ('{"k":' * depth + "1" + "}" * depth)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1100), st.booleans(), formats,
       st.sampled_from(["raw", "claude-input", "codex-item", "goose-args", "gemini-params", "opencode-input"]))
def test_deep_json_never_raises(depth, use_list, fmt, where):
    deep = HOLE
    record = {
        "raw": deep,
        "claude-input": {"type": "assistant", "message": {"id": "m", "content": [{"type": "tool_use", "id": "t", "name": "X", "input": deep}]}},
        "codex-item": {"type": "item.completed", "item": {"id": "i", "type": "other", "x": deep}},
        "goose-args": {"type": "message", "message": {"role": "assistant", "content": [
            {"type": "toolRequest", "id": "c", "toolCall": {"value": {"name": "x", "arguments": deep}}}]}},
        "gemini-params": {"type": "tool_use", "tool_name": "x", "tool_id": "t", "parameters": deep},
        "opencode-input": {"type": "tool_use", "sessionID": "s", "part": {"tool": "x", "callID": "c",
                                                                          "state": {"status": "completed", "input": deep}}},
    }[where]
    text = _with(record, _nested(depth, use_list))
    norm = RunNormalizer("r", fmt=fmt)
    events = norm.line(0, T0, text) + norm.end(1, T0 + 1, 1)
    _assert_contract(events)
    # A value nested deeper than the contract keeps is carried as the line's text instead.
    assert all(json_depth(e.get("raw")) <= MAX_JSON_DEPTH for e in events)
    assert json_depth(norm.to_state()) <= MAX_JSON_DEPTH + 4
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:  # beyond orjson's parser (1024 levels): a non-JSON line
        assert events[0]["type"] == "warning"
        return
    if depth > MAX_JSON_DEPTH + 3:
        assert any(e.get("raw") == text for e in events), events


@settings(max_examples=100, deadline=None)
@given(st.integers(-(10**40), 10**40), formats)
def test_huge_integers_anywhere_never_raise(n, fmt):
    h = HOLE
    records = [
        {"type": "result", "subtype": "success", "total_cost_usd": h,
         "usage": {"input_tokens": h, "output_tokens": h, "cache_read_input_tokens": h, "cache_creation_input_tokens": h}},
        {"type": "turn.completed", "usage": {"input_tokens": h, "output_tokens": h, "cached_input_tokens": h}},
        {"type": "item.completed", "item": {"id": "i", "type": "command_execution", "command": "make", "exit_code": h}},
        {"type": "complete", "total_tokens": h, "cost_usd": h},
        {"type": "system", "subtype": "api_retry", "attempt": h, "max_retries": h, "error_status": h},
        {"type": "message", "message": {"role": "user", "content": [{"type": "toolResponse", "id": h}]}, "x": h},
        {"type": "result", "status": "success", "stats": {"input_tokens": h, "output_tokens": h, "cached": h}},
        {"type": "tool_use", "tool_name": "read_file", "tool_id": "g", "parameters": {"file_path": "a", "start_line": h, "limit": h}},
        {"type": "tool_result", "tool_id": "g", "status": "success", "output": f"Command exited with code: {h}"},
        {"type": "step_finish", "sessionID": "s", "part": {"reason": "stop", "cost": h,
                                                           "tokens": {"input": h, "output": h, "reasoning": h, "cache": {"read": h, "write": h}}}},
        {"type": "tool_use", "sessionID": "s", "part": {"tool": "bash", "callID": "b", "state": {
            "status": "completed", "input": {"command": "make", "offset": h}, "metadata": {"exit": h}, "time": {"start": 0, "end": h}}}},
        {"type": "error", "sessionID": "s", "error": {"name": "APIError", "data": {"message": "x", "statusCode": h}}},
    ]
    norm = RunNormalizer("r", fmt=fmt)
    events = []
    for i, rec in enumerate(records):
        events += norm.line(i, T0 + i, _with(rec, str(n)))
    events += norm.end(9, T0 + 9)
    _assert_contract(events)
    orjson.dumps(norm.to_state())
    if norm.usage:
        orjson.dumps(norm.usage)


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=50), st.integers(1, 200_000), formats)
def test_huge_strings_never_raise(piece, times, fmt):
    s = (piece * (times // len(piece) + 1))[:times]
    norm = RunNormalizer("r", Limits(max_span_chars=1000), fmt)
    lines_in = [
        orjson.dumps({"type": "assistant", "message": {"id": "m", "content": [{"type": "text", "text": s}]}}).decode(),
        orjson.dumps({"type": "item.completed", "item": {"id": "i", "type": "agent_message", "text": s}}).decode(),
        orjson.dumps({"type": "message", "role": "assistant", "content": s, "delta": True}).decode(),
        orjson.dumps({"type": "text", "sessionID": "s", "part": {"text": s}}).decode(),
        s,
    ]
    events = norm.lines([RawLine(i, T0 + i, line) for i, line in enumerate(lines_in)]) + norm.end(len(lines_in), T0)
    _assert_contract(events)
    # Agent texts are cut at the cap; a warning line is kept whole (the raw log keeps it too).
    assert all(len(e["message"]) <= 1000 for e in events if e["type"] in ("agent", "reasoning"))
