"""A scripted model server on loopback for the real agent CLIs (issue 36).

One `ThreadingHTTPServer` speaks, well enough for multi-turn tool runs:
- Anthropic Messages (`POST /v1/messages`, SSE, and the non-streaming retry Claude Code makes),
- OpenAI Responses (`POST /v1/responses`, SSE) and chat completions (`POST /v1/chat/completions`, SSE),
- Gemini `streamGenerateContent` (`?alt=sse`), `generateContent` and `countTokens`.

A scenario is a list of `Step`s, provider-neutral: each *turn request* (a request that offers tools,
or any streaming request of the API family) takes the next step; when the script runs out it
answers a short final text so no CLI waits. Side requests (Claude's tool-less helper calls,
Gemini's JSON checks and token counts) get a neutral answer and do not consume steps.

Faults are steps too, each rendered with the provider's own error body and headers: `Status(kind)`
(`auth`, `forbidden`, `bad_key`, `rate_limit`, `quota`, `server_error`, `overloaded`, `context_length`), `Cut()`
(the stream starts, then the connection is reset), `Stall(s)` (headers and a first event, then
nothing). A `Reply` with `truncated=True` ends on the output token limit (Anthropic
`max_tokens`, OpenAI `length`, Gemini `MAX_TOKENS`) instead of a normal stop; an empty `Reply()` is
an answer with no text at all. A step with `times=ALWAYS` answers every later request too (faults that retries meet
again). Connection refused is no step: point the CLI at `refused_url()`.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

ALWAYS = -1


@dataclass(frozen=True)
class Call:
    """A tool call the model makes: `args` a dict (function tools) or a string (custom/freeform tools)."""

    name: str
    args: dict[str, Any] | str


@dataclass(frozen=True)
class Reply:
    text: str = ""
    calls: tuple[Call, ...] = ()
    thinking: str = ""
    truncated: bool = False  # the answer stops at the output token limit (not a normal stop)


@dataclass(frozen=True)
class Status:
    kind: str  # one of ERROR_KINDS
    retry_after_s: float | None = None


@dataclass(frozen=True)
class Cut:
    """Start a normal stream, then reset the connection mid-way."""


@dataclass(frozen=True)
class Stall:
    seconds: float = 600.0


Step = Reply | Status | Cut | Stall


@dataclass
class Scripted:
    step: Step
    times: int = 1  # ALWAYS: for every request from here on


# `bad_key`: what each API answers a key it does not know (Gemini: 400 INVALID_ARGUMENT with reason
# API_KEY_INVALID, not a 401; gemini-cli-stream-format section 4 `badkey400`)
ERROR_KINDS = ("auth", "forbidden", "bad_key", "rate_limit", "quota", "server_error", "overloaded", "context_length")


# --- each provider's error bodies (as their APIs document and send them) ---------------------------
def anthropic_error(kind: str) -> tuple[int, dict[str, Any]]:
    status, etype, message = {
        "auth": (401, "authentication_error", "invalid x-api-key"),
        "bad_key": (401, "authentication_error", "invalid x-api-key"),
        "forbidden": (403, "permission_error", "Your API key does not have permission to use the specified resource."),
        "rate_limit": (429, "rate_limit_error",
                       "This request would exceed the rate limit for your organization of 50 requests per minute."),
        "quota": (400, "invalid_request_error",
                  "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."),
        "server_error": (500, "api_error", "Internal server error"),
        "overloaded": (529, "overloaded_error", "Overloaded"),
        "context_length": (400, "invalid_request_error", "prompt is too long: 213455 tokens > 200000 maximum"),
    }[kind]
    return status, {"type": "error", "error": {"type": etype, "message": message},
                    "request_id": f"req_{uuid.uuid4().hex[:24]}"}


def openai_error(kind: str) -> tuple[int, dict[str, Any]]:
    status, etype, code, message = {
        "auth": (401, "invalid_request_error", "invalid_api_key",
                 "Incorrect API key provided: sk-test. You can find your API key at https://platform.openai.com/account/api-keys."),
        "bad_key": (401, "invalid_request_error", "invalid_api_key",
                    "Incorrect API key provided: sk-test. You can find your API key at https://platform.openai.com/account/api-keys."),
        "forbidden": (403, "invalid_request_error", "unsupported_country_region_territory",
                      "Country, region, or territory not supported"),
        "rate_limit": (429, "requests", "rate_limit_exceeded",
                       "Rate limit reached for gpt-5.5 in organization org-test on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 1s."),
        "quota": (429, "insufficient_quota", "insufficient_quota",
                  "You exceeded your current quota, please check your plan and billing details."),
        "server_error": (500, "server_error", None,
                         "The server had an error while processing your request. Sorry about that!"),
        "overloaded": (503, "server_error", None, "The engine is currently overloaded, please try again later"),
        "context_length": (400, "invalid_request_error", "context_length_exceeded",
                           "Your input exceeds the context window of this model. Please adjust your input and try again."),
    }[kind]
    return status, {"error": {"message": message, "type": etype, "param": None, "code": code}}


def gemini_error(kind: str) -> tuple[int, dict[str, Any]]:
    status, gstatus, message = {
        "auth": (401, "UNAUTHENTICATED", "Request had invalid authentication credentials."),
        "forbidden": (403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
        "bad_key": (400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key."),
        "rate_limit": (429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
        "quota": (429, "RESOURCE_EXHAUSTED",
                  "You exceeded your current quota, please check your plan and billing details."),
        "server_error": (500, "INTERNAL", "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"),
        "overloaded": (503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
        "context_length": (400, "INVALID_ARGUMENT",
                           "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."),
    }[kind]
    error: dict[str, Any] = {"code": status, "message": message, "status": gstatus}
    if kind == "bad_key":
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                             "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]
    return status, {"error": error}


def error_headers(family: str, kind: str, retry_after_s: float | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if family == "anthropic":
        headers["request-id"] = f"req_{uuid.uuid4().hex[:24]}"
        if kind == "overloaded":
            headers["x-should-retry"] = "true"
    if family in ("responses", "chat"):
        headers["x-request-id"] = f"req_{uuid.uuid4().hex[:24]}"
    if retry_after_s is not None:
        headers["retry-after"] = f"{retry_after_s:g}"
        headers["retry-after-ms"] = str(int(retry_after_s * 1000))
    return headers


# --- the server ------------------------------------------------------------------------------------
@dataclass
class Seen:
    """One request as received (for assertions and drift reports)."""

    method: str
    path: str
    body: Any
    turn: bool  # whether it took a step of the script


class ModelServer:
    def __init__(self, script: list[Step | Scripted] | None = None, model: str = "test-model",
                 every_request_a_turn: bool = False) -> None:
        """`every_request_a_turn`: a client without side requests (goose's provider layer offers no
        tools when asked none): every request of an API takes the next step."""
        self.every_request_a_turn = every_request_a_turn
        self._script = [s if isinstance(s, Scripted) else Scripted(s) for s in (script or [])]
        self._lock = threading.Lock()
        self.model = model
        self.seen: list[Seen] = []
        self._ids = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.model = self  # type: ignore[attr-defined]
        # a short poll: shutdown() waits up to one interval, once per scenario run
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}{self._ids:04d}{uuid.uuid4().hex[:12]}"

    def take(self) -> Step:
        with self._lock:
            while self._script:
                head = self._script[0]
                if head.times == ALWAYS:
                    return head.step
                if head.times > 0:
                    head.times -= 1
                    if head.times == 0:
                        self._script.pop(0)
                    return head.step
                self._script.pop(0)
            return Reply(text="Done.")

    def turns(self) -> list[Seen]:
        return [s for s in self.seen if s.turn]


def refused_url() -> str:
    """A loopback URL nothing listens on (a port just released): connection refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _family(path: str) -> str | None:
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    if ":streamGenerateContent" in path or ":generateContent" in path or ":countTokens" in path:
        return "gemini"
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    @property
    def model(self) -> ModelServer:
        return self.server.model  # type: ignore[attr-defined, no-any-return]

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        path = urlparse(self.path).path
        self.model.seen.append(Seen("GET", path, None, False))
        if path.endswith("/models"):
            # OpenAI-style model list (Codex and opencode may ask)
            self._json(200, {"object": "list", "data": [{"id": self.model.model, "object": "model", "owned_by": "test"}],
                             "models": []})
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("content-encoding") == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = raw.decode("utf-8", "replace")
        url = urlparse(self.path)
        path = url.path
        family = _family(path)
        if family is None:
            self.model.seen.append(Seen("POST", path, body, False))
            self._json(404, {"error": {"message": f"no route {path}"}})
            return
        stream = bool(body.get("stream")) if isinstance(body, dict) else False
        if family == "gemini":
            stream = ":streamGenerateContent" in path
        turn = self.model.every_request_a_turn or self._is_turn(family, path, body, stream)
        self.model.seen.append(Seen("POST", path, body, turn))
        if not turn:
            self._side(family, path, body, stream)
            return
        step = self.model.take()
        if isinstance(step, Status):
            status, err = {"anthropic": anthropic_error, "responses": openai_error, "chat": openai_error,
                           "gemini": gemini_error}[family](step.kind)
            self._json(status, err, error_headers(family, step.kind, step.retry_after_s))
            return
        reply = step if isinstance(step, Reply) else Reply(text="Partial answer that never ends")
        if not stream and isinstance(step, Cut):
            self._reset()
            return
        if not stream and isinstance(step, Stall):
            time.sleep(step.seconds)
            self._reset()
            return
        if not stream:
            self._whole(family, reply)
            return
        events = RENDER[family](self.model, reply)
        self._sse_head()
        if isinstance(step, Cut):
            for event in events[: max(1, len(events) // 2)]:
                self._write(event)
            self._reset()
            return
        if isinstance(step, Stall):
            self._write(events[0])
            time.sleep(step.seconds)
            self._reset()
            return
        for event in events:
            self._write(event)
        self._end_chunks()

    # -- which requests take a step ---------------------------------------------------------------
    @staticmethod
    def _is_turn(family: str, path: str, body: Any, stream: bool) -> bool:
        if not isinstance(body, dict):
            return False
        if family == "anthropic":
            # Claude Code's turns offer tools (its helper calls, e.g. titles, do not); the
            # non-streaming retry of a failed turn offers them too
            return bool(body.get("tools"))
        if family == "gemini":
            return ":countTokens" not in path and "responseJsonSchema" not in json.dumps(body.get("generationConfig", {})) \
                and "responseMimeType" not in json.dumps(body.get("generationConfig", {}))
        if family == "chat":
            # opencode's title request offers no tools; a request ending with an assistant message is
            # a prefill asking for text only (opencode's "MAXIMUM STEPS REACHED" at its step limit,
            # tools still offered): a model obeys it, so it gets text and takes no step
            messages = body.get("messages")
            if isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
                    and messages[-1].get("role") == "assistant":
                return False
            return bool(body.get("tools"))
        return True

    def _side(self, family: str, path: str, body: Any, stream: bool) -> None:
        if family == "gemini" and ":countTokens" in path:
            self._json(200, {"totalTokens": 10})
            return
        if family == "gemini":
            # a JSON check (next speaker, loop detection): the model is done, the user speaks next
            text = json.dumps({"reasoning": "The model finished its turn.", "next_speaker": "user"})
            reply = Reply(text=text)
        else:
            reply = Reply(text="Scripted side answer")
        if stream:
            self._sse_head()
            for event in RENDER[family](self.model, reply):
                self._write(event)
            self._end_chunks()
        else:
            self._whole(family, reply)

    # -- wire helpers -----------------------------------------------------------------------------
    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _sse_head(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _write(self, event: bytes) -> None:
        self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _reset(self) -> None:
        # SO_LINGER 0: close sends RST, the client sees "connection reset" mid-body
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _whole(self, family: str, reply: Reply) -> None:
        m = self.model
        if family == "anthropic":
            content: list[dict[str, Any]] = []
            if reply.text:
                content.append({"type": "text", "text": reply.text})
            for c in reply.calls:
                content.append({"type": "tool_use", "id": m.next_id("toolu_"), "name": c.name, "input": c.args})
            self._json(200, {"id": m.next_id("msg_"), "type": "message", "role": "assistant", "model": m.model,
                             "content": content, "stop_reason": "tool_use" if reply.calls else "end_turn",
                             "stop_sequence": None, "usage": {"input_tokens": 20, "output_tokens": 10}})
        elif family == "gemini":
            self._json(200, _gemini_chunk(reply, final=True))
        else:
            self._json(200, {"id": m.next_id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()),
                             "model": m.model, "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                                                            "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}})


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n").encode()


def _anthropic(m: ModelServer, reply: Reply) -> list[bytes]:
    mid = m.next_id("msg_")
    out = [_sse("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": m.model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 20, "cache_creation_input_tokens": 0,
                                         "cache_read_input_tokens": 0, "output_tokens": 1}}})]
    index = 0
    if reply.thinking:
        out += [_sse("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "thinking_delta", "thinking": reply.thinking}}),
                _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}}),
                _sse("content_block_stop", {"type": "content_block_stop", "index": index})]
        index += 1
    if reply.text:
        half = len(reply.text) // 2
        out += [_sse("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "text", "text": ""}})]
        for part in (reply.text[:half], reply.text[half:]):
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "text_delta", "text": part}}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for c in reply.calls:
        out += [_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": m.next_id("toolu_"), "name": c.name, "input": {}}}),
                _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "input_json_delta", "partial_json": json.dumps(c.args)}}),
                _sse("content_block_stop", {"type": "content_block_stop", "index": index})]
        index += 1
    stop = "max_tokens" if reply.truncated else "tool_use" if reply.calls else "end_turn"
    out += [_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                   "usage": {"output_tokens": 12}}),
            _sse("message_stop", {"type": "message_stop"})]
    return out


def _responses(m: ModelServer, reply: Reply) -> list[bytes]:
    rid = m.next_id("resp_")
    base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": m.model, "output": []}
    out = [_sse("response.created", {"type": "response.created", "response": {**base, "status": "in_progress"}})]
    items: list[dict[str, Any]] = []
    if reply.thinking:
        items.append({"type": "reasoning", "id": m.next_id("rs_"), "summary": [{"type": "summary_text", "text": reply.thinking}]})
    if reply.text:
        items.append({"type": "message", "id": m.next_id("msg_"), "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": reply.text, "annotations": []}]})
    for c in reply.calls:
        if isinstance(c.args, str):
            items.append({"type": "custom_tool_call", "id": m.next_id("ctc_"), "call_id": m.next_id("call_"),
                          "name": c.name, "input": c.args, "status": "completed"})
        else:
            items.append({"type": "function_call", "id": m.next_id("fc_"), "call_id": m.next_id("call_"),
                          "name": c.name, "arguments": json.dumps(c.args), "status": "completed"})
    for i, item in enumerate(items):
        out.append(_sse("response.output_item.added", {"type": "response.output_item.added", "output_index": i,
                                                       "item": {**item, "status": "in_progress"}}))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out.append(_sse("response.output_text.delta", {"type": "response.output_text.delta", "item_id": item["id"],
                                                           "output_index": i, "content_index": 0, "delta": text}))
        out.append(_sse("response.output_item.done", {"type": "response.output_item.done", "output_index": i, "item": item}))
    usage = {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 32}
    if reply.truncated:
        out.append(_sse("response.incomplete", {"type": "response.incomplete", "response": {
            **base, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": items,
            "usage": usage}}))
    else:
        out.append(_sse("response.completed", {"type": "response.completed",
                                               "response": {**base, "status": "completed", "output": items, "usage": usage}}))
    return out


def _chat(m: ModelServer, reply: Reply) -> list[bytes]:
    cid = m.next_id("chatcmpl-")
    now = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": now, "model": m.model,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else []}
        if usage is not None:
            obj["usage"] = usage
        return _sse(None, obj)

    out = [chunk({"role": "assistant", "content": ""})]
    if reply.thinking:
        out.append(chunk({"reasoning_content": reply.thinking}))
    if reply.text:
        out.append(chunk({"content": reply.text}))
    for i, c in enumerate(reply.calls):
        args = c.args if isinstance(c.args, str) else json.dumps(c.args)
        out.append(chunk({"tool_calls": [{"index": i, "id": m.next_id("call_"), "type": "function",
                                          "function": {"name": c.name, "arguments": args}}]}))
    out.append(chunk({}, "length" if reply.truncated else "tool_calls" if reply.calls else "stop"))
    out.append(chunk({}, usage={"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}))
    out.append(_sse(None, "[DONE]"))
    return out


def _gemini_chunk(reply: Reply, final: bool) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if reply.thinking:
        parts.append({"text": reply.thinking, "thought": True})
    if reply.text:
        parts.append({"text": reply.text})
    for c in reply.calls:
        parts.append({"functionCall": {"name": c.name, "args": c.args}})
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if final:
        cand["finishReason"] = "MAX_TOKENS" if reply.truncated else "STOP"
    return {"candidates": [cand], "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 12,
                                                    "totalTokenCount": 32}, "modelVersion": "gemini-2.5-pro"}


def _gemini(m: ModelServer, reply: Reply) -> list[bytes]:
    if reply.text and not reply.calls:
        half = len(reply.text) // 2
        return [_sse(None, _gemini_chunk(Reply(text=reply.text[:half], thinking=reply.thinking), final=False)),
                _sse(None, _gemini_chunk(Reply(text=reply.text[half:], truncated=reply.truncated), final=True))]
    return [_sse(None, _gemini_chunk(reply, final=True))]


RENDER = {"anthropic": _anthropic, "responses": _responses, "chat": _chat, "gemini": _gemini}
