"""Builders for goose stream-json lines and expected harness events (normalizer rule tests).

Lines are built as compact JSON strings the way goose writes them (see
spec/goose-stream-format.md §2-§5); expected events are full dicts built independently of
the implementation (timestamps are formatted here, not with services.normalizer.timefmt).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from contracts.events import harness_event_adapter
from services.normalizer import Limits, RunNormalizer
from services.normalizer.machinery import DEFAULT_LIMITS

RUN = "laptop-42/20261129_3"
MISSING: Any = object()
ENVELOPE = ("eventId", "runId", "seq", "type", "timestamp", "lines")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def T(seq: int) -> int:
    """Default ts (Unix ms) of the raw entry with this seq: one second apart."""
    return 1000 * (seq + 1)


def ts_text(ms: int) -> str:
    dt = _EPOCH + timedelta(milliseconds=ms)
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{ms % 1000:03d}Z"


# --------------------------------------------------------------------- goose lines
def text(t: Any) -> dict:
    return {"type": "text", "text": t}


def think(t: Any) -> dict:
    return {"type": "thinking", "thinking": t, "signature": ""}


def message_record(mid: Any, role: str, *blocks: Any, top_id: Any = MISSING) -> dict:
    message: dict[str, Any] = {}
    if mid is not MISSING:
        message["id"] = mid
    message.update(
        {
            "role": role,
            "created": 1790431333,
            "content": list(blocks),
            "metadata": {"userVisible": True, "agentVisible": True},
        }
    )
    record: dict[str, Any] = {"type": "message"}
    if top_id is not MISSING:
        record["id"] = top_id
    record["message"] = message
    return record


def msg(mid: Any, role: str, *blocks: Any, top_id: Any = MISSING) -> str:
    return dumps(message_record(mid, role, *blocks, top_id=top_id))


def say(mid: Any, t: str) -> str:
    """An assistant text fragment."""
    return msg(mid, "assistant", text(t))


def muse(mid: Any, t: str) -> str:
    """An assistant thinking fragment."""
    return msg(mid, "assistant", think(t))


def req_block(cid: Any, name: Any, args: Any = MISSING) -> dict:
    value: dict[str, Any] = {"name": name}
    if args is not MISSING:
        value["arguments"] = args
    return {"type": "toolRequest", "id": cid, "toolCall": {"status": "success", "value": value}}


def resp_block(
    cid: Any,
    status: Any = "success",
    is_error: Any = None,
    structured: Any = None,
    output: str = "ok",
) -> dict:
    if status == "error":
        result: dict[str, Any] = {"status": "error", "error": "-32603: boom"}
    else:
        value: dict[str, Any] = {"content": [{"type": "text", "text": output, "annotations": {"priority": 0.0}}]}
        if structured is not None:
            value["structuredContent"] = structured
        if is_error is not None:
            value["isError"] = is_error
        result = {"value": value} if status is MISSING else {"status": status, "value": value}
    return {"type": "toolResponse", "id": cid, "toolResult": result}


def req(cid: Any, name: Any, args: Any = MISSING, mid: str = "msg_01req") -> str:
    return msg(mid, "assistant", req_block(cid, name, args))


def resp(cid: Any, status: Any = "success", is_error: Any = None, structured: Any = None, mid: str | None = None) -> str:
    return msg(mid or f"msg_resp_{cid}", "user", resp_block(cid, status, is_error, structured))


# ------------------------------------------------------------------ expected events
def ev(n: int, etype: str, at: int, lines: tuple[int, int], *, ts: int | None = None, run: str = RUN, **fields: Any) -> dict:
    """A full expected event: n = index in run, `at` = seq of the emitting entry (ts = T(at))."""
    event = {
        "eventId": f"{run}:{n}",
        "runId": run,
        "seq": n,
        "type": etype,
        "timestamp": ts_text(T(at) if ts is None else ts),
        "lines": [lines[0], lines[1]],
    }
    event.update(fields)
    return event


def tool(name: str, cid: str, duration_ms: int) -> dict:
    return {"tool": name, "toolCallId": cid, "durationMs": duration_ms}


# --------------------------------------------------------------------------- runner
def check_events(out: list[dict], already: int, run: str) -> None:
    """Contract §2 invariants every emitted event must satisfy."""
    for i, event in enumerate(out):
        n = already + i
        assert tuple(event)[: len(ENVELOPE)] == ENVELOPE, event
        # sessionId, when present, closes the envelope (before the kind's fields).
        assert "sessionId" not in event or list(event).index("sessionId") == len(ENVELOPE), event
        assert event["eventId"] == f"{run}:{n}"
        assert event["runId"] == run
        assert event["seq"] == n
        for key, value in event.items():
            assert value is not None, (key, event)
        harness_event_adapter.validate_python(event)


class Feed:
    """Feeds one run's raw entries with seq 0, 1, 2, ... and ts T(seq) unless given."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, run: str = RUN, fmt: str | None = None) -> None:
        self.run = run
        self.limits = limits
        self.norm = RunNormalizer(run, limits, fmt)
        self.seq = 0
        self.events: list[dict] = []

    def _take(self, out: list[dict]) -> list[dict]:
        check_events(out, len(self.events), self.run)
        self.events.extend(out)
        return out

    def line(self, text: str, ts: int | None = None, stream: str = "stdout") -> list[dict]:
        seq = self.seq
        self.seq += 1
        return self._take(self.norm.line(seq, T(seq) if ts is None else ts, text, stream))

    def lines(self, *texts: str) -> list[dict]:
        out: list[dict] = []
        for t in texts:
            out.extend(self.line(t))
        return out

    def end(self, exit_code: int | None = None, ts: int | None = None) -> list[dict]:
        seq = self.seq
        self.seq += 1
        return self._take(self.norm.end(seq, T(seq) if ts is None else ts, exit_code))

    def roundtrip(self) -> None:
        """Replace the normaliser by one restored from its serialised state."""
        self.norm = RunNormalizer.from_bytes(self.norm.to_bytes(), self.limits)


def body(event: dict) -> dict:
    """An event without the envelope fields every rule test checks through `check_events`."""
    return {k: v for k, v in event.items() if k not in ("eventId", "runId", "seq", "timestamp", "sessionId")}


def bodies(events: list[dict]) -> list[dict]:
    return [body(e) for e in events]


# --------------------------------------------------------------- Claude Code lines
SESSION = "6f1c2d3e-0000-4c5d-9e6f-7a8b9c0d1e2f"


def claude(rtype: Any, session: Any = SESSION, **fields: Any) -> str:
    record: dict[str, Any] = {} if rtype is MISSING else {"type": rtype}
    record.update(fields)
    if session is not MISSING:
        record["session_id"] = session
    return dumps(record)


def c_assistant(mid: Any, *blocks: Any, **fields: Any) -> str:
    message: dict[str, Any] = {"model": "claude-opus-4-7", "role": "assistant", "content": list(blocks),
                               "usage": {"input_tokens": 4, "output_tokens": 1}}
    if mid is not MISSING:
        message["id"] = mid
    return claude("assistant", message=message, parent_tool_use_id=None, **fields)


def c_user(*blocks: Any, content: Any = MISSING) -> str:
    return claude("user", message={"role": "user", "content": list(blocks) if content is MISSING else content})


def c_text(t: Any) -> dict:
    return {"type": "text", "text": t}


def c_think(t: Any) -> dict:
    return {"type": "thinking", "thinking": t, "signature": "EqMC"}


def c_use(cid: Any, name: Any, args: Any = MISSING) -> dict:
    block: dict[str, Any] = {"type": "tool_use", "id": cid, "name": name}
    if args is not MISSING:
        block["input"] = args
    return block


def c_result_block(cid: Any, content: Any = "ok", is_error: Any = MISSING) -> dict:
    block: dict[str, Any] = {"tool_use_id": cid, "type": "tool_result", "content": content}
    if is_error is not MISSING:
        block["is_error"] = is_error
    return block


def c_call(cid: str, name: str, args: Any, mid: str = "msg_call") -> str:
    return c_assistant(mid, c_use(cid, name, args))


def c_answer(cid: str, content: Any = "ok", is_error: Any = MISSING) -> str:
    return c_user(c_result_block(cid, content, is_error))


# --------------------------------------------------------------------- Codex lines
THREAD = "019c3e7a-5b2d-7c41-9a8e-2f6d0b4c8e1a"


def codex(rtype: Any, **fields: Any) -> str:
    record: dict[str, Any] = {} if rtype is MISSING else {"type": rtype}
    record.update(fields)
    return dumps(record)


def x_item(event: str, item_id: Any, itype: Any, **fields: Any) -> str:
    item: dict[str, Any] = {}
    if item_id is not MISSING:
        item["id"] = item_id
    item["type"] = itype
    item.update(fields)
    return codex(event, item=item)
