"""Tokens in tool names, MCP server names, goose extension names and envelope labels (issue 22):
the normalizers build `<extension>__<tool>` and `mcp__<server>__<tool>`, so a token glued into
such a name must be gone from every published event, run record, OTLP span name and attribute
and metric label, and the redacted name must still classify and count as the clean name does."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import generate_latest

from services.export.otlp.mapping import MappingConfig, Tally, fold_records, is_tool_span, root_span, tool_span
from services.metrics.registry import TOOL_LABELS, Metrics, tool_label
from services.redaction import Redactor
from services.sequencer import Entry, RunSequencer
from tests.support.normalizer import c_answer, c_call, req, resp, x_item

RUN = "laptop/20261203_1"
# One token per family that the word-boundary rules let through (test values, not real keys).
TOKENS = {
    "github-token": "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",  # its CRC32 holds: glued to a letter too
    "anthropic-key": "sk-ant-api03-Zq7x9Lw3VbA1b2C3d4E5f6G7h8I9j0",
    "slack-token": "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUv",
    "gcp-api-key": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "aws-access-key-id": "AKIAIOSFODNN7EXAMPLE",
}
CLEAN = "acme"
# Families whose alphabet has `_`: the token takes a following `__<tool>` with it (cutting it at
# `__` would leak the tail of a token that holds `__` itself), so the name counts as `other`.
TAKES_THE_REST = {"anthropic-key"}


def _goose_extension(t: str) -> list[str]:  # the extension is the token: `<token>__shell`
    return [req("c1", f"{t}__shell", {"command": "ls -la"}), resp("c1")]


def _goose_tool(t: str) -> list[str]:  # the example: `acme__<token>`
    return [req("c1", f"acme__{t}", {"q": "x"}), resp("c1")]


def _claude_server(t: str) -> list[str]:  # `mcp__<server>__<tool>` with the token in the server
    return [c_call("toolu_1", f"mcp__srv{t}__search", {"q": "x"}), c_answer("toolu_1")]


def _codex_server_and_tool(t: str) -> list[str]:
    item = {"server": f"srv_{t}", "tool": f"{t}__read", "arguments": {"path": "/r.md"}}
    return [x_item("item.started", "i1", "mcp_tool_call", **item),
            x_item("item.completed", "i1", "mcp_tool_call", status="completed", **item)]


# shape -> (lines, the agent label's name, which also picks the format)
SHAPES = {"goose-extension": (_goose_extension, "goose"), "goose-tool": (_goose_tool, "goose"),
          "claude-mcp-server": (_claude_server, "claude-code"), "codex-mcp-server-and-tool": (_codex_server_and_tool, "codex")}


def _run(lines: list[str], host: str | None, agent: str | None) -> tuple[list[dict], list[dict], dict[str, int]]:
    sequencer = RunSequencer(RUN, redactor=Redactor())
    events: list[dict] = []
    records: list[dict] = []
    redactions: dict[str, int] = {}
    entries = [Entry(RUN, i, 1_000 + i, "line", "stdout", line, None, host, agent, f"{i}-0") for i, line in enumerate(lines)]
    entries.append(Entry(RUN, len(lines), 9_000, "eof", "stdout", "", 0, host, agent, f"{len(lines)}-0"))
    for entry in entries:
        out = sequencer.accept(entry)
        events += out.events
        records += out.records
        for rule, n in out.redactions.items():
            redactions[rule] = redactions.get(rule, 0) + n
    return events, records, redactions


def _metric_text(events: list[dict]) -> str:
    metrics = Metrics()
    metrics.events(events, events[0].get("format") if events else None)
    return generate_latest(metrics.registry).decode()


def _samples(text: str) -> list[str]:
    """The exposition's samples without their creation times."""
    return [line for line in text.splitlines() if not line.startswith("#") and "_created" not in line.split(" ")[0]]


def _tool_labels(events: list[dict]) -> list[str]:
    return [tool_label(e.get("tool")) for e in events if "tool" in e]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("rule", sorted(TOKENS))
def test_a_token_in_a_tool_name_is_in_no_event_record_span_or_metric(shape, rule):
    token = TOKENS[rule]
    lines, name = SHAPES[shape]
    events, records, redactions = _run(lines(token), f"laptop_{token}", f"{name}/1.2.0_{token}")
    clean_events, _, _ = _run(lines(CLEAN), "laptop", f"{name}/1.2.0")

    # events and run records (host and agent labels included)
    published = orjson.dumps([events, records]).decode()
    assert token not in published
    tools = [e["tool"] for e in events if "tool" in e]
    assert tools and all(f"[REDACTED:{rule}]" in t for t in tools), tools
    assert records[-1]["host"] == f"laptop_[REDACTED:{rule}]"
    assert records[-1]["agent"] == f"{name}/1.2.0_[REDACTED:{rule}]"
    assert redactions.get(rule, 0) >= len(tools) + 2

    # classified as the same call with a clean name, and counted under the same bounded label
    assert [e["type"] for e in events] == [e["type"] for e in clean_events]
    assert set(_tool_labels(events)) <= set(TOOL_LABELS)
    text = _metric_text(events)
    assert token not in text
    if rule not in TAKES_THE_REST:
        assert _tool_labels(events) == _tool_labels(clean_events)
        assert _samples(text) == _samples(_metric_text(clean_events))
    assert any(line.startswith("goose_ingest_tool_events_total{") and not line.endswith(" 0.0") for line in _samples(text))

    # OTLP: tool span names and gen_ai.tool.name, the root span's name and attributes
    cfg, tally = MappingConfig(), Tally()
    spans = [tool_span(e, cfg, tally) for e in events if is_tool_span(e)]
    assert spans
    for span in spans:
        assert token not in span.name and f"[REDACTED:{rule}]" in span.name
        assert token not in orjson.dumps(dict(span.attributes or {})).decode()
    root = root_span(fold_records(RUN, records), [], cfg, tally)
    assert token not in root.name
    assert token not in orjson.dumps(dict(root.attributes or {})).decode()


def test_without_a_redactor_the_labels_are_published_as_given():
    sequencer = RunSequencer(RUN)
    out = sequencer.accept(Entry(RUN, 0, 1_000, "eof", "stdout", "", 0, "laptop_x", "goose/1", "0-0"))
    assert out.records[-1]["host"] == "laptop_x" and out.records[-1]["agent"] == "goose/1"
    assert not out.redactions


def test_clean_labels_are_left_alone_and_not_counted():
    events, records, redactions = _run(_goose_tool(CLEAN), "laptop-42.example.com", "goose/1.2.0")
    assert records[-1]["host"] == "laptop-42.example.com" and records[-1]["agent"] == "goose/1.2.0"
    assert not redactions
