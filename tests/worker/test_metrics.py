"""services.metrics: bounded labels, tool label mapping, token accounting, HTTP endpoints."""

from __future__ import annotations

import math
import random
import string
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from contracts.events import ERROR_CLASSES
from services.metrics import (
    DEAD_LETTER_REASONS,
    EVENT_TYPES,
    FORMAT_LABELS,
    RAW_OUTCOMES,
    RUN_STATES,
    TOKEN_KINDS,
    TOOL_LABELS,
    TOOL_OUTCOMES,
    Metrics,
    serve,
    tool_label,
)


def value(m: Metrics, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels` (others summed over)."""
    total = 0.0
    for fam in m.registry.collect():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def label_values(m: Metrics, metric_name: str, label: str) -> set[str]:
    out = set()
    for fam in m.registry.collect():
        for s in fam.samples:
            if s.name.startswith(metric_name) and label in s.labels:
                out.add(s.labels[label])
    return out


def rand_text(rng: random.Random, n: int = 20) -> str:
    return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, n)))


# --- label boundedness ---------------------------------------------------------------------


def test_labels_stay_bounded_under_random_input():
    rng = random.Random(1234)
    m = Metrics()
    types = list(EVENT_TYPES) + ["bogus", "", "AGENT"]
    for i in range(3000):
        tool = rng.choice(
            [
                rand_text(rng),
                f"{rand_text(rng, 8)}__{rand_text(rng, 8)}",
                f"ext{i}__shell",
                f"developer__{rng.choice(['Shell', 'TEXT_EDITOR', 'read', 'nope'])}",
                f"/home/u/run-{i}/file.py",
                f"rm -rf /tmp/{i}",
                None,
                42,
            ]
        )
        ev = {
            "eventId": f"laptop-{i}/20261129_{i}:{i}",
            "runId": f"laptop-{i}/20261129_{i}",
            "type": rng.choice(types),
            "tool": tool,
            "path": f"/home/u/{rand_text(rng)}",
            "command": f"cat {rand_text(rng)}",
            "isSuccess": rng.choice([True, False, None, "yes"]),
            "errorClass": rng.choice([*ERROR_CLASSES, rand_text(rng), None, 7]),
            "code": rng.choice(["api_retry", "retry", None, rand_text(rng)]),
        }
        if rng.random() < 0.3:
            del ev["tool"]
        m.events([ev])
        m.raw(rng.choice(list(RAW_OUTCOMES) + [f"run-{i}"]), reason=rng.choice(list(DEAD_LETTER_REASONS) + [f"/p/{i}", None]))
        m.run_record({"runId": f"run-{i}", "state": rng.choice(list(RUN_STATES) + [f"weird-{i}"])})
        m.set_backlog(rng.choice([0, 1, 2, 3, 10_000 + i, -1]), rng.choice([None, 5]), 3)

    assert label_values(m, "goose_ingest_events", "type") <= set(EVENT_TYPES) | {"other"}
    assert label_values(m, "goose_ingest_errors", "class") <= set(ERROR_CLASSES)
    assert label_values(m, "goose_ingest_error_retries", "class") <= set(ERROR_CLASSES)
    assert label_values(m, "goose_ingest_tool_events", "tool") <= set(TOOL_LABELS)
    assert label_values(m, "goose_ingest_tool_events", "outcome") <= set(TOOL_OUTCOMES)
    assert label_values(m, "goose_ingest_raw_entries", "outcome") <= set(RAW_OUTCOMES) | {"other"}
    assert label_values(m, "goose_ingest_raw_entries", "reason") <= set(DEAD_LETTER_REASONS) | {"other", ""}
    assert label_values(m, "goose_ingest_dead_letters", "reason") <= set(DEAD_LETTER_REASONS) | {"other"}
    assert label_values(m, "goose_ingest_runs", "state") <= set(RUN_STATES) | {"other"}
    assert label_values(m, "goose_ingest_consumer_lag", "shard") <= {"0", "1", "2", "3", "other"}
    # nothing that looks like a run id, path or command leaked anywhere
    for fam in m.registry.collect():
        for s in fam.samples:
            for v in s.labels.values():
                assert "/" not in v and " " not in v and "run-" not in v, (s.name, s.labels)


def test_all_event_types_and_bounded_series_preinitialised():
    m = Metrics()
    for t in EVENT_TYPES:
        for fmt in FORMAT_LABELS:
            assert m.registry.get_sample_value("goose_ingest_events_total", {"type": t, "format": fmt}) == 0.0
    for r in DEAD_LETTER_REASONS:
        assert m.registry.get_sample_value("goose_ingest_dead_letters_total", {"reason": r}) == 0.0
        assert m.registry.get_sample_value("goose_ingest_raw_entries_total", {"outcome": "dead_lettered", "reason": r}) == 0.0
    for s in RUN_STATES:
        for fmt in FORMAT_LABELS:
            assert m.registry.get_sample_value("goose_ingest_runs_total", {"state": s, "format": fmt}) == 0.0
    for k in TOKEN_KINDS:
        assert m.registry.get_sample_value("goose_ingest_tokens_total", {"kind": k}) == 0.0
    assert m.registry.get_sample_value("goose_ingest_worker_ready") == 0.0


def test_separate_instances_do_not_share_numbers():
    a, b = Metrics(), Metrics()
    a.events([{"type": "error", "message": "x"}])
    assert value(a, "goose_ingest_events_total", type="error") == 1
    assert value(b, "goose_ingest_events_total", type="error") == 0
    reg = CollectorRegistry()
    assert Metrics(reg).registry is reg


# --- tool labels ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,label",
    [
        ("developer__shell", "shell"),
        ("shell", "shell"),
        ("SHELL", "shell"),
        ("developer__Text_Editor", "text_editor"),
        ("text_editor", "text_editor"),
        ("read", "read"),
        ("read_image", "read_image"),
        ("write", "write"),
        ("edit", "edit"),
        ("grep", "grep"),
        ("glob", "glob"),
        ("list", "list"),
        ("tree", "tree"),
        ("load_skill", "load_skill"),
        ("skills__load_skill", "load_skill"),
        ("skill", "skill"),
        ("github__create_issue", "mcp"),
        ("a__b__shell", "mcp"),  # base name is "b__shell": not a contract name
        ("__shell", "shell"),
        ("my_custom_tool", "other"),
        ("", "other"),
        ("/etc/passwd", "other"),
        (None, "other"),
        (3, "other"),
    ],
)
def test_tool_label_mapping(name, label):
    assert tool_label(name) == label


def test_tool_events_counted_by_tool_and_outcome():
    m = Metrics()
    m.events(
        [
            {"type": "command", "tool": "developer__shell", "command": "npm test", "isSuccess": False, "exitCode": 1},
            {"type": "read", "tool": "developer__text_editor", "path": "/a", "isSuccess": True},
            {"type": "read", "tool": "developer__text_editor", "path": "/b"},
            {"type": "unknown", "tool": "github__create_issue", "raw": {}},
            {"type": "unknown", "raw": {"type": "notification"}},  # not a tool event
            {"type": "agent", "message": "hi"},
            {"type": "error", "message": "boom"},
        ]
    )
    assert value(m, "goose_ingest_tool_events_total", tool="shell", outcome="failure") == 1
    assert value(m, "goose_ingest_tool_events_total", tool="text_editor", outcome="success") == 1
    assert value(m, "goose_ingest_tool_events_total", tool="text_editor", outcome="unknown") == 1
    assert value(m, "goose_ingest_tool_events_total", tool="mcp", outcome="unknown") == 1
    total_tool = sum(
        value(m, "goose_ingest_tool_events_total", tool=t, outcome=o) for t in TOOL_LABELS for o in TOOL_OUTCOMES
    )
    assert total_tool == 4
    assert value(m, "goose_ingest_events_total", type="unknown") == 2
    assert value(m, "goose_ingest_events_total", type="read") == 2
    assert value(m, "goose_ingest_events_total", type="error") == 1


# --- raw outcomes, dead letters ------------------------------------------------------------


def test_raw_outcomes_and_dead_letters():
    m = Metrics()
    m.raw("processed", 10)
    m.raw("duplicate")
    m.raw("processed", reason="oversize")  # reason ignored unless dead_lettered
    m.raw("dead_lettered", 2, reason="oversize")
    m.raw("dead_lettered", reason="no-such-reason")
    m.raw("dead_lettered")
    m.raw("processed", 0)
    m.raw("processed", -5)  # never decreases a counter, never raises
    assert value(m, "goose_ingest_raw_entries_total", outcome="processed", reason="") == 11
    assert value(m, "goose_ingest_raw_entries_total", outcome="duplicate", reason="") == 1
    assert value(m, "goose_ingest_raw_entries_total", outcome="dead_lettered", reason="oversize") == 2
    assert value(m, "goose_ingest_raw_entries_total", outcome="dead_lettered", reason="other") == 2
    assert value(m, "goose_ingest_dead_letters_total", reason="oversize") == 2
    assert value(m, "goose_ingest_dead_letters_total", reason="other") == 2


# --- runs, tokens, cost --------------------------------------------------------------------


def test_tokens_and_cost_only_from_terminal_records():
    m = Metrics()
    usage = {
        "inputTokens": 100,
        "outputTokens": 20,
        "totalTokens": 120,
        "cacheReadInputTokens": 7,
        "cacheWriteInputTokens": 3,
        "costUsd": 0.25,
    }
    m.run_record({"runId": "r1", "state": "started"})
    m.run_record({"runId": "r1", "state": "completed", **usage})
    m.run_record({"runId": "r1", "state": "completed", **usage})  # a later complete supersedes
    for k in TOKEN_KINDS:
        assert value(m, "goose_ingest_tokens_total", kind=k) == 0
    assert value(m, "goose_ingest_cost_usd_total") == 0

    m.run_record({"runId": "r1", "state": "ended", "exitCode": 0, **usage})
    m.run_record({"runId": "r2", "state": "abandoned", "inputTokens": 5, "costUsd": 0.5})
    m.run_record({"runId": "r3", "state": "ended"})  # no usage at all
    m.run_record({"runId": "r4", "state": "ended", "inputTokens": -3, "outputTokens": True, "costUsd": float("nan")})
    assert value(m, "goose_ingest_tokens_total", kind="input") == 105
    assert value(m, "goose_ingest_tokens_total", kind="output") == 20
    assert value(m, "goose_ingest_tokens_total", kind="total") == 120
    assert value(m, "goose_ingest_tokens_total", kind="cache_read") == 7
    assert value(m, "goose_ingest_tokens_total", kind="cache_write") == 3
    assert value(m, "goose_ingest_cost_usd_total") == pytest.approx(0.75)
    assert value(m, "goose_ingest_runs_total", state="started") == 1
    assert value(m, "goose_ingest_runs_total", state="completed") == 2
    assert value(m, "goose_ingest_runs_total", state="ended") == 3
    assert value(m, "goose_ingest_runs_total", state="abandoned") == 1


def test_redaction_rules_bounded_by_known_rules():
    m = Metrics()
    m.redactions("aws-key", 2)  # no configured set: accepted
    assert value(m, "goose_ingest_redactions_total", rule="aws-key") == 2
    m.known_rules = {"aws-key", "github-token"}
    assert m.registry.get_sample_value("goose_ingest_redactions_total", {"rule": "github-token"}) == 0.0
    m.redactions("github-token")
    m.redactions("sk-live-1234567890")
    assert value(m, "goose_ingest_redactions_total", rule="github-token") == 1
    assert value(m, "goose_ingest_redactions_total", rule="other") == 1


# --- histograms and gauges -----------------------------------------------------------------


def test_histograms_and_gauges():
    m = Metrics()
    m.observe_batch(0.02, 500)
    m.observe_latency(0.004)
    m.observe_latency(-1)  # clock skew: clamped
    m.observe_latency(45)
    assert value(m, "goose_ingest_batch_seconds_count") == 1
    assert value(m, "goose_ingest_batch_entries_sum") == 500
    assert value(m, "goose_ingest_event_latency_seconds_bucket", le="0.001") == 1
    assert value(m, "goose_ingest_event_latency_seconds_bucket", le="30.0") == 2
    assert value(m, "goose_ingest_event_latency_seconds_bucket", le="+Inf") == 3
    m.shards = 4
    m.set_backlog(2, 1500, 40)
    assert value(m, "goose_ingest_consumer_lag", shard="2") == 1500
    assert value(m, "goose_ingest_pending_entries", shard="2") == 40
    m.set_backlog(2, None, 0)
    assert math.isnan(m.registry.get_sample_value("goose_ingest_consumer_lag", {"shard": "2"}))
    m.set_backlog(7, 1, 1)
    assert value(m, "goose_ingest_consumer_lag", shard="other") == 1
    m.set_ready(True)
    assert value(m, "goose_ingest_worker_ready") == 1
    m.set_ready(False)
    assert value(m, "goose_ingest_worker_ready") == 0


# --- HTTP ----------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_server_endpoints_over_http():
    m = Metrics()
    m.events([{"type": "error", "message": "x"}, {"type": "command", "tool": "developer__shell", "command": "ls -la /x", "isSuccess": True}])
    state = {"ready": False}
    server = serve(m, "127.0.0.1", 0, lambda: state["ready"])
    try:
        assert server.port > 0
        base = f"http://127.0.0.1:{server.port}"

        code, ctype, body = get(base + "/healthz")
        assert code == 200 and body.strip() == "ok"

        code, _, _ = get(base + "/readyz")
        assert code == 503
        state["ready"] = True
        code, _, body = get(base + "/readyz")
        assert code == 200

        code, ctype, body = get(base + "/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        assert "goose_ingest_events" in fams
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fams["goose_ingest_events"].samples}
        assert samples[("goose_ingest_events_total", (("format", "undecided"), ("type", "error")))] == 1
        assert 'goose_ingest_tool_events_total{outcome="success",tool="shell"} 1.0' in body

        assert get(base + "/nope")[0] == 404
    finally:
        server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=2)


def test_readyz_callback_exception_is_not_ready():
    def boom() -> bool:
        raise RuntimeError("redis gone")

    with serve(Metrics(), "127.0.0.1", 0, boom) as server:
        assert get(f"http://127.0.0.1:{server.port}/readyz")[0] == 503
        assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200


def test_events_and_run_records_are_counted_by_their_runs_format_with_a_bounded_label():
    m = Metrics()
    m.events([{"type": "error", "message": "x"}], "codex")
    m.events([{"type": "error", "message": "x"}, {"type": "read", "path": "/a"}], "claude-code")
    m.events([{"type": "error", "message": "x"}], "not-a-format")
    m.events([{"type": "error", "message": "x"}])
    assert value(m, "goose_ingest_events_total", type="error", format="codex") == 1
    assert value(m, "goose_ingest_events_total", type="error", format="claude-code") == 1
    assert value(m, "goose_ingest_events_total", type="read", format="claude-code") == 1
    assert value(m, "goose_ingest_events_total", type="error", format="other") == 1
    assert value(m, "goose_ingest_events_total", type="error", format="undecided") == 1
    m.run_record({"state": "ended", "format": "codex"})
    m.run_record({"state": "ended", "format": "x" * 500})
    m.run_record({"state": "started"})
    assert value(m, "goose_ingest_runs_total", state="ended", format="codex") == 1
    assert value(m, "goose_ingest_runs_total", state="ended", format="other") == 1
    assert value(m, "goose_ingest_runs_total", state="started", format="undecided") == 1
    assert label_values(m, "goose_ingest_events_total", "format") <= {*FORMAT_LABELS, "other"}


def test_errors_and_retry_warnings_counted_by_class_and_format():
    m = Metrics()
    for cls in ERROR_CLASSES:  # pre-initialised: rate() sees the first error of a class
        assert value(m, "goose_ingest_errors_total", **{"class": cls, "format": "goose"}) == 0
        assert value(m, "goose_ingest_error_retries_total", **{"class": cls, "format": "codex"}) == 0
    m.events([{"type": "error", "message": "x", "errorClass": "rate_limit"},
              {"type": "error", "message": "y", "errorClass": "rate_limit"},
              {"type": "error", "message": "published before 1.1"},
              {"type": "error", "message": "z", "errorClass": "/home/u/leak"},
              {"type": "warning", "message": "retry", "code": "api_retry", "errorClass": "provider_unavailable"},
              {"type": "warning", "message": "stderr line"}], "claude-code")
    assert value(m, "goose_ingest_errors_total", **{"class": "rate_limit", "format": "claude-code"}) == 2
    assert value(m, "goose_ingest_errors_total", **{"class": "other", "format": "claude-code"}) == 2
    assert value(m, "goose_ingest_error_retries_total", **{"class": "provider_unavailable", "format": "claude-code"}) == 1
    assert sum(value(m, "goose_ingest_error_retries_total", **{"class": c, "format": "claude-code"}) for c in ERROR_CLASSES) == 1
    m.events([{"type": "error", "message": "x", "errorClass": "auth"}], "not-a-format")
    assert value(m, "goose_ingest_errors_total", **{"class": "auth", "format": "other"}) == 1
