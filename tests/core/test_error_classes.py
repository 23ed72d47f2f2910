"""Error classes (services/normalizer/error_classes.py, docs/contract.md "Error classes").

The rules table: one real message per rule, as each CLI prints it (the sources are cited in the
module and in docs/contract.md); the order between rules (the most specific cause wins); totality
and the bounded prefix (property tests); and the class through the whole normalizer for each
format, where it lands on the events the contract says.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.events import ERROR_CLASSES, harness_event_adapter
from services.normalizer import RunNormalizer
from services.normalizer import error_classes as ec

# (code, message, class): the CLIs' own texts
CASES = [
    # the normalizer's own end of run
    (None, "goose exited with code 1", "agent_exit"),
    (None, "claude exited with code 137", "agent_exit"),
    (None, "codex exited with code -9", "agent_exit"),
    # goose ProviderError (crates/goose/src/providers/errors.rs), as `goose run` prints it
    (None, "Ran into this error: Context length exceeded: prompt has 210000 tokens", "context_length"),
    (None, "Ran into this error: Authentication error: invalid x-api-key", "auth"),
    (None, "Ran into this error: Rate limit exceeded: 429 Too Many Requests", "rate_limit"),
    (None, "Ran into this error: Server error: upstream returned 529 overloaded_error.", "provider_unavailable"),
    (None, "Request failed: error sending request for url (https://api.anthropic.com/v1/messages)", "timeout"),
    (None, "error returned from database: (code: 5) database is locked", "other"),
    # Claude Code: result subtypes and API-error `error` values (claude-code-stream-format §2.2, §2.4)
    ("error_max_turns", "Reached maximum number of turns (7)", "max_turns"),
    ("error_max_budget_usd", "Reached maximum budget ($5)", "quota"),
    ("authentication_failed", "Invalid API key · Please run /login", "auth"),
    ("billing_error", "Credit balance is too low", "quota"),
    ("rate_limit", "rate limit status: rejected", "rate_limit"),
    ("server_error", 'API Error: 529 {"type":"error","error":{"type":"overloaded_error"}}', "provider_unavailable"),
    ("max_output_tokens", "claude code reported an API error: max_output_tokens", "context_length"),
    ("error_during_execution", "Prompt is too long", "context_length"),
    ("invalid_request", "claude code reported an API error: invalid_request", "other"),
    ("api_retry", "API request failed (rate_limit, HTTP 429); retry 2/10", "rate_limit"),
    ("api_retry", "API request failed (authentication_failed, HTTP 401); retry 1/10", "auth"),
    ("api_retry", "API request failed (HTTP 503); retry 1/10", "provider_unavailable"),
    (None, "Request timed out", "timeout"),
    # Codex CodexErr (codex-rs/core/src/error.rs) and retry notices (X-E1)
    ("turn_failed", "Codex ran out of room in the model's context window. Start a new conversation.", "context_length"),
    (None, "stream disconnected before completion: Your input exceeds the context window of this model.", "context_length"),
    (None, "You've hit your usage limit. Try again at 3:05 PM.", "quota"),
    (None, "Quota exceeded. Check your plan and billing details.", "quota"),
    (None, "exceeded retry limit, last status: 429 Too Many Requests", "rate_limit"),
    (None, "exceeded retry limit, last status: 503 Service Unavailable", "provider_unavailable"),
    (None, "We're currently experiencing high demand, which may cause temporary errors.", "provider_unavailable"),
    (None, "unexpected status 401 Unauthorized: token expired", "auth"),
    ("turn_failed", "turn aborted. Something went wrong? Hit `/feedback` to report the issue.", "cancelled"),
    (None, "interrupted (Ctrl-C). Something went wrong? Hit `/feedback` to report the issue.", "cancelled"),
    ("retry", "Reconnecting... 2/5", "timeout"),
    ("retry", "stream error: error sending request for url (https://chatgpt.com/backend-api/codex/responses); retrying 1/5",
     "timeout"),
    (None, "Connection failed: error trying to connect: dns error", "timeout"),
    ("turn_failed", "codex turn failed", "other"),
    (None, "", "other"),
]


@pytest.mark.parametrize(("code", "message", "expected"), CASES, ids=[c[1][:48] for c in CASES])
def test_each_rule_on_the_clis_own_text(code, message, expected):
    assert ec.classify(code, message) == expected


def test_the_vocabulary_is_the_contracts_and_every_class_has_a_case():
    names = {getattr(ec, n) for n in ("RATE_LIMIT", "AUTH", "QUOTA", "CONTEXT_LENGTH", "PROVIDER_UNAVAILABLE", "TIMEOUT",
                                      "MAX_TURNS", "CANCELLED", "AGENT_EXIT", "OTHER")}
    assert names == set(ERROR_CLASSES) == set(ec.ERROR_CLASSES)
    assert {c[2] for c in CASES} == set(ERROR_CLASSES)


def test_the_clis_codes_decide_before_the_message():
    # a max-turns result whose prose mentions a network error is still max_turns
    assert ec.classify("error_max_turns", "network error while reaching the maximum") == "max_turns"
    # a code that says nothing about the cause leaves it to the message
    assert ec.classify("turn_failed", "Rate limit exceeded") == "rate_limit"


def test_only_errors_and_retry_warnings_get_a_class():
    assert ec.event_class("error", None, "boom") == "other"
    assert ec.event_class("warning", "api_retry", "API request failed (HTTP 529)") == "provider_unavailable"
    assert ec.event_class("warning", None, "rate limit exceeded") is None  # a stderr line, not a retry notice
    assert ec.event_class("warning", "mcp_server", "mcp server jira: failed") is None
    assert ec.event_class("agent", None, "rate limit") is None


@settings(max_examples=300, deadline=None)
@given(code=st.one_of(st.none(), st.text(max_size=30), st.sampled_from(sorted(ec.RETRY_WARNING_CODES))),
       message=st.text(max_size=3000))
def test_total_never_raises_and_stays_in_the_vocabulary(code, message):
    assert ec.classify(code, message) in ERROR_CLASSES
    for etype in ("error", "warning", "agent"):
        cls = ec.event_class(etype, code, message)
        assert cls is None or cls in ERROR_CLASSES
    # not a string where one is expected (a hostile record): still a class, no exception
    assert ec.event_class("error", 5, None) == "other"


@settings(max_examples=100, deadline=None)
@given(prefix=st.text(max_size=200), tail=st.sampled_from(["rate limit", "HTTP 401", "timed out", "overloaded"]))
def test_only_a_bounded_prefix_is_read(prefix, tail):
    # whatever stands after the first MAX_CLASSIFIED_CHARS characters cannot change the class
    head = (prefix + "x" * ec.MAX_CLASSIFIED_CHARS)[: ec.MAX_CLASSIFIED_CHARS]
    assert ec.classify(None, head + " " + tail) == ec.classify(None, head)


def test_a_huge_message_costs_no_more_than_its_prefix():
    huge = "a" * 50_000_000  # 50 MB of nothing: classified from its first 2 KiB
    assert ec.classify(None, huge) == "other"


# ------------------------------------------------------------------ through the normalizer
RUN = "cls/run"


def _events(fmt: str, lines: list[str], exit_code: int | None = None) -> list[dict]:
    norm = RunNormalizer(RUN, fmt=fmt)
    out: list[dict] = []
    for seq, line in enumerate(lines):
        out += norm.line(seq, 1_790_000_000_000 + seq, line)
    out += norm.end(len(lines), 1_790_000_000_000 + len(lines), exit_code)
    for event in out:
        harness_event_adapter.validate_python(event)  # the contract's model takes the class
    return [e for e in out if e["type"] in ("error", "warning")]


def _classes(events: list[dict]) -> list[tuple[str, str | None]]:
    return [(e["type"], e.get("errorClass")) for e in events]


def test_goose_errors_and_exit_through_the_normalizer():
    lines = [orjson.dumps({"type": "error", "error": "Rate limit exceeded: 429"}).decode(),
             orjson.dumps({"type": "error", "error": "Context length exceeded: too long"}).decode()]
    assert _classes(_events("goose", lines, exit_code=1)) == [
        ("error", "rate_limit"), ("error", "context_length"), ("error", "agent_exit")]


def test_claude_code_retry_warnings_api_errors_and_max_turns_through_the_normalizer():
    lines = [orjson.dumps({"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10, "error": "rate_limit",
                           "error_status": 429}).decode(),
             orjson.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True,
                           "errors": ["Reached maximum number of turns (7)"]}).decode()]
    assert _classes(_events("claude-code", lines, exit_code=1)) == [
        ("warning", "rate_limit"), ("error", "max_turns"), ("error", "agent_exit")]


def test_codex_retry_notice_and_fatal_error_through_the_normalizer():
    lines = [orjson.dumps({"type": "error", "message": "Reconnecting... 1/5"}).decode(),
             orjson.dumps({"type": "error", "message": "exceeded retry limit, last status: 429 Too Many Requests"}).decode(),
             orjson.dumps({"type": "turn.failed", "error": {"message": "You've hit your usage limit."}}).decode()]
    assert _classes(_events("codex", lines)) == [("warning", "timeout"), ("error", "rate_limit"), ("error", "quota")]


def test_other_warnings_carry_no_class():
    events = _events("goose", ["not json at all"])
    assert events and all("errorClass" not in e for e in events)


@pytest.mark.parametrize(("message", "expected"), [(m, c) for code, m, c in CASES if code is None and m],
                         ids=[c[1][:48] for c in CASES if c[0] is None and c[1]])
def test_every_message_rule_through_a_goose_error_record(message, expected):
    (event,) = _events("goose", [orjson.dumps({"type": "error", "error": message}).decode()])
    assert event == {**event, "type": "error", "message": message, "errorClass": expected}
