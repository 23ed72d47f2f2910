"""The run -> trace mapping (pure), checked through the SDK's in-memory exporter."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.export.otlp import mapping as m
from services.export.otlp.config import CAPTURE_ENV, mapping_config_from_env
from services.export.otlp.sink import SdkSink, SendOutcome, classify_status

RUN = "laptop-42/20261129_3"


def ev(seq: int, etype: str, ts: str = "2026-11-29T10:00:05.000Z", **fields):
    return {"eventId": f"{RUN}:{seq}", "runId": RUN, "seq": seq, "type": etype, "timestamp": ts,
            "lines": [seq, seq], **fields}


def rec(k: int, state: str, ts: str, **fields):
    return {"recordId": f"{RUN}:run:{k}", "runId": RUN, "state": state, "timestamp": ts, "seq": k,
            "counts": {"agent": 1, "command": 1}, **fields}


def cfg(**kw) -> m.MappingConfig:
    return m.MappingConfig(resource=Resource.create({"service.name": "test"}), **kw)


def exported(*spans):
    mem = InMemorySpanExporter()
    assert SdkSink(mem).send(list(spans)).outcome is SendOutcome.OK
    return mem.get_finished_spans()


def test_ids_are_deterministic_distinct_and_valid():
    assert m.trace_id_of(RUN) == m.trace_id_of(RUN)
    assert m.trace_id_of(RUN) != m.trace_id_of(RUN + "x")
    assert m.span_id_of(f"{RUN}:1") != m.span_id_of(f"{RUN}:2") != m.root_span_id_of(RUN)
    assert 0 < m.trace_id_of(RUN) < 2**128 and 0 < m.root_span_id_of(RUN) < 2**64
    ctx = m.root_context(RUN)
    assert ctx.is_valid and ctx.trace_flags.sampled


@pytest.mark.parametrize("fmt,agent,name,provider", [
    ("gemini-cli", None, "gemini", "gcp.gemini"),
    ("gemini-cli", "gemini-cli/0.61.0", "gemini-cli", "gcp.gemini"),
    ("opencode", None, "opencode", None),  # opencode talks to any provider: none is claimed
    ("claude-code", None, "claude", "anthropic"),
    ("codex", "codex/0.153", "codex", "openai"),
    ("goose", None, "goose", None),
    (None, None, "goose", None),
])
def test_the_root_names_agent_and_provider_from_the_runs_format(fmt, agent, name, provider):
    """contracts/formats.py, not this mapping, says what each format's product and provider are."""
    labels = {k: v for k, v in (("format", fmt), ("agent", agent)) if v is not None}
    facts = m.fold_records(RUN, [rec(0, "started", "2026-11-29T10:00:00.000Z", **labels),
                                 rec(1, "ended", "2026-11-29T10:01:00.000Z", exitCode=0, **labels)])
    (root,) = exported(m.root_span(facts, [], cfg(), m.Tally()))
    assert root.attributes["gen_ai.agent.name"] == name and root.name == f"invoke_agent {name}"
    assert root.attributes.get("gen_ai.provider.name") == provider


def test_failed_command_is_a_child_span_with_error_type_and_duration():
    tally = m.Tally()
    span = m.tool_span(ev(4, "command", command="npm test", exitCode=1, isSuccess=False, tool="developer__shell",
                          toolCallId="toolu_1", durationMs=1500), cfg(), tally)
    (out,) = exported(span)
    assert out.name == "execute_tool developer__shell"
    assert out.kind is SpanKind.INTERNAL
    assert out.parent.span_id == m.root_span_id_of(RUN) and out.context.trace_id == m.trace_id_of(RUN)
    assert out.context.span_id == m.span_id_of(f"{RUN}:4")
    assert out.end_time - out.start_time == 1_500_000_000
    assert out.end_time == m.ns_of("2026-11-29T10:00:05.000Z")
    a = out.attributes
    assert a["gen_ai.operation.name"] == "execute_tool" and a["gen_ai.tool.name"] == "developer__shell"
    assert a["gen_ai.tool.call.id"] == "toolu_1" and a["process.command_line"] == "npm test"
    assert a["process.exit.code"] == 1 and a["error.type"] == "tool_error"
    assert out.status.status_code is StatusCode.ERROR


def test_read_span_carries_path_and_lines_and_ok_status():
    span = m.tool_span(ev(1, "read", path="/src/a.py", startLine=3, endLine=9, isSuccess=True, tool="developer__text_editor",
                          toolCallId="t2", durationMs=0), cfg(), m.Tally())
    assert span.attributes["file.path"] == "/src/a.py"
    assert (span.attributes["goose_ingest.line.start"], span.attributes["goose_ingest.line.end"]) == (3, 9)
    assert span.status.status_code is StatusCode.OK and "error.type" not in span.attributes


def test_unknown_from_an_answered_tool_call_is_a_tool_span_and_raw_only_with_capture():
    e = ev(2, "unknown", raw={"secretish": "file contents"}, tool="ext__thing", toolCallId="c", durationMs=5)
    assert m.is_tool_span(e)
    assert "goose_ingest.raw" not in m.tool_span(e, cfg(), m.Tally()).attributes
    assert "file contents" in m.tool_span(e, cfg(capture_content=True), m.Tally()).attributes["goose_ingest.raw"]
    # an unanswered request (no durationMs) stays a span event of the root
    assert not m.is_tool_span(ev(3, "unknown", raw={}, tool="ext__thing", toolCallId="c"))


def test_message_text_only_when_content_capture_is_on():
    off = m.span_event(ev(0, "agent", message="the answer is ZEBRA"), cfg())
    assert off.name == "goose_ingest.agent" and "gen_ai.output.messages" not in off.attributes
    assert "ZEBRA" not in str(off.attributes)
    on = m.span_event(ev(0, "reasoning", message="think"), cfg(capture_content=True))
    assert '"type":"reasoning"' in on.attributes["gen_ai.output.messages"]
    assert '"content":"think"' in on.attributes["gen_ai.output.messages"]


def test_unknown_event_type_from_a_newer_contract_becomes_a_root_span_event():
    e = m.span_event(ev(5, "plan", steps=["a"]), cfg())
    assert e.name == "goose_ingest.unknown_type" and e.attributes["goose_ingest.event.type"] == "plan"
    assert m.StoredEvent.loads(e.dumps()) == e


def test_error_and_warning_events_keep_their_message_and_code():
    e = m.span_event(ev(6, "warning", message="raw entries 3..4 never arrived", code="missing-entries"), cfg())
    assert e.attributes["goose_ingest.message"].startswith("raw entries")
    assert e.attributes["goose_ingest.code"] == "missing-entries"


def test_root_span_from_records_usage_exit_code_parent_link_and_span_events():
    records = [
        rec(2, "ended", "2026-11-29T10:01:00.000Z", exitCode=1, inputTokens=900, outputTokens=80, costUsd=0.01,
            host="laptop-42", agent="goose/1.56.0", parentRunId="laptop-42/parent"),
        rec(0, "started", "2026-11-29T10:00:00.000Z", host="laptop-42", agent="goose/1.56.0"),
        rec(1, "completed", "2026-11-29T10:00:59.000Z", inputTokens=10, outputTokens=2),
    ]
    facts = m.fold_records(RUN, records)
    assert facts.state == "ended" and facts.expected_events == 2 and facts.usage["inputTokens"] == 900
    events = [m.span_event(ev(1, "error", message="goose exited with code 1"), cfg()),
              m.span_event(ev(0, "agent", message="hi"), cfg())]
    (root,) = exported(m.root_span(facts, events, cfg(), m.Tally()))
    assert root.name == "invoke_agent goose" and root.parent is None
    assert root.context.span_id == m.root_span_id_of(RUN)
    a = root.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "goose"
    assert a["gen_ai.agent.version"] == "1.56.0" and a["gen_ai.conversation.id"] == RUN
    assert a["gen_ai.usage.input_tokens"] == 900 and a["gen_ai.usage.output_tokens"] == 80
    assert a["process.exit.code"] == 1 and a["error.type"] == "agent_exit" and a["host.name"] == "laptop-42"
    assert root.status.status_code is StatusCode.ERROR
    assert root.start_time == m.ns_of("2026-11-29T10:00:00.000Z")
    assert root.end_time == m.ns_of("2026-11-29T10:01:00.000Z")
    assert [e.name for e in root.events] == ["goose_ingest.agent", "goose_ingest.error"]  # seq order
    (link,) = root.links
    assert link.context.trace_id == m.trace_id_of("laptop-42/parent")
    assert link.context.span_id == m.root_span_id_of("laptop-42/parent")
    assert link.attributes["goose_ingest.link.type"] == "parent_run"


def test_clean_exit_is_ok_and_abandoned_is_an_error():
    ok = m.root_span(m.fold_records(RUN, [rec(0, "ended", "2026-11-29T10:00:00.000Z", exitCode=0)]), [], cfg(), m.Tally())
    assert ok.status.status_code is StatusCode.OK and "error.type" not in ok.attributes
    gone = m.root_span(m.fold_records(RUN, [rec(0, "abandoned", "2026-11-29T10:00:00.000Z")]), [], cfg(), m.Tally())
    assert gone.attributes["error.type"] == "abandoned" and gone.status.status_code is StatusCode.ERROR


def test_root_that_never_ended_is_closed_by_timeout_and_marked():
    facts = m.fold_records(RUN, [rec(0, "started", "2026-11-29T10:00:00.000Z")])
    last = m.ns_of("2026-11-29T10:05:00.000Z")
    root = m.root_span(facts, [], cfg(), m.Tally(), last_ns=last, closed_by_timeout=True)
    assert root.attributes["goose_ingest.root.closed_by"] == "timeout"
    assert root.attributes["error.type"] == "root_timeout" and root.end_time == last
    # no record at all (records trimmed): the events' times bound the span
    bare = m.root_span(m.RootFacts(RUN), [], cfg(), m.Tally(), first_ns=5, last_ns=9, closed_by_timeout=True)
    assert (bare.start_time, bare.end_time) == (5, 9)


def test_oversized_attributes_are_truncated_per_sdk_limits_and_counted():
    tally = m.Tally()
    c = cfg(limits=SpanLimits(max_attribute_length=32))
    span = m.tool_span(ev(1, "command", command="x" * 100, tool="developer__shell", durationMs=1), c, tally)
    assert span.attributes["process.command_line"] == "x" * 32
    assert tally.truncated_attributes == 1
    big = m.span_event(ev(2, "agent", message="y" * 100), cfg(capture_content=True, limits=SpanLimits(max_attribute_length=32)))
    root = m.root_span(m.RootFacts(RUN), [big], c, tally, first_ns=1, last_ns=2)
    assert len(root.events[0].attributes["gen_ai.output.messages"]) == 32 and tally.truncated_attributes == 2


def test_span_events_beyond_the_sdk_limit_are_dropped_and_counted():
    tally = m.Tally()
    events = [m.span_event(ev(i, "agent", message="m"), cfg()) for i in range(5)]
    root = m.root_span(m.RootFacts(RUN), events, cfg(limits=SpanLimits(max_events=3)), tally, first_ns=1, last_ns=2)
    assert len(root.events) == 3 and tally.dropped_events == 2


def test_malformed_event_raises_a_mapping_error_not_something_else():
    with pytest.raises((KeyError, ValueError)):
        m.tool_span(ev(1, "command", ts="yesterday", command="ls", durationMs=1), cfg(), m.Tally())
    with pytest.raises(KeyError):
        m.tool_span({"type": "read"}, cfg(), m.Tally())


def test_config_from_the_standard_environment_variables():
    assert not mapping_config_from_env({}).capture_content
    assert mapping_config_from_env({CAPTURE_ENV: "TRUE"}).capture_content
    assert not mapping_config_from_env({CAPTURE_ENV: "1"}).capture_content  # the switch is exactly true
    assert mapping_config_from_env({}).limits.max_span_attribute_length == m.DEFAULT_ATTRIBUTE_LENGTH
    assert mapping_config_from_env({}).resource.attributes["service.name"] == "goose-ingest"


def test_endpoints_are_logged_without_credentials():
    from services.export.otlp.sink import endpoint_for_log

    assert endpoint_for_log("https://u:pw@collector:4318/v1/traces?token=t#x") == "https://collector:4318/v1/traces"
    assert endpoint_for_log("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"
    assert endpoint_for_log("user:pw@collector:4317?k=v") == "collector:4317"


def test_collector_answers_are_classified():
    assert classify_status(200, None, None).outcome is SendOutcome.OK
    assert classify_status(400, "Bad Request", None).outcome is SendOutcome.REJECTED
    assert classify_status(413, None, None).outcome is SendOutcome.REJECTED
    # an outage (an expired token, a wrong path, a proxy) is retried, never dead-lettered (issue 20, finding 4)
    for transient in (401, 403, 404, 405, 407, 408, 409, 415, 429, 500, 502, 503, 504, None):
        assert classify_status(transient, None, ConnectionError()).outcome is SendOutcome.TRANSIENT


def test_error_classes_reach_error_type_of_the_span_events_and_of_a_failed_root():
    records = [rec(0, "started", "2026-11-29T10:00:00.000Z"),
               rec(1, "ended", "2026-11-29T10:01:00.000Z", exitCode=1)]
    facts = m.fold_records(RUN, records)
    limited = m.span_event(ev(0, "error", message="Rate limit exceeded", errorClass="rate_limit"), cfg())
    exit_error = m.span_event(ev(1, "error", message="goose exited with code 1", errorClass="agent_exit"), cfg())
    retry = m.span_event(ev(2, "warning", message="retry", code="api_retry", errorClass="timeout"), cfg())
    bogus = m.span_event(ev(3, "error", message="x", errorClass="/home/u/secret"), cfg())
    assert limited.attributes["error.type"] == "rate_limit" and retry.attributes["error.type"] == "timeout"
    assert "error.type" not in bogus.attributes  # only the closed vocabulary becomes an attribute value
    # the root names the cause of the failure, not only the exit
    (root,) = exported(m.root_span(facts, [limited, exit_error], cfg(), m.Tally()))
    assert root.attributes["error.type"] == "rate_limit"
    (root,) = exported(m.root_span(facts, [exit_error], cfg(), m.Tally()))
    assert root.attributes["error.type"] == "agent_exit"
