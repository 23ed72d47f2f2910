"""The providers' and the agent CLIs' real error texts, each in the class docs/contract.md gives it.

tests/data/provider_error_texts.json holds the texts (Anthropic, OpenAI, Azure OpenAI, Bedrock,
Vertex/Gemini, OpenRouter, and the wrappers of goose, Claude Code, Codex, Gemini CLI and opencode),
each with where it was read and the CLI code it travels with. These are the goldens of the rule
order: a text that lands elsewhere pages the wrong owner (a 429 paged as "quota exhausted, the fleet
stops", a throttle as a context-window problem).
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from contracts.events import ERROR_CLASSES
from services.normalizer import error_classes as ec
from tests.support.fixtures import REPO

CORPUS = json.loads((REPO / "tests" / "data" / "provider_error_texts.json").read_text())["texts"]
PROVIDERS = {"goose", "anthropic", "claude-code", "codex", "openai", "azure-openai", "bedrock", "vertex", "gemini",
             "gemini-cli", "opencode", "openrouter"}


@pytest.mark.parametrize("entry", CORPUS, ids=[f"{e['provider']}:{e['text'][:40]}" for e in CORPUS])
def test_each_real_text_lands_in_its_class(entry):
    assert ec.classify(entry["code"], entry["text"]) == entry["class"], entry["source"]


def test_the_corpus_is_well_formed_and_covers_every_provider_and_class():
    for entry in CORPUS:
        assert set(entry) == {"provider", "source", "code", "text", "class"}, entry
        assert entry["class"] in ERROR_CLASSES and entry["source"].strip() and entry["text"].strip(), entry
    assert {e["provider"] for e in CORPUS} == PROVIDERS
    # agent_exit is the normalizer's own text, never a provider's
    assert set(Counter(e["class"] for e in CORPUS)) == set(ERROR_CLASSES) - {"agent_exit"}
    texts = [(e["code"], e["text"]) for e in CORPUS]
    assert len(texts) == len(set(texts)), "a text listed twice"


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # the same 429 family, told apart by what it says: a retry hint is throttling, billing is quota
        ("You exceeded your current quota, please check your plan and billing details.", "quota"),
        ("You exceeded your current quota, please check your plan and billing details. Please retry in 3s.", "rate_limit"),
        ("Quota exceeded for metric: x_requests_per_minute", "rate_limit"),
        ("Quota exceeded for metric: x_requests_per_day", "quota"),
        # an explicit 401/403 beats every incidental word
        ('{"error":{"code":403,"message":"quota project not set; billing disabled","status":"PERMISSION_DENIED"}}', "auth"),
        ("Reconnecting... 1/1 (unexpected status 401 Unauthorized: rate limit of token refresh)", "auth"),
        # a throttle is never a context-window failure
        ("Too many tokens, please wait before trying again.", "rate_limit"),
        ("prompt is too long: 210000 tokens > 200000 maximum", "context_length"),
    ],
)
def test_the_strongest_signal_wins(text, cls):
    assert ec.classify(None, text) == cls


@pytest.mark.parametrize(
    ("code", "text", "cls"),
    [
        # Claude Code's vague server_error yields to a network message without a 5xx
        ("server_error", "API Error: Connection error.", "timeout"),
        ("server_error", "API Error: Request timed out.", "timeout"),
        ("server_error", "API Error: read ECONNRESET", "timeout"),
        ("server_error", "API Error: 504 Gateway Timeout", "provider_unavailable"),
        ("server_error", "API Error: 529 Overloaded", "provider_unavailable"),
        # exact codes are not overruled
        ("rate_limit", "API Error: Request timed out.", "rate_limit"),
        ("authentication_failed", "network unreachable", "auth"),
    ],
)
def test_a_vague_code_yields_to_a_network_message(code, text, cls):
    assert ec.classify(code, text) == cls


@pytest.mark.parametrize(
    ("message", "cls"),
    [
        ("claude exited with code 130", "cancelled"),
        ("codex exited with code 143", "cancelled"),
        ("goose exited with code -2", "cancelled"),
        ("opencode exited with code -15", "cancelled"),
        ("goose exited with code 1", "agent_exit"),
        ("claude exited with code 137", "agent_exit"),  # SIGKILL: the OOM killer as often as a person
        ("gemini exited with code 145", "agent_exit"),
        ("goose exited with code 1300", "agent_exit"),
    ],
)
def test_signal_deaths_are_cancelled_not_agent_exits(message, cls):
    assert ec.classify(None, message) == cls


def test_terminal_reasons_name_their_class_or_nothing():
    assert ec.reason_class("aborted_tools") == "cancelled"
    assert ec.reason_class("aborted_streaming") == "cancelled"
    assert ec.reason_class("prompt_too_long") == "context_length"
    assert ec.reason_class("max_turns") == "max_turns"
    for nothing in ("completed", "api_error", "", None, 5, ["aborted_tools"]):
        assert ec.reason_class(nothing) is None


def test_a_timeout_or_interruption_is_the_network_and_a_user_interruption_is_cancelled():
    assert ec.classify(None, "Request timed out or interrupted. This could be due to a network timeout.") == "timeout"
    assert ec.classify(None, "[Request interrupted by user for tool use]") == "cancelled"
    assert ec.classify(None, "The operation was aborted due to timeout") == "timeout"


def _contract_rules() -> list[tuple[int, list[str], str]]:
    """docs/contract.md's table of message rules: (order, the classes it names, its source cell)."""
    text = (REPO / "docs" / "contract.md").read_text()
    start = text.index("| order | class | matches")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows.append((int(cells[0]), re.findall(r"`([a-z_]+)`", cells[1]), cells[-1]))
    return rows


def _deciding_rule(code: str | None, text: str) -> int | None:
    """The order (docs/contract.md) of the message rule that classifies a text; None: the CLI's code decides."""
    if code is not None and code in ec._BY_CODE:
        return None
    lowered = text[: ec.MAX_CLASSIFIED_CHARS].lower()
    if ec._EXIT.match(lowered):
        return 1
    for i, (_, pattern, also) in enumerate(ec._RULES):
        if pattern.search(lowered) is not None and (also is None or also.search(lowered) is not None):
            return i + 2
    return len(ec._RULES) + 2


def test_the_contracts_rule_order_is_the_codes_and_every_rule_names_its_source():
    # the order is part of the contract: the table an on-call engineer reads is the order the code tries
    rows = _contract_rules()
    assert [order for order, _, _ in rows] == list(range(1, len(ec._RULES) + 3))
    assert [classes for _, classes, _ in rows] == [
        ["cancelled", "agent_exit"], *([cls] for cls, _, _ in ec._RULES), ["other"]]
    for order, classes, source in rows[:-1]:  # the last row is the fallback: no text to cite
        assert source.strip("— ").strip(), f"rule {order} ({classes}) names no source"


def test_every_message_rule_decides_at_least_one_real_text():
    # a rule no real text reaches is either dead or unsourced; the exit rule (1) is the normalizer's own text
    decided = Counter(_deciding_rule(e["code"], e["text"]) for e in CORPUS)
    unused = [order for order in range(2, len(ec._RULES) + 3) if decided[order] == 0]
    assert not unused, f"rules {unused} of docs/contract.md classify no text of the corpus"
