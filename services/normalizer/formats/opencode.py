"""opencode `run --format json` records -> harness events (rules O-... of
opencode-run-json-format.md section 8, decisions in docs/contract.md "opencode").

Nothing is ever pending: text parts arrive whole and a tool call's request and result come in one
`tool_use` record (with the CLI's own start and end times), so every record's events are emitted
at once, like Codex's. Usage is per step (`step_finish`) and is summed into the run's `completed`
record, the only format whose usage is summed. opencode writes no end record; the run ends at eof.

Small counters of the run live in the shared state's ``local`` (bounded: fixed keys):
``overflows`` (context overflow errors so far: a run that compacts and retries for ever is told
by a `retry` warning at 3, 6, 12, ... of them) and ``recovered`` (an error was followed by a
finished answer: its exit code 1 is not reported as a failure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from contracts.formats import OPENCODE
from services.normalizer.error_classes import AUTH, CANCELLED, CONTEXT_LENGTH, MAX_CLASSIFIED_CHARS, QUOTA, TIMEOUT
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
from services.normalizer.paths import normalize_path
from services.normalizer.tools import PATH_KEYS, classify_extended, first_string

# O-T1..O-T7: opencode's built-in tools -> the section 3.5 (+ C-T) base whose rules apply to its input.
_BASES = {
    "read": "read",
    "write": "write",
    "edit": "write",
    "multiedit": "write",
    "patch": "write",
    "bash": "bash",
    "glob": "glob",
    "grep": "grep",
    "list": "list",
    "skill": "skill",
}
CONSUMED = frozenset(("todowrite", "todoread"))  # O-T8
SHELL_TOOL = "bash"
APPLY_PATCH = "apply_patch"
OVERFLOW = "ContextOverflowError"
# O-E2: opencode's own error names, exact.
_BY_CODE = {
    OVERFLOW: CONTEXT_LENGTH,
    "ProviderAuthError": AUTH,
    "MessageAbortedError": CANCELLED,
    "MessageOutputLengthError": CONTEXT_LENGTH,
    "max_output_tokens": CONTEXT_LENGTH,
}
# O-E3: connection refused carries no status.
_TIMEOUT_TEXTS = ("cannot connect to api", "unable to connect")
# OpenAI's `insufficient_quota` 429 ("You exceeded your current quota"): a quota, whatever order the
# shared rules give 429 and quota texts.
_QUOTA_TEXTS = ("exceeded your current quota", "insufficient_quota")
# The `retry` warning of a compaction loop, at OVERFLOW_WARN_FIRST overflows and each doubling.
OVERFLOW_WARN_FIRST = 3
# The `local` keys (section docstring).
OVERFLOWS = "overflows"
ERRORED = "errored"
RECOVERED = "recovered"


def error_class(code: str | None, message: str) -> str | None:
    """The class opencode's own error name or text names; None: the shared rules decide."""
    if code is not None:
        by_code = _BY_CODE.get(code)
        if by_code is not None:
            return by_code
    text = message[:MAX_CLASSIFIED_CHARS].lower()
    if any(t in text for t in _QUOTA_TEXTS):
        return QUOTA
    if any(t in text for t in _TIMEOUT_TEXTS):
        return TIMEOUT
    return None


def consumed(name: str) -> bool:
    return name in CONSUMED


# ------------------------------------------------------------------- records
def record(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    sid = rec.get("sessionID")
    if nonempty_str(sid):
        norm.session = sid  # O-R1: the most recent non-empty one
    rtype = rec.get("type")
    handler = _RECORDS.get(rtype) if type(rtype) is str else None
    if handler is None:
        norm.unknown(out, ts_ms, rec, seq, seq)  # O-R9
        return
    handler(norm, out, seq, ts_ms, rec)


def _nothing(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    pass  # O-R2 `step_start`, O-R8 `done`


def _text(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    part = rec.get("part")
    text = part.get("text") if type(part) is dict else None
    if type(text) is not str:
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    assert type(part) is dict
    if part.get("synthetic") is True or not text:
        return  # O-R3: opencode's own injected user text (after a compaction), or nothing
    # O-R3/O-R4: whole texts, one event each (capped like spans).
    norm.whole_text(out, ts_ms, "reasoning" if rec["type"] == "reasoning" else "agent", text, seq)


def _tool_use(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    part = rec.get("part")
    if type(part) is not dict:
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    name, call_id, state = part.get("tool"), part.get("callID"), part.get("state")
    if type(name) is not str or type(state) is not dict:
        norm.unknown(out, ts_ms, part, seq, seq, tool=name, call_id=call_id)
        return
    tail: dict[str, Any] = {"tool": name}
    if type(call_id) is str:
        tail["toolCallId"] = call_id
    duration = _duration(state.get("time"))
    if duration is not None:
        tail["durationMs"] = duration  # O-S2: the CLI's own clock (one record per call)
    status, metadata = state.get("status"), state.get("metadata")
    exit_code = metadata.get("exit") if type(metadata) is dict else None
    if not is_int(exit_code) or not fits_int64(exit_code):
        exit_code = None
    success: bool | None = None
    if status == "error":
        success = False
    elif status == "completed":
        # O-S1: `completed` says the tool returned; a command's own exit says how it ended.
        success = not (name == SHELL_TOOL and exit_code is not None and exit_code != 0)
    kinds = classify(name, state.get("input"), metadata)
    # O-R5: the record is request and result at once; an unknown carries the part.
    norm.tool_events(out, ts_ms, kinds, part, tail, seq, seq, success, exit_code if name == SHELL_TOOL else None)


def _duration(time: Any) -> int | None:
    if type(time) is not dict:
        return None
    start, end = time.get("start"), time.get("end")
    if is_int(start) and is_int(end) and end >= start and fits_int64(end - start):
        return end - start
    return None


def _step_finish(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    part = rec.get("part")
    if type(part) is not dict:
        norm.unknown(out, ts_ms, rec, seq, seq)
        return
    reason = part.get("reason")
    if reason == "length":
        message = "opencode step finished with reason length (the model's output token limit)"
        norm.error(out, ts_ms, message, "max_output_tokens", seq, CONTEXT_LENGTH)
    elif reason == "content-filter":
        norm.error(out, ts_ms, "opencode step finished with reason content-filter", "content_filter", seq)
    elif reason == "stop" and norm.local.get(ERRORED):
        norm.local[RECOVERED] = 1  # an answer after an error: the run recovered
    norm.turn_ended(summed_usage(norm.usage, part))  # O-R6, section 8.4


def summed_usage(previous: dict[str, Any] | None, part: Record) -> dict[str, Any]:
    """Section 8.4: the run's sums so far plus one step's `tokens` and `cost` (a new object)."""
    fields: dict[str, Any] = dict(previous) if previous else {}
    tokens = part.get("tokens")
    if type(tokens) is not dict:
        tokens = {}
    cache = tokens.get("cache")
    if type(cache) is not dict:
        cache = {}
    read, write = _count(cache.get("read")), _count(cache.get("write"))
    steps = (
        ("inputTokens", _sum(_count(tokens.get("input")), read, write)),
        ("outputTokens", _sum(_count(tokens.get("output")), _count(tokens.get("reasoning")))),
        ("cacheReadInputTokens", read),
        ("cacheWriteInputTokens", write),
    )
    for key, value in steps:
        if value is not None:
            total = fields.get(key, 0) + value
            if fits_int64(total):
                fields[key] = total
    if "inputTokens" in fields and "outputTokens" in fields and fits_int64(fields["inputTokens"] + fields["outputTokens"]):
        fields["totalTokens"] = fields["inputTokens"] + fields["outputTokens"]
    cost = part.get("cost")
    if is_number(cost) and math.isfinite(cost) and cost >= 0:
        summed = fields.get("costUsd", 0.0) + float(cost)
        if math.isfinite(summed):
            fields["costUsd"] = summed
    return {key: fields[key] for key in _USAGE_ORDER if key in fields}


_USAGE_ORDER = ("inputTokens", "outputTokens", "totalTokens", "cacheReadInputTokens", "cacheWriteInputTokens", "costUsd")


def _count(value: Any) -> int | None:
    return value if is_int(value) and 0 <= value and fits_int64(value) else None


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _error(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    # O-R7: code = error.name; message = data.message (else the name) + " (HTTP <status>)" (O-E1).
    error = rec.get("error")
    name = error.get("name") if type(error) is dict else None
    data = error.get("data") if type(error) is dict else None
    code = name if nonempty_str(name) else None
    message = data.get("message") if type(data) is dict else None
    text = message if nonempty_str(message) else (code or "opencode reported an error")
    status = data.get("statusCode") if type(data) is dict else None
    if is_int(status):
        text += f" (HTTP {status})"
    local = norm.local
    local[ERRORED] = 1
    local.pop(RECOVERED, None)
    norm.error(out, ts_ms, text, code, seq, error_class(code, text))
    if code == OVERFLOW:
        overflows = local.get(OVERFLOWS, 0) + 1
        local[OVERFLOWS] = overflows
        if overflows >= OVERFLOW_WARN_FIRST and overflows % OVERFLOW_WARN_FIRST == 0 and _power_of_two(overflows // OVERFLOW_WARN_FIRST):
            # The compaction loop (spec 8.6.5): opencode compacts and retries ~3 times a second until
            # killed. A `retry` warning (class context_length, counted by goose_ingest_error_retries)
            # at 3, 6, 12, 24, ... overflows: a handful of events however long it spins.
            warning = (f"opencode compacted its context and retried {overflows} times after the provider refused "
                       "the context length; a run that keeps doing this retries until it is killed")
            norm.emit(out, ts_ms, "warning", {"message": warning, "code": "retry", "errorClass": CONTEXT_LENGTH}, seq, seq)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def finish(norm: Machinery, out: list[Event], seq: int, ts_ms: int, exit_code: int | None) -> bool:
    """Exit 1 after a recovered error (an error, then a step that finished `stop`): opencode exits 1
    whenever it saw an error, even when it answered afterwards. The error is already an event; the
    exit is a warning, not a second error (``ended.exitCode`` still says 1)."""
    if exit_code == 1 and norm.local.get(RECOVERED):
        message = "opencode exited with code 1 after it recovered from an earlier error and answered"
        norm.emit(out, ts_ms, "warning", {"message": message, "code": "recovered_exit"}, seq, seq)
        return True
    return False


# ---------------------------------------------------------------------- tools
def classify(name: str, args: Any, metadata: Any) -> Sequence[Mapping[str, Any]] | None:
    """Section 8.3 (O-T1..O-T9): the events of a call, [] when consumed, None when unmapped."""
    if name in CONSUMED:
        return []
    if name == APPLY_PATCH:
        return _patched_files(metadata)  # O-T3: the input names no path, the metadata does
    base = _BASES.get(name)
    if base is None:
        return None  # O-T9: task, webfetch, invalid, MCP `<server>_<tool>`, plugins, ...
    if args is None:
        args = {}
    if type(args) is not dict:
        return None
    return classify_extended(base, args)


def _patched_files(metadata: Any) -> list[dict[str, Any]] | None:
    files = metadata.get("files") if type(metadata) is dict else None
    if type(files) is not list:
        return None
    writes = []
    for entry in files:
        path = entry if nonempty_str(entry) else (first_string(entry, (*PATH_KEYS, "file")) if type(entry) is dict else None)
        if path is not None:
            writes.append({"type": "write", "path": normalize_path(path)})
    return writes or None


_RECORDS = {
    "step_start": _nothing,
    "text": _text,
    "reasoning": _text,
    "tool_use": _tool_use,
    "step_finish": _step_finish,
    "error": _error,
    "done": _nothing,
}

RULES = format_rules(OPENCODE, record=record, consumed=consumed, finish=finish)
