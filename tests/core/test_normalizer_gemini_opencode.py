"""Gemini CLI and opencode (issue 37): the mapping rules G-... and O-... of the two specs, the
decisions of docs/contract.md ("Gemini CLI", "opencode") and their awkward cases.

Inputs are written as each CLI prints them (spec sections 2 and 4, the captures in
../shared/fixtures/); whole captures are held by tests/core/test_golden_gemini_opencode.py.
"""

from __future__ import annotations

import orjson
import pytest

from contracts.events import harness_event_adapter
from contracts.raw import OVERSIZE
from services.normalizer import RunNormalizer
from services.normalizer.formats import opencode
from services.normalizer.run_normalizer import detect_format
from services.sequencer import Entry, RunSequencer, parse_batch
from services.sequencer.entries import EntryError, parse_fields

SID = "5a0ce2f9-b3e2-4f75-82f0-3cfb31fce885"
OSID = "ses_db627a019ffe90GxA3VOPCD4El"


def ts(ms: int) -> str:
    return f"2026-12-06T05:33:{32 + ms // 1000:02d}.{ms % 1000:03d}Z"


def run(records, exit_code=0, signal=None, fmt=None, stderr=()):
    """Events of a run of `records` (dicts or text lines), and its normalizer after eof."""
    norm = RunNormalizer("r", fmt=fmt)
    events = []
    seq = 0
    for text in stderr:
        events += norm.line(seq, 1_000 + seq, text, "stderr")
        seq += 1
    for rec in records:
        line = rec if isinstance(rec, str) else orjson.dumps(rec).decode()
        events += norm.line(seq, 1_000 + seq, line)
        seq += 1
    events += norm.end(seq, 1_000 + seq, exit_code, signal=signal)
    for event in events:
        harness_event_adapter.validate_python(event)
    return events, norm


def strip(event):
    return {k: v for k, v in event.items() if k not in ("eventId", "runId", "seq", "timestamp", "sessionId")}


# ------------------------------------------------------------------ Gemini CLI
def init():
    return {"type": "init", "timestamp": ts(0), "session_id": SID, "model": "gemini-2.5-flash"}


def user(text="What is 2+2?"):
    return {"type": "message", "timestamp": ts(1), "role": "user", "content": text}


def delta(text, at=2):
    return {"type": "message", "timestamp": ts(at), "role": "assistant", "content": text, "delta": True}


def tool_use(name, params, call_id=None, at=10):
    return {"type": "tool_use", "timestamp": ts(at), "tool_name": name, "tool_id": call_id or f"{name}__{name}_1_0",
            "parameters": params}


def tool_result(name, status="success", output=None, call_id=None, at=70, error=None):
    rec = {"type": "tool_result", "timestamp": ts(at), "tool_id": call_id or f"{name}__{name}_1_0", "status": status}
    if output is not None:
        rec["output"] = output
    if error is not None:
        rec["error"] = error
    return rec


def result(status="success", error=None, **stats):
    stats = {"total_tokens": 1032, "input_tokens": 1000, "output_tokens": 12, "cached": 600, "input": 400,
             "duration_ms": 188, "tool_calls": 0, **stats}
    rec = {"type": "result", "timestamp": ts(500), "status": status, "stats": stats}
    if error is not None:
        rec["error"] = error
    return rec


def test_gemini_is_detected_by_its_init_only():
    assert detect_format(init()) == "gemini-cli"
    # its other types never decide: `message` is goose's record type, `result` Claude's
    assert detect_format(user()) == "goose"
    assert detect_format(result()) == "claude-code"
    assert detect_format({"type": "init", "session_id": 7}) == "goose"


def test_gemini_deltas_are_one_agent_event_flushed_by_the_next_record_and_usage_completes():
    events, norm = run([init(), user(), delta("The answer"), delta(" is 4."), result()])
    assert [strip(e) for e in events] == [{"type": "agent", "lines": [2, 3], "message": "The answer is 4."}]
    assert {e["sessionId"] for e in events} == {SID}
    # G-8.4: the whole prompt is input_tokens; the total is input + output (total_tokens counts thoughts)
    assert norm.usage == {"inputTokens": 1000, "outputTokens": 12, "totalTokens": 1012, "cacheReadInputTokens": 600}


def test_gemini_shell_success_is_omitted_unless_the_display_text_states_the_exit():
    events, _ = run([
        init(),
        tool_use("run_shell_command", {"command": "make build"}, "a", at=10),
        tool_result("run_shell_command", output="make: *** No rule to make target", call_id="a", at=75),
        tool_use("run_shell_command", {"command": "make test"}, "b", at=80),
        tool_result("run_shell_command", output="Command exited with code: 2", call_id="b", at=90),
        tool_use("run_shell_command", {"command": "make lint"}, "c", at=95),
        tool_result("run_shell_command", output="Command terminated by signal: SIGKILL", call_id="c", at=99),
        tool_use("run_shell_command", {"command": "make x"}, "d", at=100),
        tool_result("run_shell_command", status="error", call_id="d", at=101,
                    error={"type": "shell_execute_error", "message": "spawn failed"}),
        result(),
    ])
    commands = [e for e in events if e["type"] == "command"]
    assert [c.get("isSuccess") for c in commands] == [None, False, False, False]
    assert [c.get("exitCode") for c in commands] == [None, 2, None, None]
    # durations from the CLI's own timestamps, not the tap's (1 ms apart here)
    assert [c["durationMs"] for c in commands] == [65, 10, 4, 1]


def test_gemini_tool_table_and_aliases():
    calls = [
        ("read_file", {"absolute_path": "/p/a.py", "offset": 3, "limit": 2}, {"type": "read", "path": "/p/a.py", "startLine": 3, "endLine": 4}),
        ("replace", {"file_path": "b.py", "old_string": "x", "new_string": "y"}, {"type": "write", "path": "b.py"}),
        ("grep_search", {"pattern": "TODO", "dir_path": "src"}, {"type": "search", "query": "TODO", "path": "src"}),
        ("search_file_content", {"pattern": "x"}, {"type": "search", "query": "x"}),
        ("list_directory", {"dir_path": "src"}, {"type": "list", "path": "src"}),
        ("activate_skill", {"name": "pdf"}, {"type": "skill", "path": "skills/pdf/SKILL.md", "skillName": "pdf"}),
        ("mcp_files_read", {"path": "c.txt"}, {"type": "read", "path": "c.txt"}),
    ]
    records = [init()]
    for i, (name, params, _) in enumerate(calls):
        records += [tool_use(name, params, f"id{i}"), tool_result(name, call_id=f"id{i}")]
    events, _ = run([*records, result()])
    got = [{k: e[k] for k in want} for e, (_, _, want) in zip(events, calls, strict=True)]
    assert got == [want for _, _, want in calls]
    assert all(e["isSuccess"] is True for e in events)


def test_gemini_bookkeeping_is_consumed_and_other_tools_are_unknown_with_the_request():
    events, _ = run([
        init(),
        tool_use("write_todos", {"todos": []}, "t"), tool_result("write_todos", call_id="t"),
        tool_use("tracker_create_task", {}, "k"),  # never answered: drained silently too
        tool_use("google_web_search", {"query": "x"}, "w"), tool_result("google_web_search", call_id="w"),
        tool_use("read_file", {}, "r"), tool_result("read_file", call_id="r"),  # required path missing
        tool_use("glob", {"pattern": "*"}, "never"),
        result(),
    ])
    assert [(e["type"], e.get("tool")) for e in events] == [
        ("unknown", "google_web_search"), ("unknown", "read_file"), ("unknown", "glob")]
    assert events[0]["raw"]["type"] == "tool_use" and "durationMs" in events[0]
    assert "durationMs" not in events[2]  # drained at the result: never answered


def test_gemini_error_records_and_a_result_error_reported_once():
    events, norm = run([
        init(),
        {"type": "error", "timestamp": ts(3), "severity": "warning", "message": "Loop detected, stopping execution"},
        {"type": "error", "timestamp": ts(4), "severity": "error",
         "message": "Model response was truncated because it exceeded the token limit. Try using /compress to free up context space."},
        result("error"),
    ])
    assert [(e["type"], e.get("errorClass")) for e in events] == [("warning", None), ("error", "context_length")]
    assert norm.usage is not None  # every result completes, error ones included


@pytest.mark.parametrize("message,code,cls", [
    ('[API Error: {"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}]', "unknown", "auth"),
    ('[API Error: {"error":{"code":403,"message":"Method doesn\'t allow unregistered callers","status":"PERMISSION_DENIED"}}]', "unknown", "auth"),
    ('[API Error: {"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","details":[{"reason":"API_KEY_INVALID"}]}}]', "unknown", "auth"),
    ("[API Error: Resource has been exhausted (e.g. check quota).\nSuggested retry after 1s.]\nPlease wait and try again later. "
     "To increase your limits, request a quota increase through AI Studio, or switch to another /auth method", "unknown", "rate_limit"),
    ("[API Error: You have exhausted your daily quota on this model.]\nPlease wait and try again later. To increase your "
     "limits, request a quota increase through AI Studio, or switch to another /auth method", "unknown", "quota"),
    ('[API Error: {"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}]', "unknown", "provider_unavailable"),
    ("[API Error: The model is overloaded. Please try again later.]", "unknown", "provider_unavailable"),
    ('[API Error: {"error":{"code":400,"message":"The input token count (1234567) exceeds the maximum number of tokens '
     'allowed (1048576).","status":"INVALID_ARGUMENT"}}]', "unknown", "context_length"),
    ("[API Error: exception TypeError: fetch failed sending request]", "unknown", "timeout"),
    ("[API Error: terminated]", "unknown", "timeout"),
    ("Reached max session turns for this session. Increase the number of turns by specifying maxSessionTurns in "
     "settings.json.", "FatalTurnLimitedError", "max_turns"),
    ("Operation cancelled.", "FatalCancellationError", "cancelled"),
])
def test_gemini_error_classes_of_every_captured_fault(message, code, cls):
    """gemini-cli-stream-format sections 4 and 8.5."""
    events, _ = run([init(), user(), result("error", {"type": code, "message": message},
                                            input_tokens=0, output_tokens=0, cached=0)], exit_code=145)
    error, exit_error = events
    assert (error["message"], error["code"], error["errorClass"]) == (message, code, cls)
    assert exit_error["errorClass"] == "agent_exit"


def test_gemini_http_exit_codes_are_exit_codes_not_signals():
    """401 -> 145, 429 -> 173, 503 -> 247: status mod 256, never read as 128 + N."""
    for code in (144, 145, 147, 173, 244, 247):
        events, _ = run([init(), user(), result("error", {"type": "unknown", "message": "[API Error: x]"})], exit_code=code)
        assert events[-1]["message"] == f"gemini exited with code {code}"
        assert events[-1]["errorClass"] == "agent_exit" and "code" not in events[-1]


def test_gemini_sigint_exit_0_is_nothing_alone_and_cancelled_when_the_tap_saw_the_signal():
    stopped = [init(), user(), delta("The answer")]
    events, norm = run(stopped, exit_code=0)
    assert [e["type"] for e in events] == ["agent"] and norm.usage is None  # ended without completed
    events, norm = run(stopped, exit_code=0, signal=2)
    assert [e["type"] for e in events] == ["agent", "error"]
    assert events[-1]["code"] == "signalled" and events[-1]["errorClass"] == "cancelled"
    assert events[-1]["message"] == "gemini was stopped by signal 2 (forwarded by the tap); it exited with code 0"
    # a run that answered before the signal reached it is not called cancelled
    events, _ = run([*stopped, result()], exit_code=0, signal=15)
    assert [e["type"] for e in events] == ["agent"]


def test_the_eof_signal_field_is_read_and_bounded():
    fields = {b"run": b"r", b"seq": b"3", b"ts": b"1000", b"kind": b"eof", b"exit": b"0", b"signal": b"2"}
    entry = parse_fields(fields, "1-0")
    assert entry.signal == 2 and entry.exit == 0
    assert Entry.from_fields(entry.to_fields(), "1-0") == entry
    for bad in (b"0", b"128", b"x"):
        with pytest.raises(EntryError):
            parse_fields({**fields, b"signal": bad}, "1-0")


def test_a_gemini_prompt_line_over_the_cap_costs_the_run_only_that_line():
    """The echoed user message repeats a big prompt whole: dead-lettered `oversize` as any entry,
    the run skips that seq (a `missing-entries` warning) and keeps every later event."""
    cap = 4096
    lines = [orjson.dumps(r).decode() for r in (init(), user("x" * (2 * cap)), delta("ok"), result())]
    fields = [{b"run": b"r", b"seq": str(i).encode(), b"ts": str(1_000 + i).encode(), b"kind": b"line",
               b"line": text.encode()} for i, text in enumerate(lines)]
    fields.append({b"run": b"r", b"seq": b"4", b"ts": b"1004", b"kind": b"eof", b"exit": b"0"})
    parsed = parse_batch([f"{i}-0" for i in range(5)], fields, cap)
    assert parsed[1].reason == OVERSIZE
    sequencer = RunSequencer("r")
    events, records = [], []
    for i, item in enumerate(parsed):
        out = sequencer.lose(1, 1_001, reason=OVERSIZE) if i == 1 else sequencer.accept(item)
        events += out.events
        records += out.records
    assert [e["type"] for e in events] == ["warning", "agent"]
    assert events[0]["message"].endswith("dead-lettered (oversize)")
    assert events[1]["message"] == "ok" and events[1]["sessionId"] == SID
    assert [r["state"] for r in records] == ["started", "completed", "ended"]
    assert records[-1]["format"] == "gemini-cli" and records[-1]["missing"] == [[1, 1]]


def test_gemini_schema_breaking_records_keep_their_raw():
    events, _ = run([
        init(),
        {"type": "message", "role": "assistant", "content": 5},
        {"type": "tool_use", "tool_name": 3, "tool_id": "x"},
        {"type": "tool_result", "tool_id": "nobody"},
        {"type": "result", "error": "boom"},
        {"type": "what"},
    ])
    assert [e["type"] for e in events] == ["unknown"] * 5
    assert events[-1]["raw"] == {"type": "what"}


# -------------------------------------------------------------------- opencode
def rec(rtype, **part):
    return {"type": rtype, "timestamp": 1796535250493, "sessionID": OSID,
            "part": {"id": "prt_1", "messageID": "msg_1", "sessionID": OSID, **part}}


def step_finish(reason="stop", inp=400, out=12, reasoning=0, read=600, write=0, cost=0.000695):
    return rec("step_finish", type="step-finish", reason=reason, cost=cost,
               tokens={"total": inp + out + reasoning + read + write, "input": inp, "output": out,
                       "reasoning": reasoning, "cache": {"write": write, "read": read}})


def tool(name, inp, status="completed", start=100, end=160, **state):
    return rec("tool_use", type="tool", tool=name, callID=f"call_{name}",
               state={"status": status, "input": inp, "time": {"start": start, "end": end}, **state})


def oc_error(name="APIError", message="boom", status=None):
    data = {"message": message, "isRetryable": False}
    if status is not None:
        data["statusCode"] = status
    return {"type": "error", "timestamp": 1, "sessionID": OSID, "error": {"name": name, "data": data}}


def test_opencode_is_detected_by_its_types_with_session_id_only():
    for rtype in ("step_start", "text", "tool_use", "step_finish", "reasoning", "error"):
        assert detect_format({"type": rtype, "sessionID": OSID}) == "opencode"
    assert detect_format({"type": "error", "message": "x"}) == "goose"  # goose's own error record
    assert detect_format({"type": "text"}) == "goose"


def test_opencode_usage_is_summed_over_steps():
    events, norm = run([rec("step_start", type="step-start"), step_finish("tool-calls", 400, 30),
                        step_finish("stop", 550, 12, reasoning=20, write=5, cost=0.001)])
    assert events == []
    assert norm.usage == {"inputTokens": 400 + 600 + 550 + 600 + 5, "outputTokens": 30 + 12 + 20,
                          "totalTokens": 2217, "cacheReadInputTokens": 1200, "cacheWriteInputTokens": 5,
                          "costUsd": pytest.approx(0.001695)}


def test_opencode_tools_durations_from_the_cli_and_bash_exit():
    events, _ = run([
        tool("bash", {"command": "make test"}, metadata={"exit": 2, "output": "x"}, start=100, end=350),
        tool("bash", {"command": "make"}, metadata={"exit": 0}),
        tool("read", {"filePath": "/p/n.txt", "offset": 2, "limit": 2}),
        tool("read", {"filePath": "/p/x"}, status="error", error="File not found: /p/x"),
        tool("apply_patch", {"patchText": "..."}, metadata={"files": ["/p/a.py", {"filePath": "/p/b.py"}]}),
        tool("todowrite", {"todos": []}),
        tool("task", {"prompt": "x"}),
        tool("github_create_issue", {"title": "x"}),
    ])
    assert [(e["type"], e.get("isSuccess"), e.get("exitCode"), e.get("durationMs")) for e in events] == [
        ("command", False, 2, 250), ("command", True, 0, 60), ("read", True, None, 60), ("read", False, None, 60),
        ("write", True, None, 60), ("write", True, None, 60), ("unknown", None, None, 60), ("unknown", None, None, 60)]
    assert events[2]["startLine"] == 2 and events[2]["endLine"] == 3
    assert [e.get("path") for e in events[4:6]] == ["/p/a.py", "/p/b.py"]
    assert events[-1]["raw"]["tool"] == "github_create_issue" and events[-1]["tool"] == "github_create_issue"


def test_opencode_text_is_whole_and_synthetic_text_is_dropped():
    events, _ = run([
        rec("text", type="text", text="Hello.", time={"start": 1, "end": 2}),
        rec("text", type="text", text="The conversation was compacted", synthetic=True, metadata={"compaction_continue": True}),
        rec("reasoning", type="reasoning", text="thinking", time={"start": 1, "end": 2}),
        rec("text", type="text", text=""),
    ])
    assert [(e["type"], e["message"]) for e in events] == [("agent", "Hello."), ("reasoning", "thinking")]


def test_opencode_finish_reasons_length_and_content_filter_are_errors():
    events, _ = run([step_finish("length"), step_finish("content-filter")])
    assert [(e["code"], e["errorClass"]) for e in events] == [("max_output_tokens", "context_length"),
                                                            ("content_filter", "other")]


@pytest.mark.parametrize("name,message,status,cls", [
    ("APIError", "Incorrect API key provided: mock-***. You can find your API key in your account settings.", 401, "auth"),
    ("APIError", "You are not allowed to access this model with this API key.", 403, "auth"),
    ("APIError", "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 3, Used 3, "
                 "Requested 1. Please try again in 20s.", 429, "rate_limit"),
    ("APIError", "You exceeded your current quota, please check your plan and billing details.", 429, "quota"),
    ("APIError", "The server had an error while processing your request. Sorry about that!", 500, "provider_unavailable"),
    ("APIError", "The engine is currently overloaded, please try again later.", 503, "provider_unavailable"),
    ("ContextOverflowError", "This model's maximum context length is 128000 tokens. However, your messages resulted in "
                             "130000 tokens.", None, "context_length"),
    ("APIError", "Cannot connect to API: Unable to connect. Is the computer able to access the url?", None, "timeout"),
    ("APIError", "Connection reset by server", None, "timeout"),
    ("ProviderAuthError", "missing credentials", None, "auth"),
    ("MessageAbortedError", "aborted", None, "cancelled"),
])
def test_opencode_error_classes_of_every_captured_fault(name, message, status, cls):
    """opencode-run-json-format sections 4 and 8.5 (O-E1..O-E3)."""
    events, _ = run([oc_error(name, message, status)], exit_code=1)
    error, exit_error = events
    want = message if status is None else f"{message} (HTTP {status})"
    assert (error["message"], error["code"], error["errorClass"]) == (want, name, cls)
    assert exit_error["message"] == "opencode exited with code 1" and exit_error["errorClass"] == "agent_exit"


def test_opencode_exit_1_after_a_recovered_error_is_a_warning_not_a_second_error():
    overflow = oc_error("ContextOverflowError", "This model's maximum context length is 128000 tokens.")
    recovered = [overflow, rec("text", type="text", text="summary"), step_finish("stop"),
                 rec("text", type="text", text="answer"), step_finish("stop")]
    events, _ = run(recovered, exit_code=1)
    assert [e["type"] for e in events] == ["error", "agent", "agent", "warning"]
    assert events[-1]["code"] == "recovered_exit" and "errorClass" not in events[-1]
    # an error after the last answer is not recovered: the exit error stays
    events, _ = run([*recovered, oc_error()], exit_code=1)
    assert events[-1]["message"] == "opencode exited with code 1"
    # any other exit code is reported as ever
    events, _ = run(recovered, exit_code=2)
    assert events[-1]["message"] == "opencode exited with code 2"


def test_opencode_compaction_loop_warns_at_bounded_points_with_bounded_state():
    overflow = oc_error("ContextOverflowError", "This model's maximum context length is 128000 tokens.")
    cycle = [overflow, rec("step_start", type="step-start"), rec("text", type="text", text="summary"),
             step_finish("stop"), rec("text", type="text", text="continue", synthetic=True)]
    norm = RunNormalizer("r")
    events = []
    for seq, record in enumerate(cycle * 200):
        events += norm.line(seq, seq, orjson.dumps(record).decode())
    warnings = [e for e in events if e["type"] == "warning"]
    assert [int(w["message"].split("retried ")[1].split()[0]) for w in warnings] == [3, 6, 12, 24, 48, 96, 192]
    assert all(w["code"] == "retry" and w["errorClass"] == "context_length" for w in warnings)
    state = norm.to_state()
    assert state["local"] == {"overflows": 200, "errored": 1, "recovered": 1}
    assert len(orjson.dumps(state)) < 2048  # the state does not grow with the loop


def test_opencode_compaction_loop_is_counted_where_an_alert_reads_it():
    """The alertable signal of a run that retries for ever: its warnings are the workers'
    goose_ingest_error_retries_total{class="context_length",format="opencode"} (the PromQL of
    docs/contract.md "The compaction loop"), its refusals goose_ingest_errors_total of that class."""
    from services.metrics.registry import Metrics

    overflow = oc_error("ContextOverflowError", "This model's maximum context length is 128000 tokens.")
    cycle = [overflow, rec("step_start", type="step-start"), rec("text", type="text", text="summary"),
             step_finish("stop"), rec("text", type="text", text="continue", synthetic=True)]
    events, _ = run(cycle * 12, exit_code=None)
    metrics = Metrics()
    metrics.events(events, "opencode")

    def total(name: str, cls: str, fmt: str = "opencode") -> float:
        return sum(s.value for fam in metrics.registry.collect() for s in fam.samples
                   if s.name == name and s.labels.get("class") == cls and s.labels.get("format") == fmt)

    assert total("goose_ingest_error_retries_total", "context_length") == 3  # at the 3rd, 6th and 12th overflow
    assert total("goose_ingest_errors_total", "context_length") == 12
    assert total("goose_ingest_error_retries_total", "context_length", "goose") == 0


def test_opencode_schema_breaking_records_keep_their_raw():
    events, norm = run([
        {"type": "text", "sessionID": OSID, "part": "x"},
        {"type": "tool_use", "sessionID": OSID, "part": {"tool": 1, "state": {}}},
        {"type": "step_finish", "sessionID": OSID, "part": {"tokens": {"input": "many", "cache": 7}, "cost": "free"}},
        '{"type":"step_finish","sessionID":"' + OSID + '","part":{"tokens":{"input":100000000000000000000000000000}}}',
        {"type": "error", "sessionID": OSID, "error": 5},
        {"type": "nope", "sessionID": OSID},
    ], fmt="opencode")
    assert [e["type"] for e in events] == ["unknown", "unknown", "error", "unknown"]
    assert events[2]["message"] == "opencode reported an error"
    assert norm.usage == {}
    assert opencode.summed_usage({"inputTokens": 2**63 - 1}, {"tokens": {"input": 1}}) == {"inputTokens": 2**63 - 1}
