"""One run's normaliser: the state machine of contract section 3.

Input: one call per raw entry (``line`` or ``end``) with its seq and ts (Unix ms).
Output: harness events as plain dicts, keys in contract order, ready for orjson.
Everything it keeps is plain data so ``to_bytes``/``from_bytes`` round-trip exactly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from contracts.events import EVENT_TYPES
from services.normalizer.timefmt import format_ms
from services.normalizer.tools import classify_tool

STATE_VERSION = 1

_JSON_ERRORS = (orjson.JSONDecodeError, ValueError)
_loads = orjson.loads
_NOT_JSON = object()


class Limits(NamedTuple):
    max_span_chars: int = 262_144
    max_pending_tools: int = 256


# Usage counters of goose's `complete` record -> lifecycle field names.
_USAGE_INT = (
    ("input_tokens", "inputTokens"),
    ("output_tokens", "outputTokens"),
    ("total_tokens", "totalTokens"),
    ("cache_read_input_tokens", "cacheReadInputTokens"),
    ("cache_write_input_tokens", "cacheWriteInputTokens"),
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class RunNormalizer:
    __slots__ = ("run", "limits", "n", "counts", "span", "pending", "usage", "_ts_ms", "_ts_text")

    def __init__(self, run: str, limits: Limits = Limits()) -> None:
        self.run = run
        self.limits = limits
        self.n = 0  # index of the next event
        self.counts: dict[str, int] = {}
        # Pending span: [kind, message id, text, first seq, last seq, truncated]
        self.span: list | None = None
        # Unanswered tool requests, oldest first: [call id, name, input, block, seq, ts]
        self.pending: list[list] = []
        self.usage: dict[str, Any] | None = None
        self._ts_ms = -1
        self._ts_text = ""

    # ------------------------------------------------------------------ state
    def to_state(self) -> dict:
        return {
            "v": STATE_VERSION,
            "run": self.run,
            "n": self.n,
            "counts": self.counts,
            "span": self.span,
            "pending": self.pending,
            "usage": self.usage,
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_state())

    @classmethod
    def from_bytes(cls, data: bytes, limits: Limits = Limits()) -> "RunNormalizer":
        return cls.from_state(orjson.loads(data), limits)

    @classmethod
    def from_state(cls, state: dict, limits: Limits = Limits()) -> "RunNormalizer":
        if state.get("v") != STATE_VERSION:
            raise ValueError(f"normalizer state version {state.get('v')!r} is not {STATE_VERSION}")
        self = cls(state["run"], limits)
        self.n = state["n"]
        self.counts = state["counts"]
        self.span = state["span"]
        self.pending = state["pending"]
        self.usage = state["usage"]
        return self

    # ----------------------------------------------------------------- inputs
    def line(self, seq: int, ts_ms: int, text: str, stream: str = "stdout") -> list[dict]:
        """Events emitted by one raw `line` entry (contract 3.1)."""
        out: list[dict] = []
        if stream == "stderr":
            text = text.strip()
            if text:
                self._emit(out, ts_ms, "warning", {"message": text}, (seq, seq))
            return out
        try:
            # orjson skips surrounding whitespace itself; stripping is only needed on failure.
            record = _loads(text)
        except _JSON_ERRORS:
            stripped = text.strip()  # Unicode whitespace JSON itself does not skip (\f, \v, NBSP)
            record = _NOT_JSON
            if stripped and stripped != text:
                try:
                    record = _loads(stripped)
                except _JSON_ERRORS:
                    pass
            if record is _NOT_JSON:
                if stripped:
                    self._emit(out, ts_ms, "warning", {"message": stripped}, (seq, seq))
                return out
        rtype = record.get("type") if type(record) is dict else None
        if rtype == "message":
            message = record.get("message")
            if type(message) is not dict:
                self._unknown(out, ts_ms, record, (seq, seq))
                return out
            content = message.get("content")
            # Hot path, inlined: one assistant text delta continuing the pending agent span.
            if type(content) is list and len(content) == 1 and "id" not in record:
                block = content[0]
                span = self.span
                if (
                    span is not None
                    and type(block) is dict
                    and block.get("type") == "text"
                    and span[0] == "agent"
                    and not span[5]
                    and message.get("role") == "assistant"
                    and span[1] == message.get("id")
                ):
                    text = block.get("text")
                    if type(text) is str and text:
                        pending = span[2]
                        joined = text if text.startswith(pending) else pending + text
                        if len(joined) <= self.limits.max_span_chars:
                            span[2] = joined
                            span[4] = seq
                            return out
            self._message(out, seq, ts_ms, record, message)
        elif rtype == "notification":
            self._unknown(out, ts_ms, record, (seq, seq))
        elif rtype == "error":
            self._flush(out, ts_ms)
            self._emit(out, ts_ms, "error", {"message": _error_message(record)}, (seq, seq))
        elif rtype == "complete":
            self._flush(out, ts_ms)
            self._drain(out, ts_ms)
            self.usage = _usage(record)
        else:
            self._flush(out, ts_ms)
            self._unknown(out, ts_ms, record, (seq, seq))
        return out

    def end(self, seq: int, ts_ms: int, exit_code: int | None = None) -> list[dict]:
        """End of the run's input (eof, or the run declared abandoned): flush and drain."""
        out: list[dict] = []
        self._flush(out, ts_ms)
        self._drain(out, ts_ms)
        if exit_code is not None and exit_code != 0:
            self._emit(out, ts_ms, "error", {"message": f"goose exited with code {exit_code}"}, (seq, seq))
        return out

    def warn(self, seq: int, ts_ms: int, message: str, code: str, lines: tuple[int, int]) -> list[dict]:
        """A warning of the service itself (e.g. raw entries that never arrived); does not flush."""
        out: list[dict] = []
        self._emit(out, ts_ms, "warning", {"message": message, "code": code}, lines)
        return out

    # --------------------------------------------------------------- messages
    def _message(self, out: list, seq: int, ts_ms: int, record: dict, message: dict) -> None:
        mid = record.get("id")
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
                    if type(text) is str and text:
                        span = self.span
                        # The common case inline: a delta of the pending span.
                        if span is not None and span[0] == "agent" and span[1] == mid and not span[5]:
                            pending = span[2]
                            joined = text if text.startswith(pending) else pending + text
                            if len(joined) <= self.limits.max_span_chars:
                                span[2] = joined
                                span[4] = seq
                                continue
                        self._accumulate(out, ts_ms, "agent", mid, text, seq)
            elif btype == "thinking":
                text = block.get("thinking")
                if assistant and type(text) is str and text:
                    self._accumulate(out, ts_ms, "reasoning", mid, text, seq)
            elif btype == "redactedThinking":
                pass
            elif btype == "toolRequest":
                self._flush(out, ts_ms)
                self._request(out, seq, ts_ms, block)
            elif btype == "toolResponse":
                self._flush(out, ts_ms)
                self._response(out, seq, ts_ms, block)
            else:
                self._unknown(out, ts_ms, block, (seq, seq))

    def _accumulate(self, out: list, ts_ms: int, kind: str, mid: str, text: str, seq: int) -> None:
        span = self.span
        if span is not None and span[0] == kind and span[1] == mid:
            pending = span[2]
            span[2] = text if text.startswith(pending) else pending + text
            span[4] = seq
        else:
            if span is not None:
                self._flush(out, ts_ms)
            span = self.span = [kind, mid, text, seq, seq, False]
        cap = self.limits.max_span_chars
        if len(span[2]) > cap:
            span[2] = span[2][:cap]
            span[5] = True

    def _flush(self, out: list, ts_ms: int) -> None:
        span = self.span
        if span is None:
            return
        self.span = None
        fields: dict[str, Any] = {"message": span[2]}
        if span[5]:
            fields["truncated"] = True
        self._emit(out, ts_ms, span[0], fields, (span[3], span[4]))

    # ------------------------------------------------------------------ tools
    def _request(self, out: list, seq: int, ts_ms: int, block: dict) -> None:
        call_id = _first_present(block, ("id",), ("toolRequest", "id"), ("toolCallId",))
        values = [c.get("value") for c in (block.get("toolCall"), block.get("tool_call")) if isinstance(c, dict)]
        values = [v for v in values if isinstance(v, dict)]
        name = next((v["name"] for v in values if "name" in v), block.get("name"))
        if not isinstance(call_id, str) or not isinstance(name, str):
            self._unknown(out, ts_ms, block, (seq, seq), tool=name, call_id=call_id)
            return
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
        self.pending.append([call_id, name, args, block, seq, ts_ms])
        if len(self.pending) > self.limits.max_pending_tools:
            oldest = self.pending.pop(0)
            if classify_tool(oldest[1], None) == []:
                return  # todo calls are consumed, even when evicted
            self._unknown(out, ts_ms, oldest[3], (oldest[4], oldest[4]), tool=oldest[1], call_id=oldest[0])

    def _response(self, out: list, seq: int, ts_ms: int, block: dict) -> None:
        call_id = _first_present(block, ("id",), ("toolResponse", "id"), ("toolCallId",))
        request = None
        if isinstance(call_id, str):
            for i, pending in enumerate(self.pending):
                if pending[0] == call_id:
                    request = self.pending.pop(i)
                    break
        if request is None:
            self._unknown(out, ts_ms, block, (seq, seq), call_id=call_id)
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
        tail: dict[str, Any] = {"tool": name, "toolCallId": call_id, "durationMs": ts_ms - req_ts}
        lines = (req_seq, seq)
        kinds = classify_tool(name, args)
        if kinds is None:
            self._emit(out, ts_ms, "unknown", {"raw": block, **tail}, lines)
            return
        for kind in kinds:
            fields = dict(kind)
            etype = fields.pop("type")
            if etype == "command":
                structured = value.get("structuredContent") if isinstance(value, dict) else None
                exit_code = structured.get("exit_code") if isinstance(structured, dict) else None
                if _is_int(exit_code):
                    fields["exitCode"] = exit_code
            if success is not None:
                fields["isSuccess"] = success
            fields.update(tail)
            self._emit(out, ts_ms, etype, fields, lines)

    def _drain(self, out: list, ts_ms: int) -> None:
        pending, self.pending = self.pending, []
        for call_id, name, _args, block, req_seq, _ts in pending:
            if classify_tool(name, None) == []:
                continue  # todo calls are consumed even when unanswered
            self._unknown(out, ts_ms, block, (req_seq, req_seq), tool=name, call_id=call_id)

    # ---------------------------------------------------------------- emitting
    def _unknown(
        self,
        out: list,
        ts_ms: int,
        raw: Any,
        lines: tuple[int, int],
        tool: Any = None,
        call_id: Any = None,
    ) -> None:
        # `raw` is never null: a JSON null record or block is kept as its JSON text.
        fields: dict[str, Any] = {"raw": "null" if raw is None else raw}
        if isinstance(tool, str):
            fields["tool"] = tool
        if isinstance(call_id, str):
            fields["toolCallId"] = call_id
        self._emit(out, ts_ms, "unknown", fields, lines)

    def _emit(self, out: list, ts_ms: int, etype: str, fields: dict, lines: tuple[int, int]) -> None:
        n = self.n
        self.n = n + 1
        self.counts[etype] = self.counts.get(etype, 0) + 1
        if ts_ms != self._ts_ms:
            self._ts_ms = ts_ms
            self._ts_text = format_ms(ts_ms)
        event = {
            "eventId": f"{self.run}:{n}",
            "runId": self.run,
            "seq": n,
            "type": etype,
            "timestamp": self._ts_text,
            "lines": [lines[0], lines[1]],
        }
        event.update(fields)
        out.append(event)

    def counts_by_type(self) -> dict[str, int]:
        return {t: self.counts.get(t, 0) for t in EVENT_TYPES}


def _first_present(block: dict, *paths: tuple[str, ...]) -> Any:
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


def _error_message(record: dict) -> str:
    err = record.get("error")
    candidates = (
        err.get("message") if isinstance(err, dict) else None,
        record.get("message"),
        err,
    )
    for value in candidates:
        if isinstance(value, str) and value:
            return value
    return "goose reported an error"


def _usage(record: dict) -> dict[str, Any]:
    usage: dict[str, Any] = {}
    for src, dst in _USAGE_INT:
        value = record.get(src)
        if _is_int(value):
            usage[dst] = value
    cost = record.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        usage["costUsd"] = float(cost)
    return usage
