"""What the real CLIs printed (Claude Code 2.1.197, Codex 0.171.0; issue 36), through the normalizer.

Small transcripts written in the shapes the captures showed, one per finding: the failure each
scenario is (a refused connection, a SIGINT, a 403, a retried 401, ...) decides the expected class
and events, not the normalizer's current output. docs/contract.md's Claude Code and Codex sections
list the drift these cover.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from contracts.events import harness_event_adapter
from services.normalizer import RunNormalizer

SID = "5e1f0c2a-7b3d-4e8f-9a1b-2c3d4e5f6a7b"
T0 = 1_790_000_000_000


def run(fmt: str, records: list[dict[str, Any]], exit_code: int | None = 0) -> tuple[list[dict], RunNormalizer]:
    norm = RunNormalizer(f"{fmt}/drift", fmt=fmt)
    out: list[dict] = []
    for seq, rec in enumerate(records):
        out += norm.line(seq, T0 + seq, orjson.dumps(rec).decode())
    out += norm.end(len(records), T0 + len(records), exit_code)
    for event in out:
        harness_event_adapter.validate_python(event)
    return out, norm


def failures(events: list[dict]) -> list[tuple[str, str | None, str | None]]:
    """(type, code, errorClass) of every error and classified warning, in order."""
    return [(e["type"], e.get("code"), e.get("errorClass")) for e in events
            if e["type"] == "error" or "errorClass" in e]


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


# ---------------------------------------------------------------- Claude Code 2.1.197
def c_init() -> dict:
    return {"type": "system", "subtype": "init", "cwd": "/tmp/scratch", "session_id": SID, "tools": ["Bash", "Read"],
            "mcp_servers": [], "model": "claude-sonnet-4-5", "permissionMode": "bypassPermissions",
            "claude_code_version": "2.1.197", "uuid": "u0"}


def c_retry(attempt: int, error: str, status: int | None) -> dict:
    return {"type": "system", "subtype": "api_retry", "attempt": attempt, "max_retries": 2, "retry_delay_ms": 600,
            "error_status": status, "error": error, "session_id": SID, "uuid": f"r{attempt}"}


def c_api_error(error: str, text: str) -> dict:
    return {"type": "assistant", "message": {"id": "e3b0c442-98fc", "model": "<synthetic>", "role": "assistant",
                                             "type": "message", "stop_reason": "stop_sequence",
                                             "usage": {"input_tokens": 0, "output_tokens": 0},
                                             "content": [{"type": "text", "text": text}]},
            "parent_tool_use_id": None, "session_id": SID, "uuid": "a1", "error": error}


def c_result(**fields: Any) -> dict:
    # 2.1.197's new result fields ride along: they change nothing
    base = {"type": "result", "duration_ms": 1900, "duration_api_ms": 0, "num_turns": 1, "session_id": SID,
            "total_cost_usd": 0, "ttft_ms": None, "stop_reason": None, "permission_denials": [],
            "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0, "iterations": [], "speed": "standard"},
            "uuid": "res"}
    return {**base, **fields}


@pytest.mark.parametrize("text", ["API Error: Connection error.", "API Error: Request timed out."])
def test_claude_server_error_for_a_refused_connection_or_a_client_timeout_is_timeout(text):
    events, _ = run("claude-code", [
        c_init(),
        c_retry(1, "unknown", None),
        c_retry(2, "unknown", None),
        c_api_error("server_error", text),
        c_result(subtype="success", is_error=True, result=text, terminal_reason="completed"),
    ], exit_code=1)
    assert failures(events) == [
        ("warning", "api_retry", "timeout"),  # network retries: error `unknown`, no status
        ("warning", "api_retry", "timeout"),
        ("error", "server_error", "timeout"),  # the code stays the CLI's, the class follows the message
        ("error", None, "agent_exit"),
    ]


def test_claude_server_error_with_a_5xx_stays_provider_unavailable():
    text = 'API Error: 500 {"type":"error","error":{"type":"api_error","message":"Internal server error"}}'
    events, _ = run("claude-code", [
        c_init(),
        c_retry(1, "server_error", 500),
        c_retry(2, "overloaded", 529),
        c_api_error("server_error", text),
        c_result(subtype="success", is_error=True, result=text, api_error_status=500, terminal_reason="completed"),
    ], exit_code=1)
    assert failures(events) == [("warning", "api_retry", "provider_unavailable"),
                                ("warning", "api_retry", "provider_unavailable"),
                                ("error", "server_error", "provider_unavailable"),
                                ("error", None, "agent_exit")]


def test_claude_sigint_aborted_tools_is_cancelled_and_its_task_records_are_consumed():
    events, _ = run("claude-code", [
        c_init(),
        {"type": "assistant", "message": {"id": "msg_1", "role": "assistant", "type": "message", "model": "claude-sonnet-4-5",
                                          "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                                       "input": {"command": "sleep 30", "run_in_background": True}}]},
         "parent_tool_use_id": None, "session_id": SID, "uuid": "a1"},
        {"type": "system", "subtype": "task_started", "task_id": "b7x", "tool_use_id": "toolu_1",
         "description": "sleep 30", "session_id": SID, "uuid": "t1"},
        {"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": "[Request interrupted by user for tool use]"}]},
         "timestamp": "2026-12-05T09:00:01.500Z", "parent_tool_use_id": None, "session_id": SID, "uuid": "u1"},
        {"type": "system", "subtype": "task_notification", "task_id": "b7x", "status": "stopped",
         "summary": "Background command stopped", "session_id": SID, "uuid": "t2"},
        c_result(subtype="error_during_execution", is_error=True, terminal_reason="aborted_tools",
                 errors=["[ede_diagnostic] result_type=user last_content_type=tool_result stop_reason=tool_use"]),
    ], exit_code=130)
    assert "unknown" not in types(events)
    (command,) = [e for e in events if e["type"] == "command"]
    assert command["command"] == "sleep 30" and command["isSuccess"] is False
    assert failures(events) == [("error", "error_during_execution", "cancelled"), ("error", None, "cancelled")]


def test_claude_403_reported_as_authentication_failed_is_auth():
    text = ('API Error: 403 {"type":"error","error":{"type":"permission_error",'
            '"message":"Your API key does not have permission to use the specified resource."}}')
    events, _ = run("claude-code", [c_init(), c_api_error("authentication_failed", text),
                                    c_result(subtype="success", is_error=True, result=text, api_error_status=403,
                                             terminal_reason="completed")], exit_code=1)
    assert failures(events) == [("error", "authentication_failed", "auth"), ("error", None, "agent_exit")]


@pytest.mark.parametrize(
    ("fields", "code", "cls"),
    [
        # 2.1.197 says `completed` where the spec's builds said `api_error`: the code stays api_error
        ({"result": 'API Error: 500 {"type":"error"}', "api_error_status": 500, "terminal_reason": "completed"},
         "api_error", "provider_unavailable"),
        ({"result": "API Error: Connection error.", "terminal_reason": "completed"}, "is_error", "timeout"),
        ({"result": "Prompt is too long", "terminal_reason": "prompt_too_long"}, "prompt_too_long", "context_length"),
        ({"result": "API Error: 400 something new", "terminal_reason": "prompt_too_long"}, "prompt_too_long",
         "context_length"),
    ],
)
def test_claude_terminal_reasons_of_final_api_errors(fields, code, cls):
    events, _ = run("claude-code", [c_init(), c_result(subtype="success", is_error=True, **fields)])
    assert failures(events) == [("error", code, cls)]


def test_claude_new_fields_change_nothing_and_a_user_timestamp_is_not_the_events_clock():
    records = [
        c_init(),
        {"type": "assistant", "message": {"id": "msg_1", "role": "assistant", "type": "message", "model": "m",
                                          "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                                       "input": {"file_path": "/tmp/scratch/a.txt"}}]},
         "session_id": SID, "uuid": "a1"},
        {"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1\thello"}]},
         "timestamp": "2001-01-01T00:00:00.000Z", "session_id": SID, "uuid": "u1"},
        c_result(subtype="success", is_error=False, result="done", terminal_reason="completed",
                 usage={"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100,
                        "cache_creation_input_tokens": 0, "iterations": [{"input_tokens": 10}], "speed": "standard"},
                 total_cost_usd=0.01, ttft_ms=412, stop_reason="end_turn"),
    ]
    events, norm = run("claude-code", records)
    assert types(events) == ["read"]
    assert events[0]["timestamp"].startswith("2026-")  # the tap's ts, not the record's
    assert failures(events) == []
    assert norm.usage == {"inputTokens": 110, "outputTokens": 5, "totalTokens": 115, "cacheReadInputTokens": 100,
                          "cacheWriteInputTokens": 0, "costUsd": 0.01}


# ------------------------------------------------------------------------ Codex 0.171.0
def x_start() -> list[dict]:
    return [{"type": "thread.started", "thread_id": "019c3e9d-0e4f-7a12-8b3c-5d6e7f8091a2"}, {"type": "turn.started"}]


def test_codex_waiting_for_network_notices_are_retry_warnings_and_sigint_is_cancelled():
    notice = {"type": "error", "message": "Reconnecting... waiting for network (Connection failed: error sending request)"}
    events, _ = run("codex", [*x_start(), notice, notice, notice], exit_code=-2)
    assert failures(events) == [("warning", "retry", "timeout")] * 3 + [("error", None, "cancelled")]


@pytest.mark.parametrize("status", ["401 Unauthorized", "403 Forbidden"])
def test_codex_401_and_403_are_retried_once_then_fail_as_auth(status):
    text = f"unexpected status {status}: Incorrect API key provided: mock-***."
    events, _ = run("codex", [*x_start(),
                              {"type": "error", "message": f"Reconnecting... 1/1 ({text})"},
                              {"type": "error", "message": text},
                              {"type": "turn.failed", "error": {"message": text}}], exit_code=1)
    assert failures(events) == [("warning", "retry", "auth"), ("error", None, "auth"), ("error", None, "agent_exit")]


def test_codex_http_500_reported_only_as_high_demand_is_provider_unavailable():
    text = "We're currently experiencing high demand, which may cause temporary errors."
    events, _ = run("codex", [*x_start(),
                              {"type": "error", "message": "Reconnecting... 1/5 (" + text + ")"},
                              {"type": "error", "message": text},
                              {"type": "turn.failed", "error": {"message": text}}], exit_code=1)
    assert failures(events) == [("warning", "retry", "provider_unavailable"), ("error", None, "provider_unavailable"),
                                ("error", None, "agent_exit")]


def test_codex_file_change_without_diff_and_bin_bash_lc_commands():
    change = {"id": "item_1", "type": "file_change", "changes": [{"path": "/tmp/scratch/notes.md", "kind": "add"}],
              "status": "completed"}
    command = {"id": "item_2", "type": "command_execution", "command": "/bin/bash -lc 'cat notes.md'",
               "aggregated_output": "hi\n", "exit_code": 0, "status": "completed"}
    failing = {"id": "item_3", "type": "command_execution", "command": "/bin/bash -lc 'ls missing'",
               "aggregated_output": "ls: cannot access 'missing'\n", "exit_code": 2, "status": "failed"}
    records = [*x_start()]
    for item in (change, command, failing):
        records += [{"type": "item.started", "item": {**item, "status": "in_progress"}}, {"type": "item.completed", "item": item}]
    records.append({"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 3}})
    events, _ = run("codex", records)
    assert [(e["type"], e.get("path"), e.get("isSuccess"), e.get("exitCode")) for e in events] == [
        ("write", "/tmp/scratch/notes.md", True, None),
        ("read", "notes.md", True, None),
        ("list", "missing", False, None),
    ]


def test_codex_sigint_after_item_started_drains_the_call_and_is_cancelled():
    events, _ = run("codex", [*x_start(),
                              {"type": "item.started", "item": {"id": "item_0", "type": "command_execution",
                                                                "command": "/bin/bash -lc 'sleep 30'",
                                                                "aggregated_output": "", "exit_code": None,
                                                                "status": "in_progress"}}], exit_code=130)
    assert types(events) == ["unknown", "error"]
    assert failures(events) == [("error", None, "cancelled")]
