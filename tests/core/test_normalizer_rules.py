"""One test per rule of contract sections 2 and 3 (spec/harness-events.md) for RunNormalizer.

Shell-command classification itself (§3.6) is tested in test_shell_classify.py; here only its
wiring into tool events is checked. Every event emitted through ``Feed`` is also checked against
the §2 invariants (envelope order, ids, no nulls, contract model) by ``check_events``.
"""

from __future__ import annotations

import orjson
import pytest

from services.normalizer import Limits, RunNormalizer
from tests.support.normalizer import (
    MISSING,
    RUN,
    Feed,
    dumps,
    ev,
    message_record,
    msg,
    muse,
    req,
    req_block,
    resp,
    resp_block,
    say,
    text,
    think,
    tool,
)

NOTIFICATION = {"type": "notification", "extension_id": "toolu_01", "log": {"message": "Triggered build #4812"}}
BANNER = "   new session · anthropic claude-sonnet-4   "


def one_call(name, args, response=None, **resp_kw):
    """Request at seq 0, response at seq 1; returns the response's events."""
    f = Feed()
    assert f.line(req("call_1", name, args)) == []
    line = response if response is not None else resp("call_1", **resp_kw)
    return f.line(line)


def tool_event(etype, name, **fields):
    """The expected event of `one_call` (request seq 0, response seq 1, 1000 ms apart)."""
    return ev(0, etype, 1, (0, 1), **fields, **tool(name, "call_1", 1000))


# ============================================================================ §2 envelope
def test_2_event_id_is_run_colon_index_and_seq_is_index():
    f = Feed(run="laptop-42/20261129_3")
    f.line("warn one", stream="stderr")
    f.line(BANNER)
    f.line(dumps(NOTIFICATION))
    assert [(e["eventId"], e["runId"], e["seq"]) for e in f.events] == [
        ("laptop-42/20261129_3:0", "laptop-42/20261129_3", 0),
        ("laptop-42/20261129_3:1", "laptop-42/20261129_3", 1),
        ("laptop-42/20261129_3:2", "laptop-42/20261129_3", 2),
    ]


@pytest.mark.parametrize(
    "ts_ms, expected",
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (5, "1970-01-01T00:00:00.005Z"),
        (60, "1970-01-01T00:00:00.060Z"),
        (1790431333007, "2026-09-26T14:02:13.007Z"),
        (951782400123, "2000-02-29T00:00:00.123Z"),
        (4102444799999, "2099-12-31T23:59:59.999Z"),
    ],
)
def test_2_timestamp_is_rfc3339_utc_milliseconds_of_the_entry_ts(ts_ms, expected):
    norm = RunNormalizer(RUN)
    [event] = norm.line(0, ts_ms, "hello", "stderr")
    assert event["timestamp"] == expected


def test_2_timestamp_follows_each_entry_ts_back_and_forth():
    norm = RunNormalizer(RUN)
    other = RunNormalizer("other-run")
    stamps = []
    for seq, ts_ms in enumerate([1_500, 2_500, 1_700, 1_700, 61_000, 1_999]):
        other.line(seq, ts_ms + 1000, "interleaved", "stderr")
        stamps += [e["timestamp"] for e in norm.line(seq, ts_ms, "w", "stderr")]
    assert stamps == [
        "1970-01-01T00:00:01.500Z",
        "1970-01-01T00:00:02.500Z",
        "1970-01-01T00:00:01.700Z",
        "1970-01-01T00:00:01.700Z",
        "1970-01-01T00:01:01.000Z",
        "1970-01-01T00:00:01.999Z",
    ]


def test_2_event_is_flat_envelope_then_kind_fields():
    out = one_call("shell", {"command": "npm test"}, structured={"exit_code": 0})
    assert len(out) == 1
    assert list(out[0]) == [
        "eventId", "runId", "seq", "type", "timestamp", "lines",
        "command", "exitCode", "isSuccess", "tool", "toolCallId", "durationMs",
    ]  # fmt: skip


def test_2_lines_are_first_and_last_raw_seq_carried():
    f = Feed()
    f.line(req("call_1", "read", {"path": "/src/app.py"}))
    f.line("noise", stream="stderr")
    f.line(dumps(NOTIFICATION))
    out = f.line(resp("call_1"))
    assert out == [ev(2, "read", 3, (0, 3), path="/src/app.py", isSuccess=True, **tool("read", "call_1", 3000))]


def test_2_optional_fields_are_omitted_not_null():
    f = Feed()
    f.line(msg("m", "assistant", req_block("c1", "read", {"path": "/a"}), req_block("c2", "shell", {"command": "make"}),
               req_block("c3", "grep", {"pattern": "TODO"}), req_block("c4", "tree", {}),
               req_block("c5", "load_skill", {"path": "/s/SKILL.md"})))  # fmt: skip
    out = f.line(msg("u", "user", *[resp_block(c, status="pending") for c in ("c1", "c2", "c3", "c4", "c5")]))
    assert out == [
        ev(0, "read", 1, (0, 1), path="/a", **tool("read", "c1", 1000)),
        ev(1, "command", 1, (0, 1), command="make", **tool("shell", "c2", 1000)),
        ev(2, "search", 1, (0, 1), query="TODO", **tool("grep", "c3", 1000)),
        ev(3, "list", 1, (0, 1), **tool("tree", "c4", 1000)),
        ev(4, "skill", 1, (0, 1), path="/s/SKILL.md", **tool("load_skill", "c5", 1000)),
    ]
    assert f.line("a warning", stream="stderr") == [ev(5, "warning", 2, (2, 2), message="a warning")]


def test_2_tool_events_carry_verbatim_name_call_id_and_duration():
    f = Feed()
    f.line(req("toolu_01XyZ", "Developer__Shell", {"command": "npm test"}), ts=1790431333007)
    out = f.line(resp("toolu_01XyZ", structured={"exit_code": 0}), ts=1790431335512)
    assert out == [
        ev(0, "command", 1, (0, 1), ts=1790431335512, command="npm test", exitCode=0, isSuccess=True,
           tool="Developer__Shell", toolCallId="toolu_01XyZ", durationMs=2505)  # fmt: skip
    ]


def test_2_tool_failure_is_the_tool_event_with_is_success_false_never_error():
    f = Feed()
    f.line(req("c1", "shell", {"command": "cargo test"}))
    f.line(req("c2", "edit", {"path": "/src/lib.rs", "before": "x", "after": "y"}))
    out = f.lines(
        resp("c1", is_error=True, structured={"exit_code": 101}),
        resp("c2", status="error"),
    )
    assert out == [
        ev(0, "command", 2, (0, 2), command="cargo test", exitCode=101, isSuccess=False, **tool("shell", "c1", 2000)),
        ev(1, "write", 3, (1, 3), path="/src/lib.rs", isSuccess=False, **tool("edit", "c2", 2000)),
    ]
    assert "error" not in {e["type"] for e in f.events}


# ============================================================================ §3.1 lines
@pytest.mark.parametrize("line", ["", " ", "   \t ", "\r", "\t\r\n "])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_3_1_blank_line_yields_nothing(line, stream):
    f = Feed()
    f.line(say("m", "pending"))
    assert f.line(line, stream=stream) == []
    assert f.end() == [ev(0, "agent", 2, (0, 0), message="pending")]


def test_3_1_stderr_line_yields_warning_with_trimmed_message():
    f = Feed()
    assert f.line("  \tWARN failed to load extension 'github'  \r", stream="stderr") == [
        ev(0, "warning", 0, (0, 0), message="WARN failed to load extension 'github'")
    ]
    # stderr is never parsed, even when it looks like a goose record
    assert f.line(' {"type":"error","error":"x"} ', stream="stderr") == [
        ev(1, "warning", 1, (1, 1), message='{"type":"error","error":"x"}')
    ]


def test_3_1_stdout_line_is_trimmed_before_parsing():
    f = Feed()
    assert f.line("  \t" + dumps(NOTIFICATION) + " \r\n") == [ev(0, "unknown", 0, (0, 0), raw=NOTIFICATION)]


@pytest.mark.parametrize("pad", ["\x0c", "\x0b", "\x0c\x0b", " \x0c\t\x0b\r\n", "\u00a0"], ids=["ff", "vt", "ff-vt", "mixed", "nbsp"])
def test_3_1_stdout_line_trimmed_of_any_whitespace_before_parsing(pad):
    f = Feed()
    assert f.line(pad + dumps(NOTIFICATION) + pad) == [ev(0, "unknown", 0, (0, 0), raw=NOTIFICATION)]
    assert f.line(pad + "not json" + pad) == [ev(1, "warning", 1, (1, 1), message="not json")]
    assert f.line(pad + pad) == []
    assert f.events == [
        ev(0, "unknown", 0, (0, 0), raw=NOTIFICATION),
        ev(1, "warning", 1, (1, 1), message="not json"),
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        (BANNER, "new session · anthropic claude-sonnet-4"),
        ("\tstarting session | provider: anthropic model: claude-sonnet-4\r", "starting session | provider: anthropic model: claude-sonnet-4"),
        (' {"type":"message","message":{"role": ', '{"type":"message","message":{"role":'),
        ("{'type': 'error'}", "{'type': 'error'}"),
    ],
    ids=["banner", "session-line", "truncated-json", "python-repr"],
)  # fmt: skip
def test_3_1_non_json_stdout_line_yields_warning_with_trimmed_message(line, message):
    f = Feed()
    assert f.line(line) == [ev(0, "warning", 0, (0, 0), message=message)]


@pytest.mark.parametrize(
    "record",
    [
        {"type": "message"},
        {"type": "message", "message": None},
        {"type": "message", "message": "I'll read the file."},
        {"type": "message", "message": [{"type": "text", "text": "x"}]},
        {"type": "message", "id": "m", "message": 5},
    ],
    ids=["missing", "null", "string", "array", "number"],
)
def test_3_1_message_record_without_message_object_yields_unknown_without_flushing(record):
    f = Feed()
    f.line(say("m", "a"))
    assert f.line(dumps(record)) == [ev(0, "unknown", 1, (1, 1), raw=record)]
    f.line(say("m", "b"))
    assert f.end() == [ev(1, "agent", 3, (0, 2), message="ab")]


def test_3_1_notification_yields_unknown_without_flushing():
    f = Feed()
    f.line(say("m", "Building"))
    assert f.line(dumps(NOTIFICATION)) == [ev(0, "unknown", 1, (1, 1), raw=NOTIFICATION)]
    f.line(say("m", "..."))
    assert f.end() == [ev(1, "agent", 3, (0, 2), message="Building...")]
    assert [e["type"] for e in f.events] == ["unknown", "agent"]


def _error_after_span(record):
    f = Feed()
    f.line(say("m", "Working"))
    return f.line(dumps(record))


def test_3_1_error_record_flushes_then_error_with_error_message():
    record = {"type": "error", "error": {"message": "Rate limit exceeded", "code": 429}, "message": "top-level"}
    assert _error_after_span(record) == [
        ev(0, "agent", 1, (0, 0), message="Working"),
        ev(1, "error", 1, (1, 1), message="Rate limit exceeded", errorClass="rate_limit"),
    ]


@pytest.mark.parametrize(
    "record",
    [
        {"type": "error", "message": "Context length exceeded"},
        {"type": "error", "error": {"message": ""}, "message": "Context length exceeded"},
        {"type": "error", "error": {"code": 500, "message": None}, "message": "Context length exceeded"},
        {"type": "error", "error": {"message": 7}, "message": "Context length exceeded"},
    ],
    ids=["no-error", "empty-error-message", "null-error-message", "non-string-error-message"],
)
def test_3_1_error_record_message_falls_back_to_top_level_message(record):
    assert _error_after_span(record) == [
        ev(0, "agent", 1, (0, 0), message="Working"),
        ev(1, "error", 1, (1, 1), message="Context length exceeded", errorClass="context_length"),
    ]


@pytest.mark.parametrize(
    "record",
    [
        {"type": "error", "error": "Server error: 529 overloaded"},
        {"type": "error", "message": "", "error": "Server error: 529 overloaded"},
        {"type": "error", "message": ["x"], "error": "Server error: 529 overloaded"},
    ],
    ids=["only-error", "empty-message", "non-string-message"],
)
def test_3_1_error_record_message_falls_back_to_error_string(record):
    assert _error_after_span(record) == [
        ev(0, "agent", 1, (0, 0), message="Working"),
        ev(1, "error", 1, (1, 1), message="Server error: 529 overloaded", errorClass="provider_unavailable"),
    ]


@pytest.mark.parametrize(
    "record",
    [
        {"type": "error"},
        {"type": "error", "error": ""},
        {"type": "error", "error": {"message": ""}, "message": ""},
        {"type": "error", "error": {"code": 1}, "message": None},
        {"type": "error", "error": ["boom"], "message": 3},
        {"type": "error", "error": None},
    ],
    ids=["bare", "empty-error", "all-empty", "no-strings", "non-strings", "null-error"],
)
def test_3_1_error_record_message_defaults(record):
    assert _error_after_span(record) == [
        ev(0, "agent", 1, (0, 0), message="Working"),
        ev(1, "error", 1, (1, 1), message="goose reported an error", errorClass="other"),
    ]


def test_3_1_complete_flushes_and_drains_without_an_event_of_its_own():
    f = Feed()
    block = req_block("c1", "read", {"path": "/a"})
    f.line(say("m", "Reading"))  # 0
    f.line(msg("m", "assistant", block))  # 1: flushes "Reading"
    f.line(say("m", "Summary"))  # 2
    assert f.line(dumps({"type": "complete", "total_tokens": 10})) == [  # 3
        ev(1, "agent", 3, (2, 2), message="Summary"),
        ev(2, "unknown", 3, (1, 1), raw=block, tool="read", toolCallId="c1"),
    ]
    assert f.end() == []
    assert [e["type"] for e in f.events] == ["agent", "agent", "unknown"]


def test_3_1_complete_records_usage_in_camel_case():
    f = Feed()
    assert f.norm.usage is None
    record = {
        "type": "complete",
        "input_tokens": 1200,
        "output_tokens": 340,
        "total_tokens": 1540,
        "cache_read_input_tokens": 800,
        "cache_write_input_tokens": 64,
        "cost_usd": 0.0123,
    }
    assert f.line(dumps(record)) == []
    assert f.norm.usage == {
        "inputTokens": 1200,
        "outputTokens": 340,
        "totalTokens": 1540,
        "cacheReadInputTokens": 800,
        "cacheWriteInputTokens": 64,
        "costUsd": 0.0123,
    }


def test_3_1_complete_usage_omits_null_counters():
    f = Feed()
    f.line(dumps({"type": "complete", "input_tokens": 5, "output_tokens": None, "total_tokens": None}))
    assert f.norm.usage == {"inputTokens": 5}


def test_3_1_later_complete_supersedes_earlier_usage():
    f = Feed()
    f.line(dumps({"type": "complete", "input_tokens": 5, "total_tokens": 9}))
    f.line(dumps({"type": "complete", "total_tokens": 12, "cost_usd": 2}))
    assert f.norm.usage == {"totalTokens": 12, "costUsd": 2.0}


@pytest.mark.parametrize(
    "record",
    [
        {"type": "model_change", "model": "gpt-4o", "mode": "worker"},
        {"model": "no type"},
        {"type": 5, "message": {"role": "assistant", "content": [text("x")]}},
        {"type": "Message", "message": {"role": "assistant", "content": [text("x")]}},
        42,
        [1],
        "x",
        True,
        1.5,
    ],
    ids=["other-type", "no-type", "non-string-type", "wrong-case-type", "number", "array", "string", "bool", "float"],
)
def test_3_1_other_record_flushes_then_unknown(record):
    f = Feed()
    f.line(say("m", "a"))
    assert f.line(dumps(record)) == [
        ev(0, "agent", 1, (0, 0), message="a"),
        ev(1, "unknown", 1, (1, 1), raw=record),
    ]


def test_3_1_json_null_record_flushes_then_unknown_with_raw_null_text():
    # documented decision: raw is never null (§2), a JSON null is kept as its JSON text
    f = Feed()
    f.line(say("m", "a"))
    assert f.line(" null ") == [
        ev(0, "agent", 1, (0, 0), message="a"),
        ev(1, "unknown", 1, (1, 1), raw="null"),
    ]


# ============================================================================ §3.2 messages
def test_3_2_message_id_is_top_level_id_else_message_id():
    f = Feed()
    f.line(msg("msg_inner", "assistant", text("Hi "), top_id="msg_top"))  # id msg_top (top-level)
    f.line(msg("msg_top", "assistant", text("there.")))  # id msg_top (message.id)
    assert f.line(msg("msg_top", "assistant", text("Done."), top_id="msg_other")) == [
        ev(0, "agent", 2, (0, 1), message="Hi there.")
    ]
    assert f.end() == [ev(1, "agent", 3, (2, 2), message="Done.")]


def test_3_2_missing_null_or_non_string_id_is_the_empty_id():
    f = Feed()
    f.lines(
        say(None, "Ran "),
        say(MISSING, "into "),
        say(7, "this "),
        msg(None, "assistant", text("error"), top_id=None),
        msg({"x": 1}, "assistant", text("."), top_id=3),
    )
    assert f.end() == [ev(0, "agent", 5, (0, 4), message="Ran into this error.")]


def test_3_2_empty_id_is_distinct_from_other_ids():
    f = Feed()
    assert f.lines(say(None, "a"), say("", "b"), say("msg_1", "c")) == [ev(0, "agent", 2, (0, 1), message="ab")]
    assert f.end() == [ev(1, "agent", 3, (2, 2), message="c")]


@pytest.mark.parametrize("content", [MISSING, None, "text", {"type": "text", "text": "hi"}, 3])
def test_3_2_non_array_content_yields_nothing(content):
    record = message_record("m", "assistant")
    if content is MISSING:
        del record["message"]["content"]
    else:
        record["message"]["content"] = content
    f = Feed()
    f.line(say("m", "pending"))
    assert f.line(dumps(record)) == []
    assert f.end() == [ev(0, "agent", 2, (0, 0), message="pending")]


def test_3_2_assistant_text_accumulates_as_agent():
    f = Feed()
    assert f.line(say("msg_01", "I'll read the file.")) == []
    assert f.end() == [ev(0, "agent", 1, (0, 0), message="I'll read the file.")]


def test_3_2_user_text_is_ignored_and_does_not_flush():
    f = Feed()
    f.line(say("m", "agent "))
    assert f.line(msg("m", "user", text("/compact"))) == []
    assert f.line(msg("u", "user", text("user says"))) == []
    f.line(say("m", "text"))
    assert f.end() == [ev(0, "agent", 4, (0, 3), message="agent text")]


@pytest.mark.parametrize("value", ["", None, 5, ["a"]])
def test_3_2_empty_or_non_string_text_is_ignored(value):
    f = Feed()
    f.line(say("m", "a"))
    assert f.line(msg("m", "assistant", text(value))) == []
    assert f.end() == [ev(0, "agent", 2, (0, 0), message="a")]


def test_3_2_assistant_thinking_accumulates_as_reasoning():
    f = Feed()
    f.lines(muse("gen-1", "Line 22 slices"), muse("gen-1", " off by one."))
    assert f.end() == [ev(0, "reasoning", 2, (0, 1), message="Line 22 slices off by one.")]


@pytest.mark.parametrize("line", [msg("m", "user", think("user thinking")), muse("m", ""), msg("m", "assistant", think(None))])
def test_3_2_user_or_empty_thinking_is_ignored(line):
    f = Feed()
    f.line(muse("m", "x"))
    assert f.line(line) == []
    assert f.end() == [ev(0, "reasoning", 2, (0, 0), message="x")]


def test_3_2_redacted_thinking_is_ignored_and_does_not_flush():
    f = Feed()
    f.line(say("m", "a"))
    assert f.line(msg("m", "assistant", {"type": "redactedThinking", "data": "EqQB..."})) == []
    assert f.line(msg("other", "assistant", {"type": "redactedThinking", "data": "x"})) == []
    f.line(say("m", "b"))
    assert f.end() == [ev(0, "agent", 4, (0, 3), message="ab")]


def test_3_2_tool_request_block_flushes():
    f = Feed()
    f.line(say("m", "Let me check."))
    assert f.line(req("c1", "shell", {"command": "ls"}, mid="m")) == [ev(0, "agent", 1, (0, 0), message="Let me check.")]


def test_3_2_tool_response_block_flushes():
    f = Feed()
    f.line(req("c1", "shell", {"command": "make"}))
    f.line(say("m", "Meanwhile"))
    assert f.line(resp("c1", is_error=False)) == [
        ev(0, "agent", 2, (1, 1), message="Meanwhile"),
        ev(1, "command", 2, (0, 2), command="make", isSuccess=True, **tool("shell", "c1", 2000)),
    ]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
        {"type": "systemNotification", "notificationType": "creditsExhausted", "msg": "Please add credits.", "data": {"top_up_url": "https://x"}},
        {"type": "error", "kind": "other", "message": "Ran into this error: Server error: 529"},
        {"type": "reasoning", "text": "old"},
        {"text": "no type"},
        42,
        None,
    ],
    ids=["image", "systemNotification", "error", "reasoning", "no-type", "number", "null"],
)
def test_3_2_other_block_yields_unknown_without_flushing(block):
    f = Feed()
    f.line(say("m", "a"))
    raw = "null" if block is None else block  # raw is never null (§2): a null block is kept as its JSON text
    assert f.line(msg("m", "assistant", block)) == [ev(0, "unknown", 1, (1, 1), raw=raw)]
    f.line(say("m", "b"))
    assert f.end() == [ev(1, "agent", 3, (0, 2), message="ab")]


def test_3_2_blocks_are_processed_in_order():
    f = Feed()
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    out = f.line(msg("m", "assistant", think("plan"), text("Reading."), image, req_block("c1", "read", {"path": "/x"}), text("More.")))
    assert out == [
        ev(0, "reasoning", 0, (0, 0), message="plan"),
        ev(1, "unknown", 0, (0, 0), raw=image),
        ev(2, "agent", 0, (0, 0), message="Reading."),
    ]
    assert f.end() == [
        ev(3, "agent", 1, (0, 0), message="More."),
        ev(4, "unknown", 1, (0, 0), raw=req_block("c1", "read", {"path": "/x"}), tool="read", toolCallId="c1"),
    ]


# ============================================================================ §3.3 accumulation
def test_3_3_deltas_are_appended():
    f = Feed()
    f.lines(say("m", "Hel"), say("m", "lo, "), say("m", "world"))
    assert f.end() == [ev(0, "agent", 3, (0, 2), message="Hello, world")]


def test_3_3_cumulative_restatement_replaces_pending_text():
    f = Feed()
    f.lines(say("m", "The"), say("m", "The tests"), say("m", "The tests pass."), say("m", " Done."))
    assert f.end() == [ev(0, "agent", 4, (0, 3), message="The tests pass. Done.")]


def test_3_3_fragment_equal_to_pending_text_is_a_restatement():
    f = Feed()
    f.lines(say("m", "ha"), say("m", "ha"))
    assert f.end() == [ev(0, "agent", 2, (0, 1), message="ha")]


def test_3_3_fragment_of_another_kind_flushes():
    f = Feed()
    assert f.lines(muse("m", "think"), say("m", "say")) == [ev(0, "reasoning", 1, (0, 0), message="think")]
    assert f.line(muse("m", "again")) == [ev(1, "agent", 2, (1, 1), message="say")]
    assert f.end() == [ev(2, "reasoning", 3, (2, 2), message="again")]


def test_3_3_fragment_of_another_id_flushes():
    f = Feed()
    assert f.lines(say("a", "one"), say("b", "one more")) == [ev(0, "agent", 1, (0, 0), message="one")]
    assert f.end() == [ev(1, "agent", 2, (1, 1), message="one more")]


def test_3_3_reasoning_then_agent_in_one_message_id_keep_stream_order():
    f = Feed()
    out = f.lines(
        muse("msg_01", "Need to read "),
        muse("msg_01", "the config."),
        say("msg_01", "Reading "),
        say("msg_01", "config."),
    )
    assert out == [ev(0, "reasoning", 2, (0, 1), message="Need to read the config.")]
    assert f.end() == [ev(1, "agent", 4, (2, 3), message="Reading config.")]


@pytest.mark.parametrize(
    "trigger, after",
    [
        (req("c1", "read", {"path": "/x"}), []),
        (resp("nobody"), [("unknown", {"raw": resp_block("nobody"), "toolCallId": "nobody"})]),
        (dumps({"type": "error", "error": "boom"}), [("error", {"message": "boom", "errorClass": "other"})]),
        (dumps({"type": "complete", "total_tokens": 1}), []),
        (dumps({"type": "model_change", "model": "m", "mode": "lead"}), [("unknown", {"raw": {"type": "model_change", "model": "m", "mode": "lead"}})]),
        ("[]", [("unknown", {"raw": []})]),
    ],
    ids=["toolRequest", "toolResponse", "error", "complete", "unrecognized", "non-object"],
)
def test_3_3_flush_triggers_emit_the_span_first(trigger, after):
    f = Feed()
    f.lines(say("m", "a"), say("m", "b"))
    out = f.line(trigger)
    assert out == [ev(0, "agent", 2, (0, 1), message="ab")] + [
        ev(1 + i, etype, 2, (2, 2), **fields) for i, (etype, fields) in enumerate(after)
    ]


def test_3_3_end_flushes_the_span():
    f = Feed()
    f.lines(muse("m", "a"), muse("m", "b"))
    assert f.end() == [ev(0, "reasoning", 2, (0, 1), message="ab")]


def test_3_3_non_triggers_pass_the_pending_span():
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    f = Feed()
    f.line(say("m", "a"))
    out = f.lines(
        dumps(NOTIFICATION),  # 1 notification
        msg("m", "assistant", image),  # 2 unknown block
        msg("m", "assistant", {"type": "redactedThinking", "data": "x"}),  # 3 ignored block
        msg("u", "user", text("ignored")),  # 4 ignored block
        "extension failed", # 5 banner-style warning
        "",  # 6 blank
    )
    out += f.line("stderr warning", stream="stderr")  # 7
    f.line(say("m", "b"))  # 8
    assert out == [
        ev(0, "unknown", 1, (1, 1), raw=NOTIFICATION),
        ev(1, "unknown", 2, (2, 2), raw=image),
        ev(2, "warning", 5, (5, 5), message="extension failed"),
        ev(3, "warning", 7, (7, 7), message="stderr warning"),
    ]
    assert f.end() == [ev(4, "agent", 9, (0, 8), message="ab")]


def test_3_3_span_lines_are_first_and_last_fragment_seq():
    f = Feed()
    f.line(say("m", "a"))  # 0
    f.line("w", stream="stderr")  # 1
    f.line(say("m", "b"))  # 2
    f.line(msg("u", "user", text("x")))  # 3
    f.line(say("m", "c"))  # 4
    f.line(dumps(NOTIFICATION))  # 5
    assert f.line(dumps({"type": "error", "error": "e"})) == [  # 6
        ev(2, "agent", 6, (0, 4), message="abc"),
        ev(3, "error", 6, (6, 6), message="e", errorClass="other"),
    ]


def test_3_3_flushed_span_timestamp_is_ts_of_the_flushing_entry():
    f = Feed()
    f.line(say("m", "a"), ts=1790431333001)
    f.line(say("m", "b"), ts=1790431333002)
    assert f.line(say("n", "c"), ts=1790431334999) == [ev(0, "agent", 2, (0, 1), ts=1790431334999, message="ab")]
    assert f.end(ts=1790431340000) == [ev(1, "agent", 3, (2, 2), ts=1790431340000, message="c")]
    assert [e["timestamp"] for e in f.events] == ["2026-09-26T14:02:14.999Z", "2026-09-26T14:02:20.000Z"]


def test_3_3_span_beyond_cap_is_cut_and_marked_truncated():
    f = Feed(Limits(max_span_chars=10, max_pending_tools=256))
    f.lines(say("m", "abcdef"), say("m", "ghijkl"), say("m", "mno"))
    f.lines(muse("m", "0123456789ABC"))
    assert f.events == [ev(0, "agent", 3, (0, 2), message="abcdefghij", truncated=True)]
    assert f.end() == [ev(1, "reasoning", 4, (3, 3), message="0123456789", truncated=True)]


def test_3_3_span_within_cap_has_no_truncated_key():
    f = Feed(Limits(max_span_chars=10, max_pending_tools=256))
    f.lines(say("m", "abcde"), say("m", "fghij"))
    [event] = f.end()
    assert event == ev(0, "agent", 2, (0, 1), message="abcdefghij")
    assert "truncated" not in event


def test_3_3_cumulative_restatement_after_truncation_stays_cut():
    f = Feed(Limits(max_span_chars=5, max_pending_tools=256))
    f.lines(say("m", "Hello"), say("m", "Hello world"), say("m", "Hello world again"))
    assert f.end() == [ev(0, "agent", 3, (0, 2), message="Hello", truncated=True)]


def test_3_3_cap_counts_characters_not_bytes():
    f = Feed(Limits(max_span_chars=3, max_pending_tools=256))
    f.line(say("m", "äöü"))
    assert f.end() == [ev(0, "agent", 1, (0, 0), message="äöü")]


# ============================================================================ §3.4 tool calls
READ_ARGS = {"path": "/repo/README.md"}


def _read_event(cid, req_seq, resp_seq, n=0, name="read", **extra):
    return ev(n, "read", resp_seq, (req_seq, resp_seq), path="/repo/README.md", **extra,
              **tool(name, cid, 1000 * (resp_seq - req_seq)))  # fmt: skip


@pytest.mark.parametrize(
    "request_block",
    [
        {"type": "toolRequest", "id": "c1", "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}}},
        {"type": "toolRequest", "toolRequest": {"id": "c1"}, "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}}},
        {"type": "toolRequest", "toolCallId": "c1", "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}}},
        {"type": "toolRequest", "id": "c1", "toolRequest": {"id": "zz"}, "toolCallId": "yy", "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}}},
        {"type": "toolRequest", "toolRequest": {"id": "c1"}, "toolCallId": "yy", "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}}},
    ],
    ids=["id", "toolRequest.id", "toolCallId", "id-wins", "toolRequest.id-wins"],
)
def test_3_4_request_id_aliases(request_block):
    f = Feed()
    f.line(msg("m", "assistant", request_block))
    assert f.line(resp("c1")) == [_read_event("c1", 0, 1, isSuccess=True)]


@pytest.mark.parametrize(
    "request_block, name",
    [
        ({"type": "toolRequest", "id": "c1", "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}}}, "read"),
        ({"type": "toolRequest", "id": "c1", "tool_call": {"status": "success", "value": {"name": "read_image", "arguments": READ_ARGS}}}, "read_image"),
        ({"type": "toolRequest", "id": "c1", "name": "READ", "arguments": READ_ARGS}, "READ"),
        ({"type": "toolRequest", "id": "c1", "name": "shell", "toolCall": {"status": "success", "value": {"name": "read", "arguments": READ_ARGS}},
          "tool_call": {"value": {"name": "grep"}}}, "read"),
        ({"type": "toolRequest", "id": "c1", "name": "shell", "tool_call": {"value": {"name": "read", "arguments": READ_ARGS}}}, "read"),
    ],
    ids=["toolCall.value.name", "tool_call.value.name", "name", "toolCall-wins", "tool_call-wins"],
)  # fmt: skip
def test_3_4_request_name_aliases(request_block, name):
    f = Feed()
    f.line(msg("m", "assistant", request_block))
    assert f.line(resp("c1")) == [_read_event("c1", 0, 1, name=name, isSuccess=True)]


@pytest.mark.parametrize(
    "request_block",
    [
        {"type": "toolRequest", "id": "c1", "toolCall": {"value": {"name": "read", "arguments": READ_ARGS}}, "arguments": {"path": "/no"}},
        {"type": "toolRequest", "id": "c1", "tool_call": {"value": {"name": "read", "arguments": READ_ARGS}}, "arguments": {"path": "/no"}},
        {"type": "toolRequest", "id": "c1", "toolCall": {"value": {"name": "read"}}, "arguments": READ_ARGS, "input": {"path": "/no"}},
        {"type": "toolRequest", "id": "c1", "name": "read", "input": READ_ARGS},
        {"type": "toolRequest", "id": "c1", "toolCall": {"value": {"name": "read", "arguments": READ_ARGS}},
         "tool_call": {"value": {"arguments": {"path": "/no"}}}},
    ],
    ids=["toolCall.value.arguments", "tool_call.value.arguments", "arguments", "input", "toolCall-wins"],
)  # fmt: skip
def test_3_4_request_input_aliases(request_block):
    f = Feed()
    f.line(msg("m", "assistant", request_block))
    assert f.line(resp("c1")) == [_read_event("c1", 0, 1, isSuccess=True)]


def test_3_4_request_without_name_yields_unknown_at_once():
    truncated = {"type": "toolRequest", "id": "call_9",
                 "toolCall": {"status": "error", "error": "-32602: The model's response was truncated"}}  # fmt: skip
    f = Feed()
    f.line(say("m", "Creating the issue"))
    assert f.line(msg("m", "assistant", truncated)) == [
        ev(0, "agent", 1, (0, 0), message="Creating the issue"),
        ev(1, "unknown", 1, (1, 1), raw=truncated, toolCallId="call_9"),
    ]
    error_response = {"type": "toolResponse", "id": "call_9", "toolResult": {"status": "error", "error": "-32602: truncated"}}
    assert f.line(msg("u", "user", error_response)) == [ev(2, "unknown", 2, (2, 2), raw=error_response, toolCallId="call_9")]
    assert f.end() == []


@pytest.mark.parametrize(
    "block",
    [
        {"type": "toolRequest", "toolCall": {"status": "success", "value": {"name": "shell", "arguments": {"command": "ls"}}}},
        {"type": "toolRequest", "id": 17, "toolCall": {"status": "success", "value": {"name": "shell", "arguments": {"command": "ls"}}}},
        {"type": "toolRequest", "id": None, "toolCall": {"status": "success", "value": {"name": "shell", "arguments": {"command": "ls"}}}},
    ],
    ids=["missing", "int", "null"],
)
def test_3_4_request_without_string_id_yields_unknown_at_once(block):
    f = Feed()
    assert f.line(msg("m", "assistant", block)) == [ev(0, "unknown", 0, (0, 0), raw=block, tool="shell")]
    assert f.end() == []


def test_3_4_request_with_non_string_name_yields_unknown_at_once():
    block = {"type": "toolRequest", "id": "c1", "toolCall": {"status": "success", "value": {"name": 5, "arguments": {}}}}
    f = Feed()
    assert f.line(msg("m", "assistant", block)) == [ev(0, "unknown", 0, (0, 0), raw=block, toolCallId="c1")]


@pytest.mark.parametrize(
    "response_block",
    [
        {"type": "toolResponse", "id": "c1", "toolResult": {"status": "success", "value": {"content": []}}},
        {"type": "toolResponse", "toolResponse": {"id": "c1"}, "toolResult": {"status": "success", "value": {"content": []}}},
        {"type": "toolResponse", "toolCallId": "c1", "toolResult": {"status": "success", "value": {"content": []}}},
        {"type": "toolResponse", "id": "c1", "toolResponse": {"id": "zz"}, "toolCallId": "yy", "toolResult": {"status": "success"}},
    ],
    ids=["id", "toolResponse.id", "toolCallId", "id-wins"],
)
def test_3_4_response_id_aliases(response_block):
    f = Feed()
    f.line(req("c1", "read", READ_ARGS))
    assert f.line(msg("u", "user", response_block)) == [_read_event("c1", 0, 1, isSuccess=True)]


@pytest.mark.parametrize(
    "response_block, success",
    [
        ({"type": "toolResponse", "id": "c1", "toolResponse": {"toolResult": {"status": "error", "error": "x"}}}, False),
        ({"type": "toolResponse", "id": "c1", "toolResponse": {"toolResult": {"status": "success", "value": {"isError": True}}}}, False),
        ({"type": "toolResponse", "id": "c1", "toolResult": {"status": "success"}, "toolResponse": {"toolResult": {"status": "error"}}}, True),
    ],
    ids=["nested-error", "nested-isError", "toolResult-wins"],
)
def test_3_4_response_result_is_toolResult_else_toolResponse_toolResult(response_block, success):
    f = Feed()
    f.line(req("c1", "read", READ_ARGS))
    assert f.line(msg("u", "user", response_block)) == [_read_event("c1", 0, 1, isSuccess=success)]


@pytest.mark.parametrize(
    "response_block, success",
    [
        ({"type": "toolResponse", "id": "c1", "status": "error"}, False),
        ({"type": "toolResponse", "id": "c1", "status": "success"}, True),
        ({"type": "toolResponse", "id": "c1", "status": "error", "toolResult": {"value": {"content": []}}}, False),
        ({"type": "toolResponse", "id": "c1", "status": "success", "toolResult": {"status": "error", "error": "x"}}, False),
    ],
    ids=["block-error", "block-success", "result-without-status", "result-status-wins"],
)
def test_3_4_response_status_is_result_status_else_block_status(response_block, success):
    f = Feed()
    f.line(req("c1", "read", READ_ARGS))
    assert f.line(msg("u", "user", response_block)) == [_read_event("c1", 0, 1, isSuccess=success)]


def test_3_4_status_error_is_not_success():
    assert one_call("read", READ_ARGS, status="error") == [_read_event("call_1", 0, 1, isSuccess=False)]


@pytest.mark.parametrize("is_error", [None, False, "true", 1])
def test_3_4_status_success_is_success(is_error):
    assert one_call("read", READ_ARGS, is_error=is_error) == [_read_event("call_1", 0, 1, isSuccess=True)]


def test_3_4_status_success_with_value_is_error_true_is_not_success():
    assert one_call("read", READ_ARGS, is_error=True) == [_read_event("call_1", 0, 1, isSuccess=False)]


def test_3_4_success_with_legacy_bare_content_array_value_is_success():
    block = {"type": "toolResponse", "id": "call_1", "toolResult": {"status": "success", "value": [{"type": "text", "text": "x"}]}}
    assert one_call("read", READ_ARGS, response=msg("u", "user", block)) == [_read_event("call_1", 0, 1, isSuccess=True)]


@pytest.mark.parametrize(
    "response_block",
    [
        {"type": "toolResponse", "id": "call_1", "toolResult": {"status": "pending", "value": {"isError": True}}},
        {"type": "toolResponse", "id": "call_1", "toolResult": {"value": {"isError": False}}},
        {"type": "toolResponse", "id": "call_1"},
        {"type": "toolResponse", "id": "call_1", "toolResult": "weird", "status": "Success"},
    ],
    ids=["other-status", "no-status", "no-result", "non-object-result"],
)
def test_3_4_other_or_missing_status_omits_is_success(response_block):
    [event] = one_call("read", READ_ARGS, response=msg("u", "user", response_block))
    assert event == _read_event("call_1", 0, 1)
    assert "isSuccess" not in event


def test_3_4_responses_resolve_by_id_in_any_order():
    f = Feed()
    f.line(msg("m", "assistant", req_block("a", "read", {"path": "/a"}), req_block("b", "shell", {"command": "make"})))
    f.line(msg("m", "assistant", req_block("c", "grep", {"pattern": "x"})))
    out = f.lines(resp("c"), resp("a", is_error=True), resp("b"))
    assert out == [
        ev(0, "search", 2, (1, 2), query="x", isSuccess=True, **tool("grep", "c", 1000)),
        ev(1, "read", 3, (0, 3), path="/a", isSuccess=False, **tool("read", "a", 3000)),
        ev(2, "command", 4, (0, 4), command="make", isSuccess=True, **tool("shell", "b", 4000)),
    ]
    assert f.end() == []


def test_3_4_same_id_resolves_the_oldest_pending_request_first():
    f = Feed()
    f.line(req("dup", "read", {"path": "/first"}))
    f.line(req("dup", "read", {"path": "/second"}))
    assert f.line(resp("dup", is_error=False)) == [
        ev(0, "read", 2, (0, 2), path="/first", isSuccess=True, **tool("read", "dup", 2000))
    ]
    assert f.line(resp("dup", status="error")) == [
        ev(1, "read", 3, (1, 3), path="/second", isSuccess=False, **tool("read", "dup", 2000))
    ]


def test_3_4_response_matching_no_request_yields_unknown():
    f = Feed()
    f.line(req("c1", "read", READ_ARGS))
    block = resp_block("c2", structured={"exit_code": 0})
    assert f.line(msg("u", "user", block)) == [ev(0, "unknown", 1, (1, 1), raw=block, toolCallId="c2")]
    no_id = {"type": "toolResponse", "toolResult": {"status": "success"}}
    assert f.line(msg("u", "user", no_id)) == [ev(1, "unknown", 2, (2, 2), raw=no_id)]


def test_3_4_unanswered_requests_at_complete_yield_unknown_in_request_order():
    f = Feed()
    b1, b2, b3 = req_block("c1", "read", {"path": "/a"}), req_block("c2", "shell", {"command": "x"}), req_block("c3", "mcp__thing")
    f.line(msg("m", "assistant", b1, b2))
    f.line(msg("m", "assistant", b3))
    f.line(resp("c2"))
    assert f.line(dumps({"type": "complete", "total_tokens": 5})) == [
        ev(1, "unknown", 3, (0, 0), raw=b1, tool="read", toolCallId="c1"),
        ev(2, "unknown", 3, (1, 1), raw=b3, tool="mcp__thing", toolCallId="c3"),
    ]
    # a response arriving after the drain matches nothing any more
    assert f.line(resp("c1")) == [ev(3, "unknown", 4, (4, 4), raw=resp_block("c1"), toolCallId="c1")]


def test_3_4_unanswered_requests_at_end_yield_unknown_in_request_order():
    f = Feed()
    b1, b2 = req_block("c1", "write", {"path": "/a"}), req_block("c2", "tree", {"path": "/"})
    f.line(msg("m", "assistant", b1))
    f.line(msg("m", "assistant", b2))
    assert f.end() == [
        ev(0, "unknown", 2, (0, 0), raw=b1, tool="write", toolCallId="c1"),
        ev(1, "unknown", 2, (1, 1), raw=b2, tool="tree", toolCallId="c2"),
    ]


def test_3_4_pending_cap_surfaces_the_oldest_request_at_once():
    f = Feed(Limits(max_span_chars=1000, max_pending_tools=2))
    blocks = [req_block(f"c{i}", "read", {"path": f"/f{i}"}) for i in range(4)]
    assert f.line(msg("m", "assistant", blocks[0])) == []
    assert f.line(msg("m", "assistant", blocks[1])) == []
    assert f.line(msg("m", "assistant", blocks[2])) == [ev(0, "unknown", 2, (0, 0), raw=blocks[0], tool="read", toolCallId="c0")]
    assert f.line(msg("m", "assistant", blocks[3])) == [ev(1, "unknown", 3, (1, 1), raw=blocks[1], tool="read", toolCallId="c1")]
    assert f.line(resp("c0")) == [ev(2, "unknown", 4, (4, 4), raw=resp_block("c0"), toolCallId="c0")]
    assert f.line(resp("c2")) == [ev(3, "read", 5, (2, 5), path="/f2", isSuccess=True, **tool("read", "c2", 3000))]
    assert f.end() == [ev(4, "unknown", 6, (3, 3), raw=blocks[3], tool="read", toolCallId="c3")]


@pytest.mark.parametrize(
    "structured, expected",
    [
        ({"stdout": "", "stderr": "", "exit_code": 0}, {"exitCode": 0}),
        ({"exit_code": 101}, {"exitCode": 101}),
        ({"exit_code": -9}, {"exitCode": -9}),
        ({"exit_code": True}, {}),
        ({"exit_code": "1"}, {}),
        ({"exit_code": 1.0}, {}),
        ({"exit_code": None, "timed_out": True}, {}),
        ({"stdout": "x"}, {}),
        ("exit_code", {}),
        (None, {}),
    ],
)
def test_3_4_exit_code_only_when_structured_exit_code_is_an_int(structured, expected):
    out = one_call("shell", {"command": "npm test"}, structured=structured)
    assert out == [tool_event("command", "shell", command="npm test", **expected, isSuccess=True)]


def test_3_4_exit_code_only_on_command_events():
    assert one_call("read", READ_ARGS, structured={"exit_code": 1}) == [_read_event("call_1", 0, 1, isSuccess=True)]
    assert one_call("shell", {"command": "cat a"}, structured={"exit_code": 0}) == [
        tool_event("read", "shell", path="a", isSuccess=True)
    ]


# ============================================================================ §3.5 classification
@pytest.mark.parametrize(
    "name, args, expected",
    [
        ("developer__text_editor", {"command": "view", "path": "/a"}, ("read", {"path": "/a"})),
        ("developer__shell", {"command": "make"}, ("command", {"command": "make"})),
        ("my-ext__read", {"path": "/a"}, ("read", {"path": "/a"})),
        ("__read", {"path": "/a"}, ("read", {"path": "/a"})),
    ],
)
def test_3_5_name_is_split_at_the_first_double_underscore(name, args, expected):
    etype, fields = expected
    assert one_call(name, args) == [tool_event(etype, name, **fields, isSuccess=True)]


@pytest.mark.parametrize("name", ["a__b__c", "x__read__y", "read__", "developer__", "github__search_issues", "delegate"])
def test_3_5_unsplit_remainder_is_the_base_name(name):
    args = {"path": "/a", "command": "ls", "pattern": "p"}
    out = one_call(name, args)
    assert out == [tool_event("unknown", name, raw=resp_block("call_1"))]


def test_3_5_todo_extension_is_consumed():
    f = Feed()
    f.line(say("m", "Planning"))
    assert f.line(req("c1", "todo__todo_write", {"content": "- [ ] a"})) == [ev(0, "agent", 1, (0, 0), message="Planning")]
    assert f.line(resp("c1")) == []
    assert f.line(resp("c1", status="error")) == [ev(1, "unknown", 3, (3, 3), raw=resp_block("c1", status="error"), toolCallId="c1")]
    f.line(req("c2", "todo__todo_read"))
    f.line(req("c3", "todo__anything", {}))
    assert f.line(dumps({"type": "complete", "total_tokens": 1})) == []
    f.line(req("c4", "todo__todo_write", {"content": ""}))
    assert f.end(exit_code=0) == []
    assert f.events == [
        ev(0, "agent", 1, (0, 0), message="Planning"),
        ev(1, "unknown", 3, (3, 3), raw=resp_block("c1", status="error"), toolCallId="c1"),
    ]


def test_3_5_todo_request_evicted_by_pending_cap_yields_nothing():
    f = Feed(Limits(max_span_chars=1000, max_pending_tools=1))
    assert f.line(req("c1", "todo__todo_write", {"content": "- [ ] fix the test"})) == []
    assert f.line(req("c2", "read", {"path": "/a"})) == []  # evicts the todo call: no unknown
    assert f.line(resp("c2")) == [ev(0, "read", 2, (1, 2), path="/a", isSuccess=True, **tool("read", "c2", 1000))]
    assert f.end() == []


@pytest.mark.parametrize("finish", ["end", "complete"])
def test_3_5_unanswered_todo_request_is_not_drained_as_unknown(finish):
    f = Feed()
    read_block = req_block("c2", "read", {"path": "/a"})
    f.line(msg("m", "assistant", req_block("c1", "todo__todo_write", {"content": "- [ ] x"}), read_block))  # 0
    f.line(req("c3", "todo__todo_read"))  # 1
    out = f.end() if finish == "end" else f.line(dumps({"type": "complete"}))  # 2
    assert out == [ev(0, "unknown", 2, (0, 0), raw=read_block, tool="read", toolCallId="c2")]
    if finish == "complete":
        assert f.end() == []


@pytest.mark.parametrize(
    "name, args, expected",
    [
        ("Shell", {"command": "make"}, ("command", {"command": "make"})),
        ("READ", {"path": "/a"}, ("read", {"path": "/a"})),
        ("Read_Image", {"path": "/a.png"}, ("read", {"path": "/a.png"})),
        ("developer__TEXT_EDITOR", {"command": "view", "path": "/a"}, ("read", {"path": "/a"})),
        ("Write", {"path": "/a"}, ("write", {"path": "/a"})),
        ("EDIT", {"path": "/a"}, ("write", {"path": "/a"})),
        ("Grep", {"pattern": "x"}, ("search", {"query": "x"})),
        ("GLOB", {"pattern": "*.py"}, ("search", {"query": "*.py"})),
        ("List", {}, ("list", {})),
        ("TREE", {"path": "/a"}, ("list", {"path": "/a"})),
        ("Load_Skill", {"name": "pdf"}, ("skill", {"path": "skills/pdf/SKILL.md", "skillName": "pdf"})),
        ("SKILL", {"name": "pdf"}, ("skill", {"path": "skills/pdf/SKILL.md", "skillName": "pdf"})),
    ],
)
def test_3_5_base_names_match_case_insensitively(name, args, expected):
    etype, fields = expected
    assert one_call(name, args) == [tool_event(etype, name, **fields, isSuccess=True)]


# ---------------------------------------------------------------------------- read
@pytest.mark.parametrize("name", ["read", "read_image"])
@pytest.mark.parametrize("key", ["path", "file_path", "filePath", "filepath", "abs_path", "absolutePath", "source"])
def test_3_5_read_path_aliases(name, key):
    assert one_call(name, {key: "/repo/src/app.py"}) == [tool_event("read", name, path="/repo/src/app.py", isSuccess=True)]


@pytest.mark.parametrize(
    "args, path",
    [
        ({"path": "/a", "file_path": "/b", "source": "/c"}, "/a"),
        ({"path": "", "file_path": "/b"}, "/b"),
        ({"path": None, "file_path": 5, "filePath": ["/x"], "filepath": "/d"}, "/d"),
        ({"abs_path": "", "absolutePath": {"p": "/x"}, "source": "/src"}, "/src"),
        ({"source": "/s", "abs_path": "/abs"}, "/abs"),
    ],
    ids=["path-wins", "empty-skipped", "non-strings-skipped", "last-alias", "alias-order-not-dict-order"],
)
def test_3_5_read_path_is_the_first_non_empty_string(args, path):
    assert one_call("read", args) == [tool_event("read", "read", path=path, isSuccess=True)]


@pytest.mark.parametrize("key", ["offset", "start_line", "startLine", "line"])
def test_3_5_read_start_line_aliases(key):
    assert one_call("read", {"path": "/a", key: 12}) == [tool_event("read", "read", path="/a", startLine=12, isSuccess=True)]


def test_3_5_read_start_line_alias_order():
    out = one_call("read", {"path": "/a", "line": 9, "startLine": 7, "start_line": 5, "offset": 3})
    assert out == [tool_event("read", "read", path="/a", startLine=3, isSuccess=True)]


@pytest.mark.parametrize("start", [0, -1, -20])
def test_3_5_read_start_line_zero_or_negative_is_none(start):
    [event] = one_call("read", {"path": "/a", "offset": start})
    assert event == tool_event("read", "read", path="/a", isSuccess=True)
    assert "startLine" not in event and "endLine" not in event


@pytest.mark.parametrize("start", [0, -5])
def test_3_5_read_start_line_none_gives_no_end_from_count(start):
    [event] = one_call("read", {"path": "/a", "offset": start, "limit": 10})
    assert event == tool_event("read", "read", path="/a", isSuccess=True)


@pytest.mark.parametrize("key", ["end_line", "endLine"])
def test_3_5_read_end_line_aliases(key):
    out = one_call("read", {"path": "/a", "start_line": 10, key: 20})
    assert out == [tool_event("read", "read", path="/a", startLine=10, endLine=20, isSuccess=True)]


def test_3_5_read_end_line_without_start():
    assert one_call("read", {"path": "/a", "end_line": 7}) == [tool_event("read", "read", path="/a", endLine=7, isSuccess=True)]


def test_3_5_read_explicit_end_line_wins_over_count():
    out = one_call("read", {"path": "/a", "offset": 10, "limit": 100, "endLine": 15})
    assert out == [tool_event("read", "read", path="/a", startLine=10, endLine=15, isSuccess=True)]


@pytest.mark.parametrize("key", ["limit", "line_count", "lineCount", "num_lines", "numLines"])
def test_3_5_read_end_line_is_start_plus_count_minus_one(key):
    out = one_call("read", {"path": "/a", "offset": 10, key: 5})
    assert out == [tool_event("read", "read", path="/a", startLine=10, endLine=14, isSuccess=True)]


def test_3_5_read_count_of_one_ends_at_the_start():
    out = one_call("read", {"path": "/a", "line": 42, "num_lines": 1})
    assert out == [tool_event("read", "read", path="/a", startLine=42, endLine=42, isSuccess=True)]


@pytest.mark.parametrize(
    "args",
    [
        {"path": "/a", "offset": 10},
        {"path": "/a", "offset": 10, "limit": 0},
        {"path": "/a", "offset": 10, "limit": -3},
        {"path": "/a", "offset": 10, "limit": "5"},
        {"path": "/a", "offset": 10, "limit": None},
    ],
    ids=["no-count", "zero", "negative", "string", "null"],
)
def test_3_5_read_no_end_line_without_a_usable_count(args):
    [event] = one_call("read", args)
    assert event == tool_event("read", "read", path="/a", startLine=10, isSuccess=True)
    assert "endLine" not in event


def test_3_5_read_no_range_without_count_or_start():
    [event] = one_call("read", {"path": "/a", "limit": 50})
    assert event == tool_event("read", "read", path="/a", isSuccess=True)


@pytest.mark.parametrize("key", ["end_line", "endLine"])
def test_3_5_read_end_before_start_is_dropped(key):
    [event] = one_call("read", {"path": "/a", "offset": 10, key: 5})
    assert event == tool_event("read", "read", path="/a", startLine=10, isSuccess=True)
    assert "endLine" not in event


# ---------------------------------------------------------------------------- write
@pytest.mark.parametrize("name", ["write", "edit"])
@pytest.mark.parametrize("key", ["path", "file_path", "filePath", "filepath", "abs_path", "absolutePath", "source"])
def test_3_5_write_and_edit_carry_the_path_only(name, key):
    args = {key: "/repo/src/lib.rs", "content": "fn main() {}", "offset": 3, "end_line": 9, "old_str": "a", "new_str": "b"}
    [event] = one_call(name, args)
    assert event == tool_event("write", name, path="/repo/src/lib.rs", isSuccess=True)
    assert "startLine" not in event and "endLine" not in event


# ---------------------------------------------------------------------- text_editor
@pytest.mark.parametrize("key", ["command", "cmd"])
@pytest.mark.parametrize(
    "command, etype",
    [
        ("view", "read"),
        ("read", "read"),
        ("write", "write"),
        ("create", "write"),
        ("overwrite", "write"),
        ("edit", "write"),
        ("str_replace", "write"),
        ("insert", "write"),
        ("move", "write"),
        ("rename", "write"),
        ("delete", "write"),
    ],
)
def test_3_5_text_editor_by_command(key, command, etype):
    name = "developer__text_editor"
    assert one_call(name, {key: command, "path": "/repo/a.py"}) == [tool_event(etype, name, path="/repo/a.py", isSuccess=True)]


@pytest.mark.parametrize("key", ["command", "cmd"])
@pytest.mark.parametrize("command", ["undo_edit", "View", "WRITE", "Str_Replace", "", "list"])
def test_3_5_text_editor_other_commands_are_unknown(key, command):
    name = "developer__text_editor"
    assert one_call(name, {key: command, "path": "/repo/a.py"}) == [tool_event("unknown", name, raw=resp_block("call_1"))]


def test_3_5_text_editor_without_command_is_unknown():
    assert one_call("text_editor", {"path": "/repo/a.py"}) == [tool_event("unknown", "text_editor", raw=resp_block("call_1"))]


# ---------------------------------------------------------------------------- shell
@pytest.mark.parametrize("key", ["command", "cmd", "script"])
def test_3_5_shell_command_aliases(key):
    out = one_call("developer__shell", {key: "npm test"}, structured={"exit_code": 0})
    assert out == [tool_event("command", "developer__shell", command="npm test", exitCode=0, isSuccess=True)]


@pytest.mark.parametrize(
    "args, command",
    [
        ({"command": "make", "cmd": "npm test", "script": "ls"}, "make"),
        ({"command": "", "cmd": "npm test"}, "npm test"),
        ({"command": 5, "cmd": None, "script": "npm test"}, "npm test"),
    ],
    ids=["command-wins", "empty-skipped", "non-strings-skipped"],
)
def test_3_5_shell_command_is_the_first_non_empty_string(args, command):
    assert one_call("shell", args) == [tool_event("command", "shell", command=command, isSuccess=True)]


@pytest.mark.parametrize("is_error, success", [(None, True), (True, False)])
def test_3_5_shell_cat_wiring_gives_one_read_per_operand_without_exit_code(is_error, success):
    f = Feed()
    f.line(req("call_1", "developer__shell", {"command": "cat a b"}))
    out = f.line(resp("call_1", is_error=is_error, structured={"exit_code": 0 if success else 1}))
    assert out == [
        ev(0, "read", 1, (0, 1), path="a", isSuccess=success, **tool("developer__shell", "call_1", 1000)),
        ev(1, "read", 1, (0, 1), path="b", isSuccess=success, **tool("developer__shell", "call_1", 1000)),
    ]
    assert all("exitCode" not in e for e in out)


def test_3_5_shell_command_wiring_carries_exit_code():
    f = Feed()
    f.line(req("call_1", "shell", {"command": "npm test"}), ts=5_000)
    out = f.line(resp("call_1", is_error=True, structured={"stdout": "", "stderr": "1 failed", "exit_code": 1}), ts=12_345)
    assert out == [
        ev(0, "command", 1, (0, 1), ts=12_345, command="npm test", exitCode=1, isSuccess=False,
           **tool("shell", "call_1", 7_345))  # fmt: skip
    ]


# ------------------------------------------------------------------------ grep/glob
@pytest.mark.parametrize("name", ["grep", "glob", "developer__grep"])
@pytest.mark.parametrize("key", ["pattern", "query", "regex", "glob", "search", "searchText", "q"])
def test_3_5_search_query_aliases(name, key):
    assert one_call(name, {key: "TODO("}) == [tool_event("search", name, query="TODO(", isSuccess=True)]


@pytest.mark.parametrize("key", ["path", "dir", "directory", "cwd", "scope"])
def test_3_5_search_path_aliases(key):
    out = one_call("grep", {"pattern": "TODO", key: "/repo/src"})
    assert out == [tool_event("search", "grep", query="TODO", path="/repo/src", isSuccess=True)]


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"pattern": "a", "query": "b", "q": "c", "path": "/p", "scope": "/s"}, {"query": "a", "path": "/p"}),
        ({"pattern": "", "q": "c", "path": "", "cwd": "/w"}, {"query": "c", "path": "/w"}),
        ({"regex": 5, "glob": "*.md", "dir": None, "directory": "/d"}, {"query": "*.md", "path": "/d"}),
        ({"searchText": "x", "path": 3}, {"query": "x"}),
    ],
    ids=["first-wins", "empty-skipped", "non-strings-skipped", "no-usable-path"],
)
def test_3_5_search_fields_are_the_first_non_empty_strings(args, expected):
    assert one_call("glob", args) == [tool_event("search", "glob", **expected, isSuccess=True)]


def test_3_5_search_query_is_not_a_path_and_is_kept_verbatim():
    out = one_call("glob", {"pattern": "/repo//src/./**/*.py", "path": "/repo//src/"})
    assert out == [tool_event("search", "glob", query="/repo//src/./**/*.py", path="/repo/src", isSuccess=True)]


# ------------------------------------------------------------------------ list/tree
@pytest.mark.parametrize("name", ["list", "tree"])
@pytest.mark.parametrize("key", ["path", "dir", "directory"])
def test_3_5_list_path_aliases(name, key):
    assert one_call(name, {key: "/repo"}) == [tool_event("list", name, path="/repo", isSuccess=True)]


@pytest.mark.parametrize("name", ["list", "tree"])
@pytest.mark.parametrize("args", [{}, {"depth": 2}, {"path": ""}, {"cwd": "/repo", "scope": "/x"}, {"path": None, "dir": 3}])
def test_3_5_list_without_path(name, args):
    [event] = one_call(name, args)
    assert event == tool_event("list", name, isSuccess=True)
    assert "path" not in event


def test_3_5_list_path_alias_order():
    out = one_call("tree", {"directory": "/c", "dir": "/b", "path": "/a"})
    assert out == [tool_event("list", "tree", path="/a", isSuccess=True)]


def test_3_5_list_without_arguments_key():
    f = Feed()
    block = req_block("call_1", "developer__list")
    assert "arguments" not in block["toolCall"]["value"]
    f.line(msg("m", "assistant", block))
    [event] = f.line(resp("call_1"))
    assert event == tool_event("list", "developer__list", isSuccess=True)
    assert "path" not in event


# --------------------------------------------------------------------------- skills
@pytest.mark.parametrize("name", ["load_skill", "skill"])
@pytest.mark.parametrize("key", ["name", "skill", "skill_name", "skillName"])
def test_3_5_skill_name_aliases(name, key):
    out = one_call(name, {key: "pdf-tools"})
    assert out == [tool_event("skill", name, path="skills/pdf-tools/SKILL.md", skillName="pdf-tools", isSuccess=True)]


@pytest.mark.parametrize("key", ["path", "file_path", "filePath", "skillPath"])
def test_3_5_skill_path_aliases(key):
    out = one_call("load_skill", {key: "/home/u/.config/goose/skills/pdf/SKILL.md", "name": "pdf"})
    assert out == [tool_event("skill", "load_skill", path="/home/u/.config/goose/skills/pdf/SKILL.md", skillName="pdf", isSuccess=True)]


def test_3_5_skill_path_without_name_has_no_skill_name():
    [event] = one_call("skill", {"skillPath": "/s/SKILL.md"})
    assert event == tool_event("skill", "skill", path="/s/SKILL.md", isSuccess=True)
    assert "skillName" not in event


@pytest.mark.parametrize("key", ["dir", "directory"])
def test_3_5_skill_path_from_directory(key):
    out = one_call("load_skill", {"name": "pdf", key: "/home/u/skills/pdf"})
    assert out == [tool_event("skill", "load_skill", path="/home/u/skills/pdf/SKILL.md", skillName="pdf", isSuccess=True)]


def test_3_5_skill_directory_with_trailing_slash():
    out = one_call("load_skill", {"directory": "/home/u/skills/pdf/"})
    assert out == [tool_event("skill", "load_skill", path="/home/u/skills/pdf/SKILL.md", isSuccess=True)]


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"path": "/p/SKILL.md", "dir": "/d", "name": "n"}, {"path": "/p/SKILL.md", "skillName": "n"}),
        ({"path": "", "dir": "/d", "name": "n"}, {"path": "/d/SKILL.md", "skillName": "n"}),
        ({"dir": "", "directory": "/d2", "name": "n"}, {"path": "/d2/SKILL.md", "skillName": "n"}),
        ({"dir": "", "name": "n"}, {"path": "skills/n/SKILL.md", "skillName": "n"}),
        ({"name": "", "skill": "s", "skillPath": 3}, {"path": "skills/s/SKILL.md", "skillName": "s"}),
    ],
    ids=["path-over-dir-over-name", "empty-path-skipped", "directory", "name-last", "empty-name-skipped"],
)
def test_3_5_skill_path_precedence(args, expected):
    assert one_call("load_skill", args) == [tool_event("skill", "load_skill", **expected, isSuccess=True)]


# ------------------------------------------------------------------------- unmapped
@pytest.mark.parametrize(
    "name, args",
    [
        ("computercontroller__web_scrape", {"url": "https://example.com"}),
        ("mcp__github__create_issue", {"title": "x", "path": "/a"}),
        ("developer__image_processor", {"path": "/a.png"}),
        ("delegate", {"instructions": "do it"}),
        ("read_file", {"path": "/a"}),
    ],
)
def test_3_5_anything_else_yields_unknown_with_the_response_block(name, args):
    f = Feed()
    f.line(req("toolu_9", name, args), ts=2_000)
    block = resp_block("toolu_9", is_error=True, structured={"exit_code": 1})
    out = f.line(msg("u", "user", block), ts=2_750)
    assert out == [ev(0, "unknown", 1, (0, 1), ts=2_750, raw=block, tool=name, toolCallId="toolu_9", durationMs=750)]
    assert "isSuccess" not in out[0] and "exitCode" not in out[0]


@pytest.mark.parametrize(
    "name, args",
    [
        ("read", {}),
        ("read", {"path": ""}),
        ("read_image", {"file_path": None, "offset": 3}),
        ("write", {"content": "x"}),
        ("edit", {"path": "", "file_path": ""}),
        ("text_editor", {"command": "view"}),
        ("text_editor", {"command": "write", "path": ""}),
        ("shell", {}),
        ("shell", {"command": ""}),
        ("shell", {"command": ["npm", "test"]}),
        ("grep", {"path": "/repo"}),
        ("glob", {"pattern": ""}),
        ("load_skill", {}),
        ("skill", {"name": "", "path": ""}),
    ],
)
def test_3_5_mapped_tool_missing_required_field_is_unknown(name, args):
    assert one_call(name, args) == [tool_event("unknown", name, raw=resp_block("call_1"))]


@pytest.mark.parametrize("name", ["read", "write", "text_editor", "shell", "grep", "load_skill"])
@pytest.mark.parametrize("args", ["/repo/README.md", 42, ["ls"]])
def test_3_5_non_object_arguments_are_wrapped_as_value_and_unknown(name, args):
    assert one_call(name, args) == [tool_event("unknown", name, raw=resp_block("call_1"))]


def test_3_5_non_object_arguments_to_list_give_a_list_without_path():
    [event] = one_call("tree", "/repo")
    assert event == tool_event("list", "tree", isSuccess=True)
    assert "path" not in event


# ---------------------------------------------------------------------------- paths
PATHS = [
    ("/a//b/./c/../d/", "/a/b/d"),
    ("/..", "/"),
    ("/", "/"),
    ("//", "/"),
    ("/a/../../b", "/b"),
    ("/repo/./src/", "/repo/src"),
    ("/repo/src", "/repo/src"),
    ("./a/../b", "./a/../b"),
    ("a//b/", "a//b/"),
    ("../x", "../x"),
    ("~/notes/../x", "~/notes/../x"),
]
PATH_IDS = [raw for raw, _ in PATHS]


@pytest.mark.parametrize("raw, path", PATHS, ids=PATH_IDS)
def test_3_5_read_path_is_normalized_when_absolute(raw, path):
    assert one_call("read", {"path": raw}) == [tool_event("read", "read", path=path, isSuccess=True)]


@pytest.mark.parametrize("raw, path", PATHS, ids=PATH_IDS)
def test_3_5_write_path_is_normalized_when_absolute(raw, path):
    assert one_call("edit", {"file_path": raw}) == [tool_event("write", "edit", path=path, isSuccess=True)]


@pytest.mark.parametrize("raw, path", PATHS, ids=PATH_IDS)
def test_3_5_search_path_is_normalized_when_absolute(raw, path):
    assert one_call("grep", {"pattern": "x", "scope": raw}) == [tool_event("search", "grep", query="x", path=path, isSuccess=True)]


@pytest.mark.parametrize("raw, path", PATHS, ids=PATH_IDS)
def test_3_5_list_path_is_normalized_when_absolute(raw, path):
    assert one_call("list", {"dir": raw}) == [tool_event("list", "list", path=path, isSuccess=True)]


@pytest.mark.parametrize("raw, path", PATHS, ids=PATH_IDS)
def test_3_5_skill_path_is_normalized_when_absolute(raw, path):
    assert one_call("load_skill", {"skillPath": raw}) == [tool_event("skill", "load_skill", path=path, isSuccess=True)]


def test_3_5_skill_directory_path_is_normalized_when_absolute():
    out = one_call("skill", {"dir": "/home//u/./skills/x/../pdf/", "name": "pdf"})
    assert out == [tool_event("skill", "skill", path="/home/u/skills/pdf/SKILL.md", skillName="pdf", isSuccess=True)]


# ============================================================================ end of input
def test_end_flushes_then_drains():
    f = Feed()
    block = req_block("c1", "shell", {"command": "sleep 100"})
    f.line(msg("m", "assistant", block))  # 0
    f.line(say("m", "Waiting"))  # 1
    assert f.end() == [
        ev(0, "agent", 2, (1, 1), message="Waiting"),
        ev(1, "unknown", 2, (0, 0), raw=block, tool="shell", toolCallId="c1"),
    ]


@pytest.mark.parametrize("code", [1, 2, 137, 255, -9])
def test_end_non_zero_exit_code_yields_error_after_drained_events(code):
    f = Feed()
    block = req_block("c1", "read", {"path": "/a"})
    f.line(msg("m", "assistant", block))  # 0
    f.line(muse("m", "hmm"))  # 1
    f.line("   ", stream="stderr")  # 2
    assert f.end(exit_code=code) == [  # 3
        ev(0, "reasoning", 3, (1, 1), message="hmm"),
        ev(1, "unknown", 3, (0, 0), raw=block, tool="read", toolCallId="c1"),
        ev(2, "error", 3, (3, 3), message=f"goose exited with code {code}", errorClass="agent_exit"),
    ]


@pytest.mark.parametrize("code", [0, None])
def test_end_exit_zero_or_unknown_yields_no_error(code):
    f = Feed()
    f.line(say("m", "Done."))
    assert f.end(exit_code=code) == [ev(0, "agent", 1, (0, 0), message="Done.")]
    assert Feed().end(exit_code=code) == []


def test_end_error_alone_has_the_eof_seq_as_lines():
    f = Feed()
    f.lines(dumps(NOTIFICATION), dumps({"type": "complete"}))
    assert f.end(exit_code=1, ts=1790431333007) == [
        ev(1, "error", 2, (2, 2), ts=1790431333007, message="goose exited with code 1", errorClass="agent_exit")
    ]


# ============================================================================ state
SCRIPT = [
    (BANNER, "stdout"),  # 0
    (muse("gen-1", "Need to check "), "stdout"),  # 1
    (muse("gen-1", "Need to check the tests."), "stdout"),  # 2
    (say("gen-1", "Running "), "stdout"),  # 3
    (say("gen-1", "the suite."), "stdout"),  # 4
    (msg("gen-1", "assistant", req_block("c1", "developer__shell", {"command": "npm test"}),
         req_block("c2", "developer__read", {"path": "/repo//package.json", "offset": 1, "limit": 20})), "stdout"),  # 5
    (dumps(NOTIFICATION), "stdout"),  # 6
    ("  extension slow to respond ", "stderr"),  # 7
    (resp("c2"), "stdout"),  # 8
    (resp("c1", is_error=True, structured={"exit_code": 1}), "stdout"),  # 9
    (say("gen-2", "One test "), "stdout"),  # 10
    (say("gen-2", "fails."), "stdout"),  # 11
    (dumps({"type": "error", "error": {"message": "Rate limit hit"}}), "stdout"),  # 12
    (muse("gen-3", "Retry."), "stdout"),  # 13
    (msg("gen-3", "assistant", req_block("c3", "todo__todo_write", {"content": "- [ ] fix"}),
         req_block("c4", "grep", {"pattern": "describe(", "path": "/repo/src/"})), "stdout"),  # 14
    (msg("u", "user", resp_block("c4"), resp_block("c3")), "stdout"),  # 15
    (msg("gen-4", "assistant", req_block("c5", "tree", {"dir": "/repo"})), "stdout"),  # 16
    (say("gen-4", "Done."), "stdout"),  # 17
    (dumps({"type": "complete", "input_tokens": 1200, "output_tokens": 340, "total_tokens": 1540, "cost_usd": 0.0123}), "stdout"),  # 18
    ("", "stdout"),  # 19
    ("late warning", "stderr"),  # 20
]  # fmt: skip
SCRIPT_EVENTS = [
    ev(0, "warning", 0, (0, 0), message="new session · anthropic claude-sonnet-4"),
    ev(1, "reasoning", 3, (1, 2), message="Need to check the tests."),
    ev(2, "agent", 5, (3, 4), message="Running the suite."),
    ev(3, "unknown", 6, (6, 6), raw=NOTIFICATION),
    ev(4, "warning", 7, (7, 7), message="extension slow to respond"),
    ev(5, "read", 8, (5, 8), path="/repo/package.json", startLine=1, endLine=20, isSuccess=True, **tool("developer__read", "c2", 3000)),
    ev(6, "command", 9, (5, 9), command="npm test", exitCode=1, isSuccess=False, **tool("developer__shell", "c1", 4000)),
    ev(7, "agent", 12, (10, 11), message="One test fails."),
    ev(8, "error", 12, (12, 12), message="Rate limit hit", errorClass="rate_limit"),
    ev(9, "reasoning", 14, (13, 13), message="Retry."),
    ev(10, "search", 15, (14, 15), query="describe(", path="/repo/src", isSuccess=True, **tool("grep", "c4", 1000)),
    ev(11, "agent", 18, (17, 17), message="Done."),
    ev(12, "unknown", 18, (16, 16), raw=req_block("c5", "tree", {"dir": "/repo"}), tool="tree", toolCallId="c5"),
    ev(13, "warning", 20, (20, 20), message="late warning"),
]  # fmt: skip
SCRIPT_USAGE = {"inputTokens": 1200, "outputTokens": 340, "totalTokens": 1540, "costUsd": 0.0123}


def _run_script(restore_at=()):
    f = Feed()
    for i, (line, stream) in enumerate(SCRIPT):
        if i in restore_at:
            f.roundtrip()
        f.line(line, stream=stream)
    if len(SCRIPT) in restore_at:
        f.roundtrip()
    f.end(exit_code=0)
    return f


def test_state_one_pass_of_the_script():
    f = _run_script()
    assert f.events == SCRIPT_EVENTS
    assert f.norm.usage == SCRIPT_USAGE
    assert f.norm.next_event == 14


@pytest.mark.parametrize("cut", range(len(SCRIPT) + 1))
def test_state_restore_at_any_point_gives_byte_identical_output(cut):
    f = _run_script(restore_at={cut})
    assert orjson.dumps(f.events) == orjson.dumps(SCRIPT_EVENTS)
    assert f.norm.usage == SCRIPT_USAGE


def test_state_restore_after_every_line_gives_byte_identical_output():
    f = _run_script(restore_at=set(range(len(SCRIPT) + 1)))
    assert orjson.dumps(f.events) == orjson.dumps(_run_script().events)
    assert f.events == SCRIPT_EVENTS


def test_state_restore_keeps_the_pending_span():
    f = Feed()
    f.line(say("m", "Hel"))
    f.roundtrip()
    f.line(say("m", "Hello"))  # a cumulative restatement of the restored span
    f.roundtrip()
    f.line(say("m", ", world"))
    f.roundtrip()
    assert f.line(muse("m", "next")) == [ev(0, "agent", 3, (0, 2), message="Hello, world")]
    f.roundtrip()
    assert f.end() == [ev(1, "reasoning", 4, (3, 3), message="next")]


def test_state_restore_keeps_a_truncated_span_cut():
    f = Feed(Limits(max_span_chars=5, max_pending_tools=256))
    f.line(say("m", "Hello world"))
    f.roundtrip()
    f.line(say("m", "Hello world again"))
    f.roundtrip()
    f.line(say("m", " and more"))
    f.roundtrip()
    assert f.end() == [ev(0, "agent", 3, (0, 2), message="Hello", truncated=True)]


def test_state_restore_keeps_pending_tool_calls():
    f = Feed()
    b1 = req_block("c1", "read", {"path": "/a", "offset": 2, "limit": 3})
    b2 = req_block("c2", "shell", {"command": "make"})
    b3 = req_block("c3", "mcp__thing", {"x": 1})
    f.line(msg("m", "assistant", b1, b2), ts=10_000)  # 0
    f.line(msg("m", "assistant", b3), ts=10_500)  # 1
    f.roundtrip()
    assert f.line(resp("c2", structured={"exit_code": 0}), ts=12_000) == [  # 2
        ev(0, "command", 2, (0, 2), ts=12_000, command="make", exitCode=0, isSuccess=True, **tool("shell", "c2", 2000))
    ]
    f.roundtrip()
    assert f.line(resp("c1", status="error"), ts=13_250) == [  # 3
        ev(1, "read", 3, (0, 3), ts=13_250, path="/a", startLine=2, endLine=4, isSuccess=False, **tool("read", "c1", 3250))
    ]
    f.roundtrip()
    assert f.end(exit_code=3) == [  # 4
        ev(2, "unknown", 4, (1, 1), raw=b3, tool="mcp__thing", toolCallId="c3"),
        ev(3, "error", 4, (4, 4), message="goose exited with code 3", errorClass="agent_exit"),
    ]


def test_state_event_count_and_usage_survive_a_restore():
    f = Feed()
    f.line("w", stream="stderr")
    f.roundtrip()
    assert f.norm.next_event == 1
    f.line(dumps({"type": "complete", "total_tokens": 3, "cache_read_input_tokens": 1}))
    f.roundtrip()
    assert f.norm.usage == {"totalTokens": 3, "cacheReadInputTokens": 1}
    assert f.norm.counts_by_type()["warning"] == 1
    assert f.line("x", stream="stderr") == [ev(1, "warning", 2, (2, 2), message="x")]
    assert f.norm.next_event == 2
