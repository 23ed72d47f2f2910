"""One focused test per rule of the contract extension (spec/harness-events-more-formats.md).

Test names carry the rule id (F1..F4, S for section 3, L for section 4, C-... and X-...).
Expected events are written out by hand; `Feed` checks every event's envelope and validates it
against the contract models. `T(seq)` = 1000 * (seq + 1), so durations are 1000 per seq.
"""

from __future__ import annotations

import pytest

from services.normalizer import Limits, RunNormalizer
from services.normalizer.run_normalizer import detect_format, format_from_agent
from tests.support.normalizer import (
    MISSING,
    SESSION,
    THREAD,
    Feed,
    T,
    bodies,
    c_answer,
    c_assistant,
    c_call,
    c_result_block,
    c_text,
    c_think,
    c_use,
    c_user,
    claude,
    codex,
    dumps,
    ev,
    msg,
    say,
    x_item,
)

CC = "claude-code"
CX = "codex"


def cfeed(**kw) -> Feed:
    return Feed(fmt=CC, **kw)


def xfeed(**kw) -> Feed:
    return Feed(fmt=CX, **kw)


def tool(name: str, cid: str, dur: int | None = None) -> dict:
    extras = {"tool": name, "toolCallId": cid}
    if dur is not None:
        extras["durationMs"] = dur
    return extras


# ===================================================================== section 1
def test_F1_a_format_label_decides():
    for fmt in ("goose", CC, CX):
        norm = RunNormalizer("r")
        assert norm.apply_labels(fmt, "goose/1.0", 0, T(0)) == []
        assert norm.format == fmt


def test_F1_the_label_beats_detection():
    f = Feed()
    f.norm.apply_labels(CX, None, 0, T(0))
    # A Claude-looking record in a codex run is an unrecognized codex record.
    out = f.line(claude("assistant", message={"content": []}))
    assert [e["type"] for e in out] == ["unknown"]


@pytest.mark.parametrize(
    "agent,fmt",
    [("goose/1.56.0", "goose"), ("Claude/2.1.236", CC), ("claude-code", CC), ("codex/0.153", CX),
     ("codex-cli/1", CX), ("CODEX-EXEC", CX), ("aider/1", None), ("", None), (None, None)],
)
def test_F2_the_agent_labels_product_decides(agent, fmt):
    assert format_from_agent(agent) == fmt
    norm = RunNormalizer("r")
    norm.apply_labels(None, agent, 0, T(0))
    assert norm.format == fmt


@pytest.mark.parametrize(
    "record,fmt",
    [({"type": "system", "subtype": "init"}, CC), ({"type": "assistant"}, CC), ({"type": "user"}, CC),
     ({"type": "result"}, CC), ({"type": "stream_event"}, CC), ({"type": "rate_limit_event"}, CC),
     ({"type": "thread.started"}, CX), ({"type": "turn.started"}, CX), ({"type": "item.completed"}, CX),
     ({"type": "system"}, "goose"), ({"type": "system", "subtype": 3}, "goose"), ({"type": "message"}, "goose"),
     ({"type": "error"}, "goose"), ({}, "goose"), ({"type": 7}, "goose")],
)
def test_F3_the_first_json_object_decides(record, fmt):
    assert detect_format(record) == fmt


def test_F3_what_precedes_the_deciding_line_maps_alike_and_is_never_reread():
    f = Feed()
    out = f.lines("", "banner text", "[1, 2]")
    out += f.line("WARN x", stream="stderr")
    assert f.norm.format is None
    out += f.line(codex("thread.started", thread_id=THREAD))
    assert f.norm.format == CX
    assert bodies(out) == [
        {"type": "warning", "lines": [1, 1], "message": "banner text"},
        {"type": "unknown", "lines": [2, 2], "raw": [1, 2]},
        {"type": "warning", "lines": [3, 3], "message": "WARN x"},
    ]


def test_F3_undecided_run_falls_back_to_goose_at_the_end():
    f = Feed()
    f.line("not json")
    out = f.end(3)
    assert out[-1]["message"] == "goose exited with code 3"


def test_F3_undecided_run_names_its_agent_label_in_the_exit_error():
    """A tapped command that is not goose (its name is the run's agent label) is not called goose."""
    from services.normalizer import RunNormalizer

    norm = RunNormalizer("r")
    norm.line(0, 1, "not json")
    assert norm.end(1, 2, 3, "sh")[-1]["message"] == "sh exited with code 3"
    decided = RunNormalizer("r")
    decided.apply_labels("goose", "mybot/2", 0, 1)
    assert decided.end(1, 2, 3, "mybot/2")[-1]["message"] == "goose exited with code 3"  # the format decides


def test_F4_an_unknown_format_label_warns_then_F2_applies():
    norm = RunNormalizer("r")
    out = norm.apply_labels("aider", "claude/2.1", 0, T(0))
    assert bodies(out) == [{"type": "warning", "lines": [0, 0], "message": "unknown format label: aider", "code": "format"}]
    assert out[0]["eventId"] == "r:0" and norm.format == CC


def test_F4_then_F3_applies_without_an_agent_label():
    f = Feed()
    out = f.norm.apply_labels("gemini", None, 0, T(0))
    assert [e["code"] for e in out] == ["format"]
    f.events.extend(out)  # the warning took event 0
    f.line(claude("result", subtype="success"))
    assert f.norm.format == CC


def test_F_the_format_is_fixed_once():
    norm = RunNormalizer("r", fmt=CX)
    assert norm.apply_labels(CC, None, 0, T(0)) == [] and norm.format == CX
    norm = RunNormalizer("r")
    norm.line(0, T(0), codex("turn.started"))
    norm.line(1, T(1), claude("result"))
    assert norm.format == CX


def test_F_the_format_survives_serialization_and_old_states_load_as_goose():
    norm = RunNormalizer("r", fmt=CC)
    norm.line(0, T(0), c_assistant("m", c_text("hi")))
    again = RunNormalizer.from_bytes(norm.to_bytes())
    assert again.format == CC and again.session == SESSION
    old = RunNormalizer("r").to_state()
    del old["format"]
    assert RunNormalizer.from_state(old).format == "goose"
    undecided = RunNormalizer.from_state(RunNormalizer("r").to_state())
    assert undecided.format is None


def test_F_unknown_format_in_constructor_is_refused():
    with pytest.raises(ValueError):
        RunNormalizer("r", fmt="aider")


# ===================================================================== section 2
@pytest.mark.parametrize("fmt", [CC, CX])
def test_2_line_handling_is_shared(fmt):
    f = Feed(fmt=fmt)
    out = f.lines("", "   ", "plain text", "null", '"s"')
    out += f.line("  err  ", stream="stderr")
    assert bodies(out) == [
        {"type": "warning", "lines": [2, 2], "message": "plain text"},
        {"type": "unknown", "lines": [3, 3], "raw": "null"},
        {"type": "unknown", "lines": [4, 4], "raw": "s"},
        {"type": "warning", "lines": [5, 5], "message": "err"},
    ]


def test_2_json_that_is_not_an_object_flushes_a_claude_span():
    f = cfeed()
    f.line(c_assistant("m", c_text("Hello")))
    out = f.line("[1]")
    assert [e["type"] for e in out] == ["agent", "unknown"]


def test_2_warnings_never_flush_a_claude_span():
    f = cfeed()
    f.line(c_assistant("m", c_text("Hello")))
    assert [e["type"] for e in f.line("oops", stream="stderr")] == ["warning"]
    assert [e["type"] for e in f.line("not json")] == ["warning"]
    assert bodies(f.end()) == [{"type": "agent", "lines": [0, 0], "message": "Hello"}]


# ===================================================================== section 3
def test_S_claude_session_is_the_most_recent_non_empty_one_including_the_current_record():
    f = cfeed()
    out = f.line("banner")  # before any id
    out += f.line(claude("system", session="A", subtype="api_retry"))
    out += f.line(claude("system", session="", subtype="api_retry"))  # empty: A stays
    out += f.line(claude("system", session=MISSING, subtype="api_retry"))
    out += f.line(claude("system", session="B", subtype="api_retry"))
    assert [e.get("sessionId") for e in out] == [None, "A", "A", "A", "B"]


def test_S_a_span_flushed_later_carries_the_id_current_at_the_flush():
    f = cfeed()
    f.line(claude("assistant", session="A", message={"id": "m", "content": [c_text("Hi")]}))
    out = f.line(claude("conversation_reset", session="B"))
    assert [(e["type"], e["sessionId"]) for e in out] == [("agent", "B"), ("unknown", "B")]


def test_S_codex_session_is_the_latest_thread_started():
    f = xfeed()
    out = f.line("Reading additional input from stdin...")
    f.line(codex("thread.started", thread_id="T1"))
    out += f.line(x_item("item.completed", "i0", "agent_message", text="a"))
    f.line(codex("thread.started", thread_id="T2"))
    out += f.line(x_item("item.completed", "i1", "agent_message", text="b"))
    f.line(codex("thread.started", thread_id=5))  # not a string: ignored
    out += f.line(x_item("item.completed", "i2", "agent_message", text="c"))
    assert [e.get("sessionId") for e in out] == [None, "T1", "T2", "T2"]


def test_S_goose_never_sets_a_session_id():
    f = Feed(fmt="goose")
    out = f.lines(dumps({"type": "message", "session_id": "x", "message": {"role": "assistant", "content": [c_text("a")]}}))
    out += f.end()
    assert out and all("sessionId" not in e for e in out)


# ===================================================================== section 4
def test_L_claude_result_usage_includes_cache_in_input():
    f = cfeed()
    f.line(claude("result", subtype="success", total_cost_usd=0.5,
                  usage={"input_tokens": 42, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 8,
                         "output_tokens": 7}))
    assert f.norm.usage == {"inputTokens": 150, "outputTokens": 7, "totalTokens": 157,
                            "cacheReadInputTokens": 100, "cacheWriteInputTokens": 8, "costUsd": 0.5}


def test_L_claude_usage_otherwise_missing_cache_counts_zero_and_non_integers_are_dropped():
    f = cfeed()
    f.line(claude("result", subtype="success", total_cost_usd="1", usage={"input_tokens": 5, "output_tokens": 1.5}))
    assert f.norm.usage == {"inputTokens": 5}
    f.line(claude("result", subtype="success", usage={"output_tokens": 3, "cache_read_input_tokens": 2}))
    assert f.norm.usage == {"outputTokens": 3, "cacheReadInputTokens": 2}


def test_L_each_completion_is_a_new_usage_object_and_the_last_wins():
    f = cfeed()
    f.line(claude("result", subtype="success", usage={"input_tokens": 1, "output_tokens": 1}))
    first = f.norm.usage
    f.line(claude("result", subtype="success"))
    assert f.norm.usage == {} and f.norm.usage is not first


def test_L_sums_beyond_64_bits_are_omitted_never_raise():
    f = cfeed()
    big = 2**63 - 1
    f.line(claude("result", subtype="success",
                  usage={"input_tokens": big, "cache_read_input_tokens": big, "output_tokens": big}))
    assert f.norm.usage == {"outputTokens": big, "cacheReadInputTokens": big}


def test_L_codex_turn_completed_usage():
    f = xfeed()
    f.line(codex("turn.completed", usage={"input_tokens": 100, "cached_input_tokens": 80, "cache_write_input_tokens": 3,
                                          "output_tokens": 20, "reasoning_output_tokens": 9}))
    assert f.norm.usage == {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120,
                            "cacheReadInputTokens": 80, "cacheWriteInputTokens": 3}
    f.line(codex("turn.completed"))
    assert f.norm.usage == {}


@pytest.mark.parametrize("fmt,product", [(CC, "claude"), (CX, "codex"), ("goose", "goose")])
def test_L_non_zero_exit_names_the_cli(fmt, product):
    f = Feed(fmt=fmt)
    assert bodies(f.end(2)) == [{"type": "error", "lines": [0, 0], "message": f"{product} exited with code 2", "errorClass": "agent_exit"}]
    g = Feed(fmt=fmt)
    assert g.end(0) == []


def test_L_claude_usage_is_never_read_from_assistant_records():
    f = cfeed()
    f.line(c_assistant("m", c_text("x")))
    assert f.norm.usage is None


# ================================================================= Claude records
def test_C_R1_init_warns_for_failed_and_needs_auth_mcp_servers_only():
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    out = f.line(claude("system", subtype="init", mcp_servers=[
        {"name": "github", "status": "connected"}, {"name": "jira", "status": "failed"},
        {"name": "sentry", "status": "needs-auth"}, {"name": 3, "status": "failed"}, "x",
        {"name": "p", "status": "pending"}]))
    assert bodies(out) == [
        {"type": "warning", "lines": [1, 1], "message": "mcp server jira: failed", "code": "mcp_server"},
        {"type": "warning", "lines": [1, 1], "message": "mcp server sentry: needs-auth", "code": "mcp_server"},
    ]
    assert f.norm.span is not None  # not flushed


@pytest.mark.parametrize("subtype", ["status", "compact_boundary", "thinking_tokens", "task_progress", "hook_started", "hook_progress",
                                     "task_started", "task_updated", "task_notification"])
def test_C_R2_progress_subtypes_map_to_nothing_and_do_not_flush(subtype):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    assert f.line(claude("system", subtype=subtype)) == []
    assert f.norm.span is not None


@pytest.mark.parametrize(
    "fields,message,cls",
    [({"error": "rate_limit", "error_status": 429, "attempt": 2, "max_retries": 10}, "API request failed (rate_limit, HTTP 429); retry 2/10", "rate_limit"),
     ({"error": "server_error", "error_status": None, "attempt": 1, "max_retries": 3}, "API request failed (server_error); retry 1/3", "provider_unavailable"),
     ({"error_status": 529}, "API request failed (HTTP 529)", "provider_unavailable"),
     # a retry that names no HTTP status was not an HTTP answer: a connection-level failure
     ({"attempt": 1}, "API request failed", "timeout"),
     ({"error": "unknown", "error_status": None, "attempt": 1, "max_retries": 10}, "API request failed (unknown); retry 1/10", "timeout"),
     ({"error": "unknown", "error_status": 400}, "API request failed (unknown, HTTP 400)", "other"),
     ({"error": "overloaded", "error_status": 529}, "API request failed (overloaded, HTTP 529)", "provider_unavailable"),
     ({"error": 5, "attempt": "1", "max_retries": 2}, "API request failed", "timeout")],
)
def test_C_R3_api_retry_is_a_warning(fields, message, cls):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    out = f.line(claude("system", subtype="api_retry", **fields))
    assert bodies(out) == [{"type": "warning", "lines": [1, 1], "message": message, "code": "api_retry", "errorClass": cls}]


@pytest.mark.parametrize("fields", [{"subtype": "hook_response"}, {"subtype": "local_command_output"}, {}, {"subtype": None}])
def test_C_R4_other_system_records_are_unknown_without_flushing(fields):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    rec = claude("system", **fields)
    out = f.line(rec)
    assert [e["type"] for e in out] == ["unknown"] and out[0]["raw"]["type"] == "system"
    assert f.norm.span is not None


@pytest.mark.parametrize("message", [None, "text", {"content": "text"}, {"content": {"a": 1}}, {}])
def test_C_R5_assistant_without_object_message_or_array_content_is_unknown(message):
    f = cfeed()
    out = f.line(claude("assistant", message=message))
    assert [e["type"] for e in out] == ["unknown"] and out[0]["raw"]["message"] == message


def test_C_R6_user_string_content_is_the_prompt():
    f = cfeed()
    assert f.line(c_user(content="fix the pager")) == []


@pytest.mark.parametrize("message", [None, 3, {"content": 3}, {"content": {"x": 1}}])
def test_C_R6_user_otherwise_is_unknown(message):
    f = cfeed()
    out = f.line(claude("user", message=message))
    assert [e["type"] for e in out] == ["unknown"]


def test_C_R7_result_flushes_drains_then_records_completion():
    f = cfeed()
    f.line(c_call("t1", "WebFetch", {"url": "u"}))
    f.line(c_assistant("m2", c_text("Done")))
    out = f.line(claude("result", subtype="success", usage={"input_tokens": 1, "output_tokens": 2}))
    assert bodies(out) == [
        {"type": "agent", "lines": [1, 1], "message": "Done"},
        {"type": "unknown", "lines": [0, 0], "raw": c_use("t1", "WebFetch", {"url": "u"}), **tool("WebFetch", "t1")},
    ]
    assert f.norm.usage == {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}


def test_C_R8_stream_events_are_nothing_and_do_not_flush():
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    assert f.line(claude("stream_event", event={"type": "content_block_delta", "delta": {"text": "x"}})) == []
    assert f.norm.span is not None


@pytest.mark.parametrize(
    "info,expected",
    [({"status": "allowed"}, None), ({}, None), (None, None), ({"status": 3}, None),
     ({"status": "allowed_warning", "rateLimitType": "five_hour"}, "rate limit status: allowed_warning (five_hour)"),
     ({"status": "rejected", "rateLimitType": 7}, "rate limit status: rejected")],
)
def test_C_R9_rate_limit_events(info, expected):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    out = f.line(claude("rate_limit_event", rate_limit_info=info))
    assert bodies(out) == ([] if expected is None else [{"type": "warning", "lines": [1, 1], "message": expected, "code": "rate_limit", "errorClass": "rate_limit"}])
    assert f.norm.span is not None


@pytest.mark.parametrize(
    "fields,message,cls",
    [({"error": {"type": "overloaded_error", "message": "Overloaded"}, "message": "m"}, "Overloaded", "provider_unavailable"),
     ({"error": {"message": ""}, "message": "top"}, "top", "other"),
     ({"error": "plain"}, "plain", "other"),
     ({"error": {"type": "x"}}, "claude code reported an error", "other")],
)
def test_C_R10_error_records_flush_then_error(fields, message, cls):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    out = f.line(claude("error", **fields))
    assert bodies(out) == [{"type": "agent", "lines": [0, 0], "message": "Hi"}, {"type": "error", "lines": [1, 1], "message": message, "errorClass": cls}]


@pytest.mark.parametrize("rtype", ["control_request", "conversation_reset", MISSING, 5])
def test_C_R11_anything_else_flushes_then_unknown(rtype):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    out = f.line(claude(rtype, new_conversation_id="x"))
    assert [e["type"] for e in out] == ["agent", "unknown"]


# ================================================================= Claude blocks
def test_C_B1_assistant_text_accumulates_across_lines_by_message_id():
    f = cfeed()
    f.lines(c_assistant("m", c_text("Hello ")), c_assistant("m", c_text("world")))
    out = f.line(c_assistant("m2", c_text("Next")))
    assert bodies(out) == [{"type": "agent", "lines": [0, 1], "message": "Hello world"}]


def test_C_B1_user_text_is_ignored_and_passes_the_span():
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    assert f.line(c_user(c_text("Base directory for this skill: /x"))) == []
    assert f.norm.span is not None


def test_C_B1_C_B2_thinking_then_text_of_one_response_are_two_events():
    f = cfeed()
    f.lines(c_assistant("m", c_think("Plan.")), c_assistant("m", c_text("Doing it.")))
    f.end()
    assert bodies(f.events) == [
        {"type": "reasoning", "lines": [0, 0], "message": "Plan."},
        {"type": "agent", "lines": [1, 1], "message": "Doing it."},
    ]


def test_C_B2_empty_signed_thinking_is_ignored():
    f = cfeed()
    assert f.lines(c_assistant("m", c_think(""))) == [] and f.end() == []


def test_C_B2_to_B4_in_user_records_are_unknown_blocks_without_flushing():
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    blocks = [c_think("x"), {"type": "redacted_thinking", "data": "z"}, c_use("t", "Read", {})]
    out = f.line(c_user(*blocks))
    assert [e["raw"] for e in out] == blocks
    assert f.norm.span is not None


def test_C_B3_redacted_thinking_is_ignored_in_assistant():
    f = cfeed()
    assert f.line(c_assistant("m", {"type": "redacted_thinking", "data": "zz"})) == []


def test_C_B4_tool_use_flushes_and_emits_nothing_until_answered():
    f = cfeed()
    f.line(c_assistant("m", c_text("Reading.")))
    out = f.line(c_call("t1", "Read", {"file_path": "/a/./b.py"}))
    assert bodies(out) == [{"type": "agent", "lines": [0, 0], "message": "Reading."}]
    out = f.line(c_answer("t1"))
    assert bodies(out) == [{"type": "read", "lines": [1, 2], "path": "/a/b.py", "isSuccess": True, **tool("Read", "t1", 1000)}]


def test_C_B4_a_tool_block_splits_two_text_blocks_of_one_response():
    f = cfeed()
    f.lines(c_assistant("m", c_text("A")), c_assistant("m", c_use("t", "TodoWrite", {})), c_assistant("m", c_text("B")))
    out = f.end()
    assert [e["message"] for e in f.events] == ["A", "B"] and len(out) == 1


def test_C_B5_tool_result_in_assistant_also_resolves():
    f = cfeed()
    f.line(c_call("t1", "LS", {"path": "/x/"}))
    out = f.line(c_assistant("m9", c_result_block("t1")))
    assert bodies(out) == [{"type": "list", "lines": [0, 1], "path": "/x", "isSuccess": True, **tool("LS", "t1", 1000)}]


@pytest.mark.parametrize("block", [{"type": "server_tool_use", "id": "s", "name": "web_search"},
                                   {"type": "web_search_tool_result"}, {"type": "image"}, {"x": 1}, None, 3])
def test_C_B6_other_blocks_are_unknown_without_flushing(block):
    f = cfeed()
    f.line(c_assistant("m", c_text("Hi")))
    out = f.line(c_assistant("m", block))
    assert bodies(out) == [{"type": "unknown", "lines": [1, 1], "raw": "null" if block is None else block}]
    assert f.norm.span is not None


def test_C_B7_synthetic_api_error_record_is_an_error_not_agent_text():
    f = cfeed()
    f.line(c_assistant("m", c_text("Thinking aloud")))
    out = f.line(c_assistant("syn", c_text("API Error: 529 overloaded"), c_text(""), c_text("retry later"), error="server_error"))
    assert bodies(out) == [
        {"type": "agent", "lines": [0, 0], "message": "Thinking aloud"},
        {"type": "error", "lines": [1, 1], "message": "API Error: 529 overloaded\nretry later", "code": "server_error",
         "errorClass": "provider_unavailable"},
    ]
    assert f.end() == []


def test_C_B7_otherwise_a_fixed_message():
    f = cfeed()
    out = f.line(c_assistant("syn", error="billing_error"))
    assert bodies(out) == [{"type": "error", "lines": [0, 0], "message": "claude code reported an API error: billing_error", "code": "billing_error",
                            "errorClass": "quota"}]
    g = cfeed()
    assert [e["type"] for e in g.lines(c_assistant("m", c_text("x"), error=""))] == []  # empty error: ordinary text


# ================================================================= Claude tools
def test_C_P1_tool_use_without_string_id_or_name_is_unknown_at_once():
    f = cfeed()
    out = f.line(c_assistant("m", c_use(None, "Read", {}), c_use("t2", 5, {})))
    assert bodies(out) == [
        {"type": "unknown", "lines": [0, 0], "raw": c_use(None, "Read", {}), "tool": "Read"},
        {"type": "unknown", "lines": [0, 0], "raw": c_use("t2", 5, {}), "toolCallId": "t2"},
    ]


def test_C_P1_missing_input_counts_as_null():
    f = cfeed()
    f.line(c_assistant("m", c_use("t1", "LS")))
    assert bodies(f.line(c_answer("t1"))) == [{"type": "list", "lines": [0, 1], "isSuccess": True, **tool("LS", "t1", 1000)}]


def test_C_P2_results_in_any_order_and_duplicate_ids_oldest_first():
    f = cfeed()
    f.lines(c_call("a", "Read", {"file_path": "/1"}), c_call("b", "Read", {"file_path": "/2"}),
            c_call("a", "Read", {"file_path": "/3"}))
    out = f.lines(c_answer("b"), c_answer("a"), c_answer("a"))
    assert [(e["path"], e["lines"]) for e in out] == [("/2", [1, 3]), ("/1", [0, 4]), ("/3", [2, 5])]


def test_C_P3_unmatched_results_are_unknown():
    f = cfeed()
    out = f.line(c_user(c_result_block("zz"), {"type": "tool_result", "tool_use_id": 4}))
    assert bodies(out) == [
        {"type": "unknown", "lines": [0, 0], "raw": c_result_block("zz"), "toolCallId": "zz"},
        {"type": "unknown", "lines": [0, 0], "raw": {"type": "tool_result", "tool_use_id": 4}},
    ]


def test_C_P4_unanswered_calls_drain_in_order_at_end_and_consumed_ones_stay_silent():
    f = cfeed()
    f.lines(c_call("a", "Bash", {"command": "ls"}), c_call("b", "TodoWrite", {"todos": []}),
            c_call("c", "mcp__todo__add", {}), c_call("d", "Agent", {"prompt": "p"}))
    out = f.end()
    assert bodies(out) == [
        {"type": "unknown", "lines": [0, 0], "raw": c_use("a", "Bash", {"command": "ls"}), **tool("Bash", "a")},
        {"type": "unknown", "lines": [3, 3], "raw": c_use("d", "Agent", {"prompt": "p"}), **tool("Agent", "d")},
    ]


def test_C_P_pending_cap_evicts_the_oldest_as_unknown():
    f = Feed(limits=Limits(max_pending_tools=1), fmt=CC)
    f.line(c_call("a", "Read", {"file_path": "/1"}))
    out = f.line(c_call("b", "Read", {"file_path": "/2"}))
    assert bodies(out) == [{"type": "unknown", "lines": [0, 0], "raw": c_use("a", "Read", {"file_path": "/1"}), **tool("Read", "a")}]


def _one(name: str, args, content="ok", is_error=MISSING) -> list[dict]:
    f = cfeed()
    f.line(c_call("t", name, args))
    return bodies(f.line(c_answer("t", content, is_error)))


def _strip(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in ("lines", "tool", "toolCallId", "durationMs")} for e in events]


def test_C_T1_bash_goes_through_the_shell_rules():
    assert _strip(_one("Bash", {"command": "cat a b"})) == [
        {"type": "read", "path": "a", "isSuccess": True}, {"type": "read", "path": "b", "isSuccess": True}]
    assert _strip(_one("Bash", {"cmd": "cd x && make"})) == [{"type": "command", "command": "cd x && make", "isSuccess": True}]
    assert _strip(_one("bash", {"script": "ls -la docs"})) == [{"type": "list", "path": "docs", "isSuccess": True}]
    assert [e["type"] for e in _one("Bash", {"command": ""})] == ["unknown"]


def test_C_T2_multiedit_is_a_write():
    assert _strip(_one("MultiEdit", {"file_path": "/p/x.py", "edits": []})) == [{"type": "write", "path": "/p/x.py", "isSuccess": True}]


def test_C_T3_notebookedit_path_keys():
    assert _strip(_one("NotebookEdit", {"notebook_path": "/n/../n/d.ipynb"})) == [{"type": "write", "path": "/n/d.ipynb", "isSuccess": True}]
    assert _strip(_one("NotebookEdit", {"notebookPath": "rel.ipynb"})) == [{"type": "write", "path": "rel.ipynb", "isSuccess": True}]
    assert _strip(_one("NotebookEdit", {"file_path": "f.ipynb"})) == [{"type": "write", "path": "f.ipynb", "isSuccess": True}]
    assert [e["type"] for e in _one("NotebookEdit", {})] == ["unknown"]


def test_C_T4_notebookread_is_a_read_with_lines():
    assert _strip(_one("NotebookRead", {"notebook_path": "/n/d.ipynb", "offset": 3, "limit": 2})) == [
        {"type": "read", "path": "/n/d.ipynb", "startLine": 3, "endLine": 4, "isSuccess": True}]


def test_C_T5_ls_is_a_list():
    assert _strip(_one("LS", {"path": "/home/dev/src/"})) == [{"type": "list", "path": "/home/dev/src", "isSuccess": True}]


def test_C_T6_powershell_is_a_command_never_reclassified():
    assert _strip(_one("PowerShell", {"command": "cat a.txt"})) == [{"type": "command", "command": "cat a.txt", "isSuccess": True}]
    assert [e["type"] for e in _one("PowerShell", {})] == ["unknown"]


@pytest.mark.parametrize("name", ["TodoWrite", "TodoRead", "TaskCreate", "TaskGet", "TaskUpdate", "TaskList", "StructuredOutput",
                                  "todowrite", "mcp__todo__write"])
def test_C_T7_consumed_tools_give_no_event(name):
    assert _one(name, {"todos": []}) == []


def test_C_T7_only_without_extension():
    assert [e["type"] for e in _one("mcp__x__TodoWrite", {})] == ["unknown"]


def test_C_T_builtin_table():
    assert _strip(_one("Read", {"file_path": "/p/a.py", "offset": 130, "limit": 65})) == [
        {"type": "read", "path": "/p/a.py", "startLine": 130, "endLine": 194, "isSuccess": True}]
    assert _strip(_one("Read", {"file_path": "/p/a.py", "limit": 65})) == [{"type": "read", "path": "/p/a.py", "isSuccess": True}]
    assert _strip(_one("Write", {"file_path": "/p/w"})) == [{"type": "write", "path": "/p/w", "isSuccess": True}]
    assert _strip(_one("Edit", {"file_path": "/p/e"})) == [{"type": "write", "path": "/p/e", "isSuccess": True}]
    assert _strip(_one("Grep", {"pattern": "x", "path": "/s/"})) == [{"type": "search", "query": "x", "path": "/s", "isSuccess": True}]
    assert _strip(_one("Glob", {"pattern": "**/*.py"})) == [{"type": "search", "query": "**/*.py", "isSuccess": True}]
    assert _strip(_one("Skill", {"skill": "changelog", "args": ""})) == [
        {"type": "skill", "path": "skills/changelog/SKILL.md", "skillName": "changelog", "isSuccess": True}]
    assert _strip(_one("mcp__fs__read", {"path": "/r"})) == [{"type": "read", "path": "/r", "isSuccess": True}]


@pytest.mark.parametrize("name", ["Task", "Agent", "WebFetch", "WebSearch", "BashOutput", "KillShell", "ExitPlanMode",
                                  "AskUserQuestion", "SlashCommand", "mcp__github__search_issues", "Frobnicate"])
def test_C_T_otherwise_unknown_with_the_request_as_raw(name):
    f = cfeed()
    f.line(c_call("t", name, {"q": 1}))
    out = f.line(c_answer("t", "a large page body"))
    assert bodies(out) == [{"type": "unknown", "lines": [0, 1], "raw": c_use("t", name, {"q": 1}), **tool(name, "t", 1000)}]


def test_C_T_a_mapped_tool_missing_its_required_field_is_unknown():
    assert [e["type"] for e in _one("Read", {"offset": 1})] == ["unknown"]
    assert [e["type"] for e in _one("Grep", {"path": "/x"})] == ["unknown"]


# ============================================================ Claude 5.4 fields
def test_C_5_4_is_error_means_failure_absent_means_success():
    assert _one("Write", {"file_path": "/w"}, is_error=True)[0]["isSuccess"] is False
    assert _one("Write", {"file_path": "/w"}, is_error=False)[0]["isSuccess"] is True
    assert _one("Write", {"file_path": "/w"})[0]["isSuccess"] is True
    assert _one("Write", {"file_path": "/w"}, is_error="true")[0]["isSuccess"] is True


@pytest.mark.parametrize(
    "content,is_error,code",
    [("Exit code 1\nFAILED", True, 1), ("Error: Exit code 137", True, 137), ([{"type": "image"}, {"type": "text", "text": "Exit code 2"}], True, 2),
     ("Exit code 1", False, None), ("exit code 1", True, None), ("Failed. Exit code 1", True, None), ("Exit code x", True, None),
     ("Exit code " + "9" * 30, True, None), (3, True, None)],
)
def test_C_5_4_exit_code_only_from_a_failed_bash_result_text(content, is_error, code):
    (event,) = _one("Bash", {"command": "make"}, content, is_error)
    assert event.get("exitCode") == code


def test_C_5_4_file_operations_from_the_shell_carry_success_but_no_exit_code():
    (event,) = _one("Bash", {"command": "cat missing"}, "Exit code 1\ncat: missing", True)
    assert event["type"] == "read" and event["isSuccess"] is False and "exitCode" not in event


# =========================================================== Claude 5.6 failures
def _result(**fields) -> list[dict]:
    f = cfeed()
    return bodies(f.line(claude("result", **fields)))


def test_C_F1_a_failure_is_is_error_or_a_non_success_subtype():
    assert _result(subtype="success", is_error=False, result="ok") == []
    assert _result(subtype="success") == []
    assert [e["type"] for e in _result(subtype="success", is_error=True, result="API Error")] == ["error"]
    assert [e["type"] for e in _result(subtype="error_during_execution", is_error=False)] == ["error"]
    assert _result(subtype=5) == [] and _result(is_error="true") == []


@pytest.mark.parametrize(
    "fields,message",
    [({"errors": ["  Reached maximum number of turns (7) ", "", " second"]}, "Reached maximum number of turns (7)\nsecond"),
     ({"errors": "bare string"}, "bare string"),
     ({"errors": [], "result": "API Error: 500"}, "API Error: 500"),
     ({"errors": ["  "], "result": " ", "error": {"message": "boom"}}, "boom"),
     ({"error": "plain"}, "plain"),
     ({}, "claude code reported a terminal error: error_max_turns")],
)
def test_C_F2_failure_message(fields, message):
    (event,) = _result(subtype="error_max_turns", is_error=True, **fields)
    assert event["message"] == message


def test_C_F2_unknown_subtype_text():
    (event,) = _result(is_error=True)
    assert event["message"] == "claude code reported a terminal error: unknown"


@pytest.mark.parametrize(
    "fields,code",
    [({"subtype": "error_max_budget_usd"}, "error_max_budget_usd"),
     ({"subtype": "success", "is_error": True, "terminal_reason": "api_error"}, "api_error"),
     ({"subtype": "success", "is_error": True, "terminal_reason": ""}, "is_error"),
     ({"is_error": True}, "is_error")],
)
def test_C_F3_failure_code(fields, code):
    (event,) = _result(**fields)
    assert event["code"] == code


def test_C_F4_a_result_repeating_an_error_since_the_last_result_is_not_reported():
    f = cfeed()
    f.line(c_assistant("syn", c_text("API Error: 529"), error="server_error"))
    out = f.line(claude("result", subtype="success", is_error=True, result="API Error: 529", terminal_reason="api_error"))
    assert out == []
    # After a result the memory starts again.
    f.line(c_assistant("syn2", c_text("API Error: 529"), error="server_error"))
    f.line(claude("result", subtype="success"))
    out = f.line(claude("result", subtype="success", is_error=True, result="API Error: 529"))
    assert [e["type"] for e in out] == ["error"]


def test_C_F4_otherwise_a_different_message_is_reported():
    f = cfeed()
    f.line(claude("error", error={"message": "one"}))
    out = f.line(claude("result", is_error=True, result="two"))
    assert [e["message"] for e in out] == ["two"]


def test_C_F5_order_at_a_result():
    f = cfeed()
    f.lines(c_call("t", "WebSearch", {"query": "q"}), c_assistant("m", c_text("Partial")))
    out = f.line(claude("result", subtype="error_max_turns", errors=["cap"], usage={"input_tokens": 1}))
    assert [e["type"] for e in out] == ["agent", "unknown", "error"]
    assert f.norm.usage == {"inputTokens": 1}


# ================================================================= Codex records
def test_X_R1_thread_started_only_sets_the_session():
    f = xfeed()
    assert f.line(codex("thread.started", thread_id=THREAD)) == [] and f.norm.session == THREAD


@pytest.mark.parametrize("line", [codex("turn.started"), x_item("item.updated", "i", "todo_list", items=[]),
                                  codex("item.plan.delta", item_id="i", delta="x"), codex("item.updated", item=3)])
def test_X_R2_nothing(line):
    assert xfeed().line(line) == []


@pytest.mark.parametrize("event", ["item.started", "item.completed"])
@pytest.mark.parametrize("item", [None, "x", [1], MISSING])
def test_X_R3_R4_an_item_that_is_not_an_object_is_unknown(event, item):
    line = codex(event) if item is MISSING else codex(event, item=item)
    out = xfeed().line(line)
    assert [e["type"] for e in out] == ["unknown"] and out[0]["raw"]["type"] == event


def test_X_R3_non_tool_started_items_are_ignored():
    f = xfeed()
    assert f.line(x_item("item.started", "i", "todo_list", items=[])) == []
    assert f.line(x_item("item.started", "j", "agent_message", text="")) == []
    assert f.norm.pending == [] and f.end() == []


def test_X_R5_turn_completed_drains_and_completes():
    f = xfeed()
    started = {"id": "i1", "type": "command_execution", "command": "npm test", "status": "in_progress"}
    f.line(codex("item.started", item=started))
    out = f.line(codex("turn.completed", usage={"input_tokens": 3, "output_tokens": 1}))
    assert bodies(out) == [{"type": "unknown", "lines": [0, 0], "raw": started, **tool("command_execution", "i1")}]
    assert f.norm.usage == {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4}


def test_X_R6_turn_failed_drains_then_errors():
    f = xfeed()
    started = {"id": "i1", "type": "web_search", "query": ""}
    f.line(codex("item.started", item=started))
    out = f.line(codex("turn.failed", error={"message": "401 Unauthorized"}))
    assert bodies(out) == [
        {"type": "unknown", "lines": [0, 0], "raw": started, **tool("web_search", "i1")},
        {"type": "error", "lines": [1, 1], "message": "401 Unauthorized", "code": "turn_failed", "errorClass": "auth"},
    ]
    assert f.norm.usage is None


@pytest.mark.parametrize("fields", [{}, {"error": {"message": ""}}, {"error": "text"}, {"error": None}])
def test_X_R6_otherwise_a_fixed_message(fields):
    out = xfeed().line(codex("turn.failed", **fields))
    assert bodies(out) == [{"type": "error", "lines": [0, 0], "message": "codex turn failed", "code": "turn_failed", "errorClass": "other"}]


@pytest.mark.parametrize("line", [codex("request_user_input", id="r", questions=[]), dumps({"id": "0", "msg": {"type": "task_started"}}),
                                  codex("session.created"), codex(MISSING, x=1), codex(7)])
def test_X_R8_anything_else_is_unknown(line):
    f = xfeed()
    out = f.line(line)
    assert [e["type"] for e in out] == ["unknown"]


# ================================================================= Codex pairing
def test_X_P1_P2_started_and_completed_pair_by_id_for_duration_and_lines():
    f = xfeed()
    f.line(x_item("item.started", "i1", "command_execution", command="ls src", status="in_progress"))
    f.line(x_item("item.started", "i2", "command_execution", command="ls docs", status="in_progress"))
    out = f.line(x_item("item.completed", "i2", "command_execution", command="ls docs", exit_code=0, status="completed"))
    out += f.line(x_item("item.completed", "i1", "command_execution", command="ls src", exit_code=0, status="completed"))
    assert bodies(out) == [
        {"type": "list", "lines": [1, 2], "path": "docs", "isSuccess": True, **tool("command_execution", "i2", 1000)},
        {"type": "list", "lines": [0, 3], "path": "src", "isSuccess": True, **tool("command_execution", "i1", 3000)},
    ]


def test_X_P1_a_missing_id_is_the_empty_id():
    f = xfeed()
    f.line(x_item("item.started", MISSING, "command_execution", command="make"))
    out = f.line(x_item("item.completed", 5, "command_execution", command="make", status="completed"))
    assert bodies(out) == [{"type": "command", "lines": [0, 1], "command": "make", "isSuccess": True, **tool("command_execution", "", 1000)}]


def test_X_P2_completed_without_started_is_classified_without_duration():
    out = xfeed().line(x_item("item.completed", "i", "file_change", changes=[{"path": "/a/b", "kind": "add"}], status="completed"))
    assert bodies(out) == [{"type": "write", "lines": [0, 0], "path": "/a/b", "isSuccess": True, **tool("file_change", "i")}]


def test_X_P3_open_items_drain_at_end_in_order():
    f = xfeed()
    a = {"id": "a", "type": "mcp_tool_call", "server": "gh", "tool": "search", "arguments": {}}
    b = {"id": "b", "type": "collab_tool_call", "tool": "spawn_agent"}
    c = {"id": "c", "type": "mcp_tool_call", "server": "todo", "tool": "add"}  # consumed
    f.lines(codex("item.started", item=a), codex("item.started", item=b), codex("item.started", item=c))
    out = f.end()
    assert bodies(out) == [
        {"type": "unknown", "lines": [0, 0], "raw": a, **tool("mcp__gh__search", "a")},
        {"type": "unknown", "lines": [1, 1], "raw": b, **tool("collab_tool_call", "b")},
    ]


# ============================================================ Codex classification
def _item(itype, item_id="i", **fields) -> list[dict]:
    return bodies(xfeed().line(x_item("item.completed", item_id, itype, **fields)))


@pytest.mark.parametrize("itype,kind", [("agent_message", "agent"), ("plan", "agent"), ("reasoning", "reasoning")])
def test_X_I1_I2_messages_arrive_whole(itype, kind):
    assert _item(itype, text="**Title**\n\nbody") == [{"type": kind, "lines": [0, 0], "message": "**Title**\n\nbody"}]
    assert _item(itype, text="") == [] and _item(itype) == [] and _item(itype, text=3) == []


def test_X_I1_messages_are_capped_like_spans():
    f = Feed(limits=Limits(max_span_chars=16), fmt=CX)
    out = f.line(x_item("item.completed", "i", "agent_message", text="x" * 40))
    assert bodies(out) == [{"type": "agent", "lines": [0, 0], "message": "x" * 16, "truncated": True}]


def test_X_I3_commands():
    assert _item("command_execution", command="/bin/bash -lc \"sed -n '1,80p' src/pager.py\"", exit_code=0, status="completed") == [
        {"type": "read", "lines": [0, 0], "path": "src/pager.py", "startLine": 1, "endLine": 80, "isSuccess": True,
         **tool("command_execution", "i")}]
    assert _item("command_execution", command="bash -lc 'npm test'", exit_code=1, status="failed") == [
        {"type": "command", "lines": [0, 0], "command": "bash -lc 'npm test'", "exitCode": 1, "isSuccess": False,
         **tool("command_execution", "i")}]
    assert _item("command_execution", command="cat f", exit_code=1, status="failed")[0].get("exitCode") is None


@pytest.mark.parametrize("command", ["", None, MISSING, 4])
def test_X_I3_otherwise_unknown(command):
    fields = {} if command is MISSING else {"command": command}
    out = _item("command_execution", **fields)
    assert [e["type"] for e in out] == ["unknown"] and out[0]["tool"] == "command_execution"


def test_X_I4_one_write_per_usable_change():
    changes = [{"path": "/p/./a.py", "kind": "update"}, {"path": ""}, "x", {"kind": "add"}, {"path": "rel/b.py", "kind": "add"}]
    assert _item("file_change", changes=changes, status="failed") == [
        {"type": "write", "lines": [0, 0], "path": "/p/a.py", "isSuccess": False, **tool("file_change", "i")},
        {"type": "write", "lines": [0, 0], "path": "rel/b.py", "isSuccess": False, **tool("file_change", "i")},
    ]


@pytest.mark.parametrize("changes", [[], [{"path": ""}], None, "x"])
def test_X_I4_otherwise_unknown(changes):
    assert [e["type"] for e in _item("file_change", changes=changes)] == ["unknown"]


def test_X_I5_mcp_calls_through_the_tool_table():
    assert _item("mcp_tool_call", server="fs", tool="read", arguments={"path": "/r.md", "start_line": 10, "end_line": 24},
                 status="completed") == [
        {"type": "read", "lines": [0, 0], "path": "/r.md", "startLine": 10, "endLine": 24, "isSuccess": True,
         **tool("mcp__fs__read", "i")}]
    assert [e["type"] for e in _item("mcp_tool_call", server="x", tool="Bash", arguments={"command": "ls"})] == ["list"]
    assert _item("mcp_tool_call", server="todo", tool="write", arguments={}) == []


@pytest.mark.parametrize("fields", [{"server": "gh", "tool": "search_issues"}, {"server": 1, "tool": "read"}, {"tool": "read"},
                                    {"server": "fs", "tool": "read", "arguments": {}}])
def test_X_I5_otherwise_unknown_with_the_item(fields):
    out = _item("mcp_tool_call", **fields)
    assert [e["type"] for e in out] == ["unknown"]
    assert out[0]["raw"]["type"] == "mcp_tool_call"
    if type(fields.get("server")) is str:
        assert out[0]["tool"] == f"mcp__{fields['server']}__{fields['tool']}"
    else:
        assert out[0]["tool"] == "mcp_tool_call"


@pytest.mark.parametrize("itype", ["web_search", "collab_tool_call"])
def test_X_I6_web_search_and_collab_are_unknown_with_extras(itype):
    assert _item(itype, query="q") == [{"type": "unknown", "lines": [0, 0], "raw": {"id": "i", "type": itype, "query": "q"},
                                        **tool(itype, "i")}]


def test_X_I7_todo_lists_are_consumed():
    f = xfeed()
    out = f.lines(x_item("item.started", "t", "todo_list", items=[]), x_item("item.updated", "t", "todo_list", items=[]),
                  x_item("item.completed", "t", "todo_list", items=[]))
    assert out == [] and f.end() == []


def test_X_I8_error_items_are_warnings():
    assert _item("error", message="model rerouted: a -> b") == [{"type": "warning", "lines": [0, 0], "message": "model rerouted: a -> b"}]
    assert _item("error") == [{"type": "warning", "lines": [0, 0], "message": "codex reported a non-fatal error"}]


@pytest.mark.parametrize("itype", ["image_view", 5, MISSING])
def test_X_I9_anything_else_is_unknown_without_tool_extras(itype):
    line = codex("item.completed", item={"id": "i"} if itype is MISSING else {"id": "i", "type": itype})
    out = bodies(xfeed().line(line))
    assert [e["type"] for e in out] == ["unknown"] and "tool" not in out[0] and "toolCallId" not in out[0]


@pytest.mark.parametrize(
    "itype,fields,expected",
    [("command_execution", {"status": "completed", "exit_code": 1}, True),
     ("command_execution", {"status": "failed"}, False),
     ("command_execution", {"status": "declined", "exit_code": None}, False),
     ("command_execution", {"status": "in_progress", "exit_code": 0}, True),
     ("command_execution", {"exit_code": 2}, False),
     ("command_execution", {}, None),
     ("file_change", {"exit_code": 0}, None),
     ("file_change", {"status": "declined"}, False)],
)
def test_X_S1_success(itype, fields, expected):
    extra = {"command": "make"} if itype == "command_execution" else {"changes": [{"path": "/x"}]}
    (event,) = _item(itype, **extra, **fields)
    assert event.get("isSuccess") == expected


def test_X_S2_S3_all_events_of_one_item_share_the_extras():
    f = xfeed()
    f.line(x_item("item.started", "i8", "file_change", changes=[], status="in_progress"))
    out = f.line(x_item("item.completed", "i8", "file_change", changes=[{"path": "/a"}, {"path": "/b"}], status="completed"))
    assert [(e["tool"], e["toolCallId"], e["durationMs"]) for e in out] == [("file_change", "i8", 1000)] * 2


# =============================================================== Codex errors
@pytest.mark.parametrize(
    "fields,message",
    [({"message": "Reconnecting... 2/5 (stream disconnected)"}, "Reconnecting... 2/5 (stream disconnected)"),
     ({"message": "stream error: boom; retrying 1/5 in 207ms…"}, "stream error: boom; retrying 1/5 in 207ms…"),
     ({"error": {"message": "Reconnecting... 1/5"}}, "Reconnecting... 1/5")],
)
def test_X_E1_retry_notices_are_warnings(fields, message):
    assert bodies(xfeed().line(codex("error", **fields))) == [{"type": "warning", "lines": [0, 0], "message": message, "code": "retry", "errorClass": "timeout"}]


@pytest.mark.parametrize(
    "fields,message,cls",
    [({"message": "exceeded retry limit, last status: 429"}, "exceeded retry limit, last status: 429", "rate_limit"),
     ({"message": "x Reconnecting... 1/5"}, "x Reconnecting... 1/5", "timeout"),
     ({"message": "", "error": "plain"}, "plain", "other"),
     ({}, "codex reported an error", "other")],
)
def test_X_E2_other_errors(fields, message, cls):
    assert bodies(xfeed().line(codex("error", **fields))) == [{"type": "error", "lines": [0, 0], "message": message, "errorClass": cls}]


def test_X_E3_turn_failed_repeating_the_fatal_error_is_not_reported_twice():
    f = xfeed()
    f.line(codex("error", message="stream disconnected: context window"))
    assert f.line(codex("turn.failed", error={"message": "stream disconnected: context window"})) == []
    # The memory restarts after a turn end.
    f.line(codex("error", message="again"))
    f.line(codex("turn.completed"))
    out = f.line(codex("turn.failed", error={"message": "again"}))
    assert [e["type"] for e in out] == ["error"]


def test_X_E3_otherwise_a_different_message_is_reported():
    f = xfeed()
    f.line(codex("error", message="one"))
    assert [e["message"] for e in f.line(codex("turn.failed", error={"message": "one (details)"}))] == ["one (details)"]


# ====================================================== goose stays as it was
def test_goose_runs_detected_or_labelled_give_the_same_events():
    lines = [say("m", "Hel"), say("m", "Hello"), msg("x", "assistant", {"type": "image"})]
    a, b = Feed(), Feed(fmt="goose")
    assert a.lines(*lines) + a.end(1) == b.lines(*lines) + b.end(1)
    assert [e["type"] for e in a.events] == ["unknown", "agent", "error"]


def test_envelope_order_with_a_session_id():
    f = cfeed()
    (event,) = f.line(claude("system", subtype="api_retry"))
    assert list(event)[:7] == ["eventId", "runId", "seq", "type", "timestamp", "lines", "sessionId"]
    assert event == ev(0, "warning", 0, (0, 0), sessionId=SESSION, message="API request failed", code="api_retry", errorClass="timeout")


# =========================================================== through the sequencer
def _entries(lines: list[str], exit_code: int | None) -> list:
    from services.sequencer.entries import Entry

    out = [Entry("r", i, T(i), "line", "stdout", line, None, None, None, f"{i}-0") for i, line in enumerate(lines)]
    out.append(Entry("r", len(lines), T(len(lines)), "eof", "stdout", "", exit_code, None, None, f"{len(lines)}-0"))
    return out


@pytest.mark.parametrize(
    "lines,usage,error",
    [([claude("system", subtype="init"), c_assistant("m", c_text("Done.")),
       claude("result", subtype="success", total_cost_usd=0.25,
              usage={"input_tokens": 2, "cache_read_input_tokens": 10, "output_tokens": 3})],
      {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15, "cacheReadInputTokens": 10, "costUsd": 0.25},
      "claude exited with code 1"),
     ([codex("thread.started", thread_id=THREAD), x_item("item.completed", "i0", "agent_message", text="Done."),
       codex("turn.completed", usage={"input_tokens": 12, "cached_input_tokens": 10, "output_tokens": 3})],
      {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15, "cacheReadInputTokens": 10},
      "codex exited with code 1")],
)
def test_L_lifecycle_records_of_detected_runs_through_the_sequencer(lines, usage, error):
    from services.sequencer.run import RunSequencer

    seq = RunSequencer("r")
    events, records = [], []
    for entry in _entries(lines, 1):
        outcome = seq.accept(entry)
        events += outcome.events
        records += outcome.records
    assert [r["state"] for r in records] == ["started", "completed", "ended"]
    assert {k: records[1][k] for k in usage} == usage
    assert records[2]["exitCode"] == 1 and records[2]["counts"]["error"] == 1
    assert [e["type"] for e in events] == ["agent", "error"] and events[-1]["message"] == error


def test_X_P2_a_non_tool_item_reusing_an_id_never_settles_a_started_call():
    f = xfeed()
    started = {"id": "i1", "type": "command_execution", "command": "make", "status": "in_progress"}
    f.line(codex("item.started", item=started))
    out = f.line(x_item("item.completed", "i1", "agent_message", text="hi"))
    assert [e["type"] for e in out] == ["agent"]
    assert bodies(f.end()) == [{"type": "unknown", "lines": [0, 0], "raw": started, **tool("command_execution", "i1")}]
