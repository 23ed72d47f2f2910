"""Claude Code stream-json records -> harness events (extension section 5, rows C-...).

`claude -p --output-format stream-json --verbose` writes one content block per `assistant` line
under a shared `message.id`; the shared span machinery (3.3) keyed by (kind, message id) turns
them back into one event per response part. Everything not Claude's own is in ``machinery``; MCP
names and the tool rules are in ``tools``.
"""

from __future__ import annotations

import re
from typing import Any

from contracts.formats import CLAUDE_CODE
from services.normalizer.error_classes import reason_class
from services.normalizer.machinery import (
    Event,
    Machinery,
    Record,
    fits_int64,
    format_rules,
    is_int,
    is_number,
    nonempty_str,
)
from services.normalizer.tools import classify_mcp, mcp_consumed

# C-R2: progress and bookkeeping subtypes, mapped to nothing. The background-task lifecycle
# (`task_started`, `task_updated`, `task_notification`; Claude Code 2.1.197 writes the first and last
# in a SIGINT run) joins `task_progress`: a task's tool calls are events of their own and its
# outcome reaches the agent as the result of the tool call that started it.
QUIET_SUBTYPES = frozenset(
    (
        "status",
        "compact_boundary",
        "thinking_tokens",
        "task_progress",
        "hook_started",
        "hook_progress",
        "task_started",
        "task_updated",
        "task_notification",
    )
)
# C-F3: `terminal_reason` values that name no failure code (2.1.197 writes `completed` on a final
# API error, where the spec's builds wrote `api_error`).
_NO_REASON = frozenset(("completed",))
FAILED_MCP_STATUSES = frozenset(("failed", "needs-auth"))
# 5.4: the observed `Bash` failure text; N bounded so it always fits an int64.
_EXIT_CODE = re.compile(r"(?:Error: )?Exit code (-?\d{1,18})(?!\d)")


# ------------------------------------------------------------------- records
def record(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    # Section 3: the most recent non-empty session id, the record being processed included.
    sid = rec.get("session_id")
    if type(sid) is str and sid:
        norm.session = sid
    rtype = rec.get("type")
    handler = _RECORDS.get(rtype) if type(rtype) is str else None
    if handler is None:
        # C-R11: an unrecognized record.
        norm.flush(out, ts_ms)
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    handler(norm, out, seq, ts_ms, rec)


def _system(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    # C-R1..C-R4 never flush: side-channel records.
    subtype = rec.get("subtype")
    if subtype == "init":
        servers = rec.get("mcp_servers")
        if type(servers) is list:
            for server in servers:
                if type(server) is not dict:
                    continue
                name, status = server.get("name"), server.get("status")
                if type(name) is str and type(status) is str and status in FAILED_MCP_STATUSES:
                    norm.emit(out, ts_ms, "warning", {"message": f"mcp server {name}: {status}", "code": "mcp_server"}, seq, seq)
    elif type(subtype) is str and subtype in QUIET_SUBTYPES:
        pass
    elif subtype == "api_retry":
        norm.emit(out, ts_ms, "warning", {"message": api_retry_message(rec), "code": "api_retry"}, seq, seq)
    else:
        norm.unknown(out, ts_ms, rec, seq, seq)


def api_retry_message(rec: Record) -> str:
    """C-R3: `API request failed (rate_limit, HTTP 429); retry 2/10`."""
    causes = []
    error, status = rec.get("error"), rec.get("error_status")
    if type(error) is str:
        causes.append(error)
    if is_int(status):
        causes.append(f"HTTP {status}")
    message = "API request failed"
    if causes:
        message += f" ({', '.join(causes)})"
    attempt, most = rec.get("attempt"), rec.get("max_retries")
    if is_int(attempt) and is_int(most):
        message += f"; retry {attempt}/{most}"
    return message


def _assistant(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    message = rec.get("message")
    content = message.get("content") if type(message) is dict else None
    if type(content) is not list:
        # C-R5; like goose's message record without a message, it does not flush.
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    assert type(message) is dict
    mid = message.get("id")
    if type(mid) is not str:
        mid = ""
    api_error = rec.get("error")
    if nonempty_str(api_error):
        # C-B7: a synthetic record reporting an API failure; its text is not the agent's.
        norm.flush(out, ts_ms)
        texts = [b["text"] for b in content if type(b) is dict and b.get("type") == "text" and nonempty_str(b.get("text"))]
        error_text = "\n".join(texts) if texts else f"claude code reported an API error: {api_error}"
        norm.error(out, ts_ms, error_text, api_error, seq)
    for block in content:
        btype = block.get("type") if type(block) is dict else None
        if btype == "text":
            if not nonempty_str(api_error):
                text = block.get("text")
                if type(text) is str and text:
                    norm.accumulate(out, ts_ms, "agent", mid, text, seq)
        elif btype == "thinking":
            text = block.get("thinking")
            if type(text) is str and text:
                norm.accumulate(out, ts_ms, "reasoning", mid, text, seq)
        elif btype == "redacted_thinking":
            pass
        elif btype == "tool_use":
            norm.flush(out, ts_ms)
            _tool_use(norm, out, seq, ts_ms, block)
        elif btype == "tool_result":
            norm.flush(out, ts_ms)
            _tool_result(norm, out, seq, ts_ms, block)
        else:
            norm.unknown(out, ts_ms, block, seq, seq)  # C-B6, without flushing


def _user(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    message = rec.get("message")
    if type(message) is not dict:
        norm.unknown(out, ts_ms, rec, seq, seq)  # C-R6
        return
    content = message.get("content")
    if type(content) is str:
        return  # the prompt
    if type(content) is not list:
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    for block in content:
        btype = block.get("type") if type(block) is dict else None
        if btype == "text":
            pass  # C-B1: prompt, injected skill text, interruption notes
        elif btype == "tool_result":
            norm.flush(out, ts_ms)
            _tool_result(norm, out, seq, ts_ms, block)
        else:
            norm.unknown(out, ts_ms, block, seq, seq)  # C-B6


def _result(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    # C-F5: pending span, drained calls, the failure error, then the `completed` record.
    norm.flush(out, ts_ms)
    norm.drain(out, ts_ms)
    subtype = rec.get("subtype")
    if rec.get("is_error") is True or (type(subtype) is str and subtype != "success"):
        message = failure_message(rec)
        if message not in norm.errors:  # C-F4
            # the CLI's own reason, when it names a cause, classifies the failure (a SIGINT's
            # `error_during_execution` carries only a diagnostic text and `aborted_tools`)
            norm.error(out, ts_ms, message, failure_code(rec), seq, reason_class(rec.get("terminal_reason")))
    norm.turn_ended(usage(rec))


def failure_message(rec: Record) -> str:
    """C-F2."""
    errors = rec.get("errors")
    if type(errors) is str:
        errors = [errors]
    if type(errors) is list:
        texts = [e.strip() for e in errors if type(e) is str and e.strip()]
        if texts:
            return "\n".join(texts)
    result = rec.get("result")
    if type(result) is str and result.strip():
        return result
    error = rec.get("error")
    for value in (error.get("message") if type(error) is dict else None, error):
        if type(value) is str and value.strip():
            return value
    subtype = rec.get("subtype")
    return f"claude code reported a terminal error: {subtype if type(subtype) is str else 'unknown'}"


def failure_code(rec: Record) -> str:
    """C-F3."""
    subtype = rec.get("subtype")
    if type(subtype) is str and subtype != "success":
        return subtype
    reason = rec.get("terminal_reason")
    if nonempty_str(reason):
        assert type(reason) is str
        if reason not in _NO_REASON:
            return reason
        if is_int(rec.get("api_error_status")):
            return "api_error"  # what builds before 2.1.197 said for the same failure
    return "is_error"


def usage(rec: Record) -> dict[str, Any]:
    """Section 4: the `completed` fields of a `result` (prompt total includes cache reads and writes)."""
    fields: dict[str, Any] = {}
    raw = rec.get("usage")
    if type(raw) is dict:
        inp, out = raw.get("input_tokens"), raw.get("output_tokens")
        read, write = raw.get("cache_read_input_tokens"), raw.get("cache_creation_input_tokens")
        total_in = None
        if is_int(inp):
            total_in = inp + (read if is_int(read) else 0) + (write if is_int(write) else 0)
            # A sum beyond 64 bits is no count a consumer could store: omitted.
            if fits_int64(total_in):
                fields["inputTokens"] = total_in
            else:
                total_in = None
        if is_int(out):
            fields["outputTokens"] = out
            if total_in is not None and fits_int64(total_in + out):
                fields["totalTokens"] = total_in + out
        if is_int(read):
            fields["cacheReadInputTokens"] = read
        if is_int(write):
            fields["cacheWriteInputTokens"] = write
    cost = rec.get("total_cost_usd")
    if is_number(cost):
        fields["costUsd"] = float(cost)
    return fields


def _stream_event(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    pass  # C-R8: every delta is restated by the complete assistant record


def _rate_limit(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    info = rec.get("rate_limit_info")
    status = info.get("status") if type(info) is dict else None
    if type(status) is not str or status == "allowed":
        return
    assert type(info) is dict
    message = f"rate limit status: {status}"
    kind = info.get("rateLimitType")
    if type(kind) is str:
        message += f" ({kind})"
    norm.emit(out, ts_ms, "warning", {"message": message, "code": "rate_limit"}, seq, seq)


def _error(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    # C-R10.
    norm.flush(out, ts_ms)
    error = rec.get("error")
    message = "claude code reported an error"
    for value in (error.get("message") if type(error) is dict else None, rec.get("message"), error):
        if type(value) is str and value:
            message = value
            break
    norm.error(out, ts_ms, message, None, seq)


# ---------------------------------------------------------------------- tools
def _tool_use(norm: Machinery, out: list[Event], seq: int, ts_ms: int, block: Record) -> None:
    call_id, name = block.get("id"), block.get("name")
    if type(call_id) is not str or type(name) is not str:
        norm.unknown(out, ts_ms, block, seq, seq, tool=name, call_id=call_id)  # C-P1
        return
    norm.add_call(out, ts_ms, [call_id, name, block.get("input"), block, seq, ts_ms])


def _tool_result(norm: Machinery, out: list[Event], seq: int, ts_ms: int, block: Record) -> None:
    call_id = block.get("tool_use_id")
    call = norm.take_call(call_id)  # C-P2: the oldest pending call with this id
    if call is None:
        norm.unknown(out, ts_ms, block, seq, seq, call_id=call_id)  # C-P3
        return
    _, name, args, request, req_seq, req_ts = call
    failed = block.get("is_error") is True
    kinds = classify_mcp(name, args)
    exit_code = _exit_code(block) if failed else None
    tail: dict[str, Any] = {"tool": name, "toolCallId": call_id, "durationMs": ts_ms - req_ts}
    # 5.3: a tool-built unknown carries the request, not the (possibly huge) result.
    norm.tool_events(out, ts_ms, kinds, request, tail, req_seq, seq, not failed, exit_code)


def _exit_code(block: Record) -> int | None:
    """5.4: `Exit code N` at the start of a failed result's text (string content, else first text block)."""
    content = block.get("content")
    text = None
    if type(content) is str:
        text = content
    elif type(content) is list:
        for part in content:
            if type(part) is dict and part.get("type") == "text":
                text = part.get("text")
                break
    if type(text) is not str:
        return None
    match = _EXIT_CODE.match(text)
    return int(match.group(1)) if match else None


_RECORDS = {
    "system": _system,
    "assistant": _assistant,
    "user": _user,
    "result": _result,
    "stream_event": _stream_event,
    "rate_limit_event": _rate_limit,
    "error": _error,
}

RULES = format_rules(CLAUDE_CODE, record=record, consumed=mcp_consumed)
