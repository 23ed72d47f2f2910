"""Gemini CLI `-p ... --output-format stream-json` records -> harness events (rules G-... of
gemini-cli-stream-format.md section 8, decisions in docs/contract.md "Gemini CLI").

Assistant text arrives as deltas without message ids: they accumulate in the shared span under the
empty id (G-R3) until any other record flushes it. `tool_use`/`tool_result` pair by `tool_id`
through the shared pending calls. One `result` per run flushes, drains, reports a handled failure
and completes the run. Gemini's provider errors all carry `error.type` "unknown", so their class
comes from the CLI's own texts (``error_class``), read before the shared rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from contracts.formats import GEMINI_CLI
from services.normalizer.error_classes import (
    AUTH,
    CANCELLED,
    CONTEXT_LENGTH,
    MAX_CLASSIFIED_CHARS,
    MAX_TURNS,
    PROVIDER_UNAVAILABLE,
    QUOTA,
    RATE_LIMIT,
    TIMEOUT,
)
from services.normalizer.machinery import Event, Machinery, Record, fits_int64, format_rules, is_int, nonempty_str
from services.normalizer.paths import normalize_path
from services.normalizer.shell import shell_kinds
from services.normalizer.timefmt import parse_ts
from services.normalizer.tools import LIST_PATH_KEYS, SEARCH_PATH_KEYS, classify_tool, first_string

SHELL_TOOL = "run_shell_command"
MCP_PREFIX = "mcp_"
# G-T7: bookkeeping tools, consumed (no event) on result, drain and eviction alike.
CONSUMED = frozenset(("write_todos", "update_topic"))
CONSUMED_PREFIX = "tracker_"
# G-T1/G-T2 path aliases (older builds: absolute_path, path).
FILE_KEYS = ("file_path", "absolute_path", "path")
# G-T4/G-T5: `dir_path` first, then section 3.5's keys.
SEARCH_DIR_KEYS = ("dir_path", *SEARCH_PATH_KEYS)
LIST_DIR_KEYS = ("dir_path", *LIST_PATH_KEYS)
# G-S1/G-S2: the display text of a command that printed nothing (packages/core/src/tools/shell.ts);
# N bounded so it always fits an int64.
_EXITED = re.compile(r"Command exited with code: (-?\d{1,18})")
_SIGNALLED = "Command terminated by signal:"

# Section 8.5: the CLI's own error class names (`result.error.type`), exact.
_BY_CODE = {
    "FatalTurnLimitedError": MAX_TURNS,
    "FatalCancellationError": CANCELLED,
    "FatalAuthenticationError": AUTH,
}
# Section 8.5: Gemini's texts the shared rules do not read right, in order (lower-cased). The raw
# API body is inside the message (`[API Error: {"error":{"code":403,...}}]`), so the status is read
# in its JSON form; gemini-cli's retryable 429 says "Suggested retry after" (a per-minute limit),
# its terminal one "exhausted your daily quota".
_RULES = (
    (RATE_LIMIT, re.compile(r"suggested retry after")),
    (QUOTA, re.compile(r"exhausted your daily quota")),
    (AUTH, re.compile(r'"code":\s*(401|403)\b|api_key_invalid')),
    (RATE_LIMIT, re.compile(r'"code":\s*429\b')),
    (CONTEXT_LENGTH, re.compile(r"input token count.{0,80}exceeds the maximum|exceeded the token limit")),
    (PROVIDER_UNAVAILABLE, re.compile(r'"code":\s*5\d\d\b')),
    (TIMEOUT, re.compile(r"fetch failed|api error: terminated")),
)


def error_class(code: str | None, message: str) -> str | None:
    """The class Gemini's own code or text names; None: the shared rules decide."""
    if code is not None:
        by_code = _BY_CODE.get(code)
        if by_code is not None:
            return by_code
    text = message[:MAX_CLASSIFIED_CHARS].lower()
    for cls, pattern in _RULES:
        if pattern.search(text) is not None:
            return cls
    return None


def consumed(name: str) -> bool:
    return name in CONSUMED or name.startswith(CONSUMED_PREFIX)


# ------------------------------------------------------------------- records
def record(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    rtype = rec.get("type")
    handler = _RECORDS.get(rtype) if type(rtype) is str else None
    if handler is None:
        _unrecognized(norm, out, seq, ts_ms, rec)
        return
    handler(norm, out, seq, ts_ms, rec)


def _unrecognized(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)  # G-R8
    norm.unknown(out, ts_ms, rec, seq, seq)


def _init(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    sid = rec.get("session_id")
    if nonempty_str(sid):
        norm.session = sid  # G-R1
    elif type(sid) is not str and "session_id" in rec:
        _unrecognized(norm, out, seq, ts_ms, rec)  # a session id that is no string breaks the schema


def _message(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    role, content = rec.get("role"), rec.get("content")
    if role == "user" and type(content) is str:
        return  # G-R2: the prompt, echoed whole
    if role == "assistant" and type(content) is str:
        if content:
            norm.accumulate(out, ts_ms, "agent", "", content, seq)  # G-R3: deltas, no message id
        return
    _unrecognized(norm, out, seq, ts_ms, rec)


def _tool_use(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)
    call_id, name = rec.get("tool_id"), rec.get("tool_name")
    if type(call_id) is not str or type(name) is not str:
        norm.unknown(out, ts_ms, rec, seq, seq, tool=name, call_id=call_id)  # G-R4
        return
    norm.add_call(out, ts_ms, [call_id, name, rec.get("parameters"), rec, seq, ts_ms])


def _tool_result(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)
    call_id = rec.get("tool_id")
    call = norm.take_call(call_id)  # G-R5: the oldest pending call with this id
    if call is None:
        norm.unknown(out, ts_ms, rec, seq, seq, call_id=call_id)
        return
    _, name, args, request, req_seq, req_ts = call
    tail: dict[str, Any] = {"tool": name, "toolCallId": call_id, "durationMs": duration(request, rec, ts_ms - req_ts)}
    status, output = rec.get("status"), rec.get("output")
    kinds = classify(name, args)
    exit_code: int | None = None
    success: bool | None = None
    if status == "error":
        success = False
    elif status == "success":
        if name == SHELL_TOOL:
            # G-S1/G-S2: `success` only says the command ran; its exit shows only as this text.
            if type(output) is str:
                match = _EXITED.fullmatch(output)
                if match is not None:
                    exit_code = int(match.group(1))
                    if exit_code != 0:
                        success = False
                elif output.startswith(_SIGNALLED):
                    success = False
        else:
            success = True
    # A tool-built unknown carries the request (as Claude's), not the result.
    norm.tool_events(out, ts_ms, kinds, request, tail, req_seq, seq, success, exit_code)


def duration(request: Any, result: Record, fallback: int) -> int:
    """The CLI's own time between the call's and the result's records (their `timestamp`s, the
    CLI's clock); the tap's when either is missing or unusable, or they run backwards."""
    start = parse_ts(request.get("timestamp")) if type(request) is dict else None
    end = parse_ts(result.get("timestamp"))
    if start is not None and end is not None and end >= start:
        return end - start
    return fallback


def _error(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)
    message = rec.get("message")
    text = message if nonempty_str(message) else "gemini reported an error"
    if rec.get("severity") == "warning":
        norm.emit(out, ts_ms, "warning", {"message": text}, seq, seq)  # G-R6
    else:
        norm.error(out, ts_ms, text, None, seq, error_class(None, text))


def _result(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)  # G-R7
    norm.drain(out, ts_ms)
    error = rec.get("error")
    if type(error) is dict:
        message, code = error.get("message"), error.get("type")
        text = message if nonempty_str(message) else "gemini reported a fatal error"
        code_text = code if nonempty_str(code) else None
        if text not in norm.errors:  # as C-F4
            norm.error(out, ts_ms, text, code_text, seq, error_class(code_text, text))
    elif error is not None:
        norm.unknown(out, ts_ms, rec, seq, seq)  # an `error` that is no object breaks the schema
    norm.turn_ended(usage(rec))


def usage(rec: Record) -> dict[str, Any]:
    """Section 8.4: `result.stats` (its `input_tokens` is the whole prompt; `total_tokens` counts
    thoughts as well, so the total is input + output)."""
    fields: dict[str, Any] = {}
    stats = rec.get("stats")
    if type(stats) is not dict:
        return fields
    inp, out, cached = stats.get("input_tokens"), stats.get("output_tokens"), stats.get("cached")
    if is_int(inp):
        fields["inputTokens"] = inp
    if is_int(out):
        fields["outputTokens"] = out
    if is_int(inp) and is_int(out) and fits_int64(inp + out):
        fields["totalTokens"] = inp + out
    if is_int(cached):
        fields["cacheReadInputTokens"] = cached
    return fields


# ---------------------------------------------------------------------- tools
def classify(name: str, args: Any) -> Sequence[Mapping[str, Any]] | None:
    """Section 8.3 (G-T1..G-T9): the events of a call, [] when consumed, None when unmapped."""
    if consumed(name):
        return []
    if args is None:
        args = {}
    if type(args) is not dict:
        return None
    if name.startswith(MCP_PREFIX):
        # G-T8: mcp_<server>_<tool>, split at the first `_` after the prefix; section 3.5 on <tool>.
        _, sep, tool = name[len(MCP_PREFIX):].partition("_")
        return classify_tool(tool, args) if sep and tool else None
    handler = _TOOLS.get(name)
    return handler(args) if handler is not None else None


def _read(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    path = first_string(args, FILE_KEYS)
    if path is None:
        return None
    event: dict[str, Any] = {"type": "read", "path": normalize_path(path)}
    start = _positive(args.get("start_line"))
    if start is None:
        start = _positive(args.get("offset"))
    if start is not None:
        event["startLine"] = start
    end = _positive(args.get("end_line"))
    if end is None and start is not None:
        limit = _positive(args.get("limit"))
        if limit is not None and fits_int64(start + limit):
            end = start + limit - 1
    if end is not None and (start is None or end >= start):
        event["endLine"] = end
    return [event]


def _positive(value: Any) -> int | None:
    return value if is_int(value) and value >= 1 else None


def _write(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    path = first_string(args, FILE_KEYS)
    return None if path is None else [{"type": "write", "path": normalize_path(path)}]


def _shell(args: dict[str, Any]) -> Sequence[Mapping[str, Any]] | None:
    command = args.get("command")
    if not nonempty_str(command):
        return None
    return shell_kinds(command) or ({"type": "command", "command": command},)


def _search(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    query = args.get("pattern")
    if not nonempty_str(query):
        return None
    event: dict[str, Any] = {"type": "search", "query": query}
    path = first_string(args, SEARCH_DIR_KEYS)
    if path is not None:
        event["path"] = normalize_path(path)
    return [event]


def _list(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    event: dict[str, Any] = {"type": "list"}
    path = first_string(args, LIST_DIR_KEYS)
    if path is not None:
        event["path"] = normalize_path(path)
    return [event]


def _skill(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    name = args.get("name")
    if not nonempty_str(name):
        return None
    return [{"type": "skill", "path": normalize_path(f"skills/{name}/SKILL.md"), "skillName": name}]


_TOOLS = {
    "read_file": _read,
    "write_file": _write,
    "replace": _write,
    SHELL_TOOL: _shell,
    "glob": _search,
    "grep_search": _search,
    "search_file_content": _search,
    "list_directory": _list,
    "activate_skill": _skill,
}


_RECORDS = {
    "init": _init,
    "message": _message,
    "tool_use": _tool_use,
    "tool_result": _tool_result,
    "error": _error,
    "result": _result,
}

RULES = format_rules(GEMINI_CLI, record=record, consumed=consumed)
