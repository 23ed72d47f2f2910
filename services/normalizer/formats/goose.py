"""goose stream-json records -> harness events (contract sections 3.1-3.5).

Only what is goose's own lives here (record and block dispatch, where goose keeps ids, names,
arguments and results, its usage record); spans, tool pairing, draining and the envelope are the
shared machinery of ``machinery``. Records are dispatched by one table, like the other formats'.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from contracts.formats import GOOSE
from services.normalizer.machinery import (
    JSON_ERRORS,
    Event,
    Machinery,
    Record,
    format_rules,
    is_int,
    is_number,
)
from services.normalizer.tools import HandlerMemo, split_name, tool_handler

# Usage counters of goose's `complete` record -> lifecycle field names.
_USAGE_INT = (
    ("input_tokens", "inputTokens"),
    ("output_tokens", "outputTokens"),
    ("total_tokens", "totalTokens"),
    ("cache_read_input_tokens", "cacheReadInputTokens"),
    ("cache_write_input_tokens", "cacheWriteInputTokens"),
)


# 3.5 classification, each tool name's handler worked out once.
classify = HandlerMemo(tool_handler).classify


def consumed(name: str) -> bool:
    """Extension `todo` is consumed (3.5), on request, response, drain and eviction alike."""
    return split_name(name)[0] == "todo"


def record(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    rtype = rec.get("type")
    handler = _RECORDS.get(rtype, _other) if type(rtype) is str else _other
    handler(norm, out, seq, ts_ms, rec)


def _message_record(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    message = rec.get("message")
    if type(message) is not dict:
        norm.unknown(out, ts_ms, rec, seq, seq)  # without flushing
        return
    if _extends_agent_span(norm, rec, message, seq):
        return
    _message(norm, out, seq, ts_ms, rec, message)


def _notification(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.unknown(out, ts_ms, rec, seq, seq)  # a side channel: the pending span stays


def _error(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)
    norm.emit(out, ts_ms, "error", {"message": _error_message(rec)}, seq, seq)


def _complete(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)
    norm.drain(out, ts_ms)
    norm.usage = _usage(rec)


def _other(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record) -> None:
    norm.flush(out, ts_ms)
    norm.unknown(out, ts_ms, rec, seq, seq)


_RECORDS = {
    "message": _message_record,
    "notification": _notification,
    "error": _error,
    "complete": _complete,
}


def _message(norm: Machinery, out: list[Event], seq: int, ts_ms: int, rec: Record, message: Record) -> None:
    mid = rec.get("id")
    if type(mid) is not str:
        mid = message.get("id")
        if type(mid) is not str:
            mid = ""
    content = message.get("content")
    if type(content) is not list:
        return
    assistant = message.get("role") == "assistant"
    for block in content:
        btype = block.get("type") if type(block) is dict else None
        if btype == "text":
            if assistant:
                text = block.get("text")
                if type(text) is str and text and not norm.extend_span("agent", mid, text, seq):
                    norm.accumulate(out, ts_ms, "agent", mid, text, seq)
        elif btype == "thinking":
            text = block.get("thinking")
            if assistant and type(text) is str and text:
                norm.accumulate(out, ts_ms, "reasoning", mid, text, seq)
        elif btype == "redactedThinking":
            pass
        elif btype == "toolRequest":
            norm.flush(out, ts_ms)
            _request(norm, out, seq, ts_ms, block)
        elif btype == "toolResponse":
            norm.flush(out, ts_ms)
            _response(norm, out, seq, ts_ms, block)
        else:
            norm.unknown(out, ts_ms, block, seq, seq)


def _request(norm: Machinery, out: list[Event], seq: int, ts_ms: int, block: Record) -> None:
    call_id = block.get("id")
    if call_id is None:
        call_id = _first_present(block, ("toolRequest", "id"), ("toolCallId",))
    call = block.get("toolCall")
    value = call.get("value") if type(call) is dict else None
    if type(value) is dict and "name" in value and "arguments" in value:
        # goose's own shape: both from toolCall.value (the first place 3.4 looks for either).
        name: Any = value["name"]
        args: Any = value["arguments"]
    else:
        name, args = _name_and_arguments(block)
    if type(call_id) is not str or type(name) is not str:
        norm.unknown(out, ts_ms, block, seq, seq, tool=name, call_id=call_id)
        return
    norm.add_call(out, ts_ms, [call_id, name, args, block, seq, ts_ms])


def _name_and_arguments(block: Record) -> tuple[Any, Any]:
    """3.4: the name and input of a request, wherever goose put them."""
    wrapped = [c.get("value") for c in (block.get("toolCall"), block.get("tool_call")) if isinstance(c, dict)]
    values: list[dict[str, Any]] = [v for v in wrapped if isinstance(v, dict)]
    name = next((v["name"] for v in values if "name" in v), block.get("name"))
    args: Any = None
    for v in values:
        if "arguments" in v:
            args = v["arguments"]
            break
    else:
        if "arguments" in block:
            args = block["arguments"]
        elif "input" in block:
            args = block["input"]
    return name, args


def _response(norm: Machinery, out: list[Event], seq: int, ts_ms: int, block: Record) -> None:
    call_id = block.get("id")
    if call_id is None:
        call_id = _first_present(block, ("toolResponse", "id"), ("toolCallId",))
    request = norm.take_call(call_id)
    if request is None:
        norm.unknown(out, ts_ms, block, seq, seq, call_id=call_id)
        return
    _, name, args, _, req_seq, req_ts = request
    result = block.get("toolResult")
    if result is None:
        inner = block.get("toolResponse")
        result = inner.get("toolResult") if isinstance(inner, dict) else None
    status = result.get("status") if isinstance(result, dict) else None
    if status is None:
        status = block.get("status")
    value = result.get("value") if isinstance(result, dict) else None
    success: bool | None
    if status == "error":
        success = False
    elif status == "success":
        success = not (isinstance(value, dict) and value.get("isError") is True)
    else:
        success = None
    structured = value.get("structuredContent") if isinstance(value, dict) else None
    exit_code = structured.get("exit_code") if isinstance(structured, dict) else None
    tail: dict[str, Any] = {"tool": name, "toolCallId": call_id, "durationMs": ts_ms - req_ts}
    norm.tool_events(out, ts_ms, classify(name, args), block, tail, req_seq, seq, success, exit_code)


def _first_present(block: Record, *paths: tuple[str, ...]) -> Any:
    """The value at the first path that exists (contract: `id`, else `toolRequest.id`, ...)."""
    for path in paths:
        node: Any = block
        for key in path:
            if not isinstance(node, dict) or key not in node:
                node = None
                break
            node = node[key]
        if node is not None:
            return node
    return None


def _error_message(rec: Record) -> str:
    err = rec.get("error")
    candidates = (
        err.get("message") if isinstance(err, dict) else None,
        rec.get("message"),
        err,
    )
    for value in candidates:
        if isinstance(value, str) and value:
            return value
    return "goose reported an error"


def _usage(rec: Record) -> dict[str, Any]:
    usage: dict[str, Any] = {}
    for src, dst in _USAGE_INT:
        value = rec.get(src)
        if is_int(value):
            usage[dst] = value
    cost = rec.get("cost_usd")
    if is_number(cost):
        usage["costUsd"] = float(cost)
    return usage


def batch(norm: Machinery, out: list[Event], entries: Iterator[tuple[int, int, str, str]]) -> None:
    """Many entries of a goose run. goose writes one content block per message line, so such a
    line goes straight to its block's handler: a text delta continuing the pending agent span
    inline, a tool request or response without the message layer. Every other line goes the
    reference way (``_message``, ``parsed``), which gives the same events for the lines taken here."""
    loads = orjson.loads
    parsed = norm.parsed
    set_text = norm.set_text
    for seq, ts_ms, text, stream in entries:
        if stream != "stdout":
            norm.line_into(out, seq, ts_ms, text, stream)
            continue
        try:
            rec = loads(text)
        except JSON_ERRORS:
            norm.line_into(out, seq, ts_ms, text, stream)
            continue
        if type(rec) is dict and rec.get("type") == "message":
            message = rec.get("message")
            if type(message) is dict:
                content = message.get("content")
                if type(content) is list and len(content) == 1:
                    block = content[0]
                    btype = block.get("type") if type(block) is dict else None
                    if btype == "toolRequest" or btype == "toolResponse":
                        assert type(block) is dict
                        set_text(text)
                        if norm.span is not None:
                            norm.flush(out, ts_ms)
                        (_request if btype == "toolRequest" else _response)(norm, out, seq, ts_ms, block)
                        continue
                    if btype == "text" and "id" not in rec and message.get("role") == "assistant":
                        # ``_extends_agent_span`` inline, the block already in hand: the dominant line.
                        delta = block.get("text")
                        if type(delta) is str and delta and norm.extend_span("agent", message.get("id"), delta, seq):
                            continue
                set_text(text)
                _message(norm, out, seq, ts_ms, rec, message)
                continue
        set_text(text)
        parsed(out, seq, ts_ms, rec)


def _extends_agent_span(norm: Machinery, rec: Record, message: Record, seq: int) -> bool:
    """The dominant goose line on the one-line path (``batch`` has the same test inline): a
    message record that is one assistant text delta continuing the pending agent span updates
    the span in place (``extend_span``). False: take the general way (the same result, slower)."""
    if norm.span is None or "id" in rec:
        return False
    content = message.get("content")
    if type(content) is not list or len(content) != 1:
        return False
    block = content[0]
    if type(block) is not dict or block.get("type") != "text" or message.get("role") != "assistant":
        return False
    delta = block.get("text")
    if type(delta) is not str or not delta:
        return False
    return norm.extend_span("agent", message.get("id"), delta, seq)


RULES = format_rules(GOOSE, record=record, consumed=consumed, batch=batch)
