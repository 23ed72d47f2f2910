"""Codex `exec --json` records -> harness events (extension section 6, rows X-...).

Codex items arrive whole, so no span is ever held: each item's events are emitted when its
`item.completed` is processed. Started tool items are pending calls of the shared machinery
(``machinery``), which pairs, evicts and drains them like goose's and Claude's; MCP calls are
named and classified by the tool rules (``tools``), as Claude Code's are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from contracts.formats import CODEX
from services.normalizer.machinery import (
    CALL_SEQ,
    CALL_TS,
    Event,
    Machinery,
    Record,
    fits_int64,
    format_rules,
    is_int,
    nonempty_str,
)
from services.normalizer.paths import normalize_path
from services.normalizer.shell import shell_kinds
from services.normalizer.tools import MCP_PREFIX, classify_mcp, mcp_consumed, mcp_label

# X-R3: items that are tool calls (recorded when started).
TOOL_ITEMS = frozenset(("command_execution", "file_change", "mcp_tool_call", "web_search", "collab_tool_call"))
# X-E1: retry notices, in the newest and the older core's wording; 0.171 also waits for the network
# without a budget ("Reconnecting... waiting for network (Connection failed: ...)", endlessly by default).
_RETRY = re.compile(r"^Reconnecting\.\.\. (?:\d+/\d+|waiting for network)|; retrying \d+/\d+ in ")


def consumed(name: str) -> bool:
    # Only MCP names can be consumed (extension `todo`); item-type names never are.
    return name.startswith(MCP_PREFIX) and mcp_consumed(name)


def record(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    rtype = rec.get("type")
    handler = _RECORDS.get(rtype, _unrecognized) if type(rtype) is str else _unrecognized
    handler(norm, out, seq, ts_ms, rec)


def _unrecognized(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.unknown(out, ts_ms, rec, seq, seq)  # X-R8


def _nothing(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    pass  # X-R2


def _thread_started(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    thread = rec.get("thread_id")
    if nonempty_str(thread):
        norm.session = thread  # X-R1, section 3


def _turn_completed(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.drain(out, ts_ms)  # X-R5
    norm.turn_ended(usage(rec))


def tool_label(item: Record) -> str:
    """X-S3: the item type, or `mcp__<server>__<tool>` for an MCP call with string names."""
    itype = item.get("type")
    if itype == "mcp_tool_call":
        server, tool = item.get("server"), item.get("tool")
        if type(server) is str and type(tool) is str:
            return mcp_label(server, tool)
    return itype if type(itype) is str else ""


def _item_id(item: Record) -> str:
    item_id = item.get("id")
    return item_id if type(item_id) is str else ""  # X-P1: a missing id is the empty id


def _started(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    item = rec.get("item")
    if type(item) is not dict:
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    itype = item.get("type")
    if type(itype) is str and itype in TOOL_ITEMS:
        norm.add_call(out, ts_ms, [_item_id(item), tool_label(item), None, item, seq, ts_ms])


def _completed(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    item = rec.get("item")
    if type(item) is not dict:
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    itype = item.get("type")
    # One function per item type (the X-I rows), found by one dict lookup, not a chain of tests.
    handler = _COMPLETED.get(itype, _completed_other) if type(itype) is str else _completed_other
    handler(norm, out, seq, ts_ms, item)


def _completed_text(norm: Machinery, out: list[Event], seq: int, ts_ms: int, item: Record) -> None:
    text = item.get("text")
    if type(text) is str and text:
        norm.whole_text(out, ts_ms, "reasoning" if item["type"] == "reasoning" else "agent", text, seq)


def _completed_todo(norm: Machinery, out: list[Event], seq: int, ts_ms: int, item: Record) -> None:
    pass  # X-I7


def _completed_error(norm: Machinery, out: list[Event], seq: int, ts_ms: int, item: Record) -> None:
    message = item.get("message")
    text = message if nonempty_str(message) else "codex reported a non-fatal error"
    norm.emit(out, ts_ms, "warning", {"message": text}, seq, seq)  # X-I8


def _completed_other(norm: Machinery, out: list[Event], seq: int, ts_ms: int, item: Record) -> None:
    norm.unknown(out, ts_ms, item, seq, seq)  # X-I9: no tool extras


def _completed_tool(norm: Machinery, out: list[Event], seq: int, ts_ms: int, item: Record) -> None:
    item_id = item.get("id")
    if type(item_id) is not str:
        item_id = ""  # X-P1: a missing id is the empty id
    itype = item["type"]
    # X-P2. Only a tool item settles a started record (only those are recorded), so a forged
    # non-tool item reusing an id never makes a pending call vanish without its `unknown`.
    started = norm.take_call(item_id)
    label = tool_label(item)
    first = seq
    tail: dict[str, Any]
    if started is not None:
        first = started[CALL_SEQ]
        tail = {"tool": label, "toolCallId": item_id, "durationMs": ts_ms - started[CALL_TS]}  # X-S2
    else:
        tail = {"tool": label, "toolCallId": item_id}
    kinds: Sequence[Mapping[str, Any]] | None = None
    if itype == "command_execution":
        command = item.get("command")
        if type(command) is str and command:
            kinds = shell_kinds(command) or ({"type": "command", "command": command},)
    elif itype == "file_change":
        kinds = _writes(item.get("changes"))
    elif itype == "mcp_tool_call":
        if label.startswith(MCP_PREFIX):
            kinds = classify_mcp(label, item.get("arguments"))
    norm.tool_events(out, ts_ms, kinds, item, tail, first, seq, success(item), item.get("exit_code"))


_COMPLETED = {
    "command_execution": _completed_tool,
    "agent_message": _completed_text,
    "reasoning": _completed_text,
    "plan": _completed_text,
    "file_change": _completed_tool,
    "mcp_tool_call": _completed_tool,
    "web_search": _completed_tool,
    "collab_tool_call": _completed_tool,
    "todo_list": _completed_todo,
    "error": _completed_error,
}
assert {t for t, h in _COMPLETED.items() if h is _completed_tool} == TOOL_ITEMS


def _writes(changes: Any) -> list[dict[str, Any]] | None:
    """X-I4: one write per change with a non-empty string path; none usable -> unmapped."""
    if type(changes) is not list:
        return None
    writes = [
        {"type": "write", "path": normalize_path(change["path"])}
        for change in changes
        if type(change) is dict and nonempty_str(change.get("path"))
    ]
    return writes or None


def success(item: Record) -> bool | None:
    """X-S1."""
    status = item.get("status")
    if status == "completed":
        return True
    if status in ("failed", "declined"):
        return False
    exit_code = item.get("exit_code")
    if item.get("type") == "command_execution" and is_int(exit_code):
        return bool(exit_code == 0)
    return None


def _turn_failed(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.drain(out, ts_ms)  # X-R6
    error = rec.get("error")
    message = error.get("message") if type(error) is dict else None
    text = message if type(message) is str and message else "codex turn failed"
    if text not in norm.errors:  # X-E3
        norm.error(out, ts_ms, text, "turn_failed", seq)
    norm.turn_ended(None)


def _error(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    error = rec.get("error")
    message = "codex reported an error"
    for value in (rec.get("message"), error.get("message") if type(error) is dict else None, error):
        if type(value) is str and value:
            message = value
            break
    if _RETRY.search(message):
        norm.emit(out, ts_ms, "warning", {"message": message, "code": "retry"}, seq, seq)  # X-E1
    else:
        norm.error(out, ts_ms, message, None, seq)  # X-E2


def usage(rec: Record) -> dict[str, Any]:
    """Section 4: `turn.completed.usage` (Codex's input already includes cached tokens)."""
    fields: dict[str, Any] = {}
    raw = rec.get("usage")
    if type(raw) is not dict:
        return fields
    inp, out = raw.get("input_tokens"), raw.get("output_tokens")
    if is_int(inp):
        fields["inputTokens"] = inp
    if is_int(out):
        fields["outputTokens"] = out
    if is_int(inp) and is_int(out) and fits_int64(inp + out):
        fields["totalTokens"] = inp + out
    for src, dst in (("cached_input_tokens", "cacheReadInputTokens"), ("cache_write_input_tokens", "cacheWriteInputTokens")):
        value = raw.get(src)
        if is_int(value):
            fields[dst] = value
    return fields


_RECORDS = {
    "item.completed": _completed,
    "item.started": _started,
    "turn.started": _nothing,
    "item.updated": _nothing,
    "item.plan.delta": _nothing,
    "thread.started": _thread_started,
    "turn.completed": _turn_completed,
    "turn.failed": _turn_failed,
    "error": _error,
}

RULES = format_rules(CODEX, record=record, consumed=consumed)
