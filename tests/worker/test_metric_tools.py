"""GOOSE_INGEST_METRIC_TOOLS: the extension/MCP tools an operator names keep their own `tool` label
(so GooseIngestToolFailing can name them), every other extension tool stays `mcp`, the list is
capped, and a bad list stops the command with one line and exit 2 (docs/operations.md,
"GooseIngestToolFailing")."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from contracts.keys import shard_of
from services.metrics import METRIC_TOOLS_MAX, Metrics, metric_tools_problem, tool_label
from services.metrics.registry import METRIC_TOOL_NAME
from services.settings import Settings
from tests.support.normalizer import req, resp
from tests.support.pipeline import REPO, ended_runs, start_worker, stop, wait_until
from tests.support.redis_server import cli_env
from tests.worker.test_metrics import value
from tests.worker.test_worker_resilience import _metrics_port

NAMED = "github__create_issue"


def _tool_event(tool: str, ok: bool) -> dict:
    return {"type": "unknown", "tool": tool, "isSuccess": ok, "raw": {}}


def test_a_named_tool_keeps_its_label_and_the_other_extension_tools_stay_mcp():
    m = Metrics(tools=[NAMED, "mcp__github__search_issues"])
    m.events([_tool_event(NAMED, False), _tool_event(NAMED, False), _tool_event(NAMED, True),
              _tool_event("mcp__github__search_issues", False), _tool_event("github__list_issues", False),
              _tool_event("developer__shell", True), _tool_event("Github__create_issue", True)])
    assert value(m, "goose_ingest_tool_events_total", tool=NAMED, outcome="failure") == 2
    assert value(m, "goose_ingest_tool_events_total", tool=NAMED, outcome="success") == 1
    assert value(m, "goose_ingest_tool_events_total", tool="mcp__github__search_issues", outcome="failure") == 1
    # not listed (another tool of the same server, a different case): mcp, as without the setting
    assert value(m, "goose_ingest_tool_events_total", tool="mcp", outcome="failure") == 1
    assert value(m, "goose_ingest_tool_events_total", tool="mcp", outcome="success") == 1
    assert value(m, "goose_ingest_tool_events_total", tool="shell", outcome="success") == 1


def test_without_the_setting_every_extension_tool_is_mcp_and_the_named_series_exist_from_the_start():
    plain = Metrics()
    plain.events([_tool_event(NAMED, False)])
    assert value(plain, "goose_ingest_tool_events_total", tool="mcp", outcome="failure") == 1
    assert value(plain, "goose_ingest_tool_events_total", tool=NAMED) == 0
    assert tool_label(NAMED) == "mcp" and tool_label(NAMED, frozenset({NAMED})) == NAMED
    # a contract tool keeps its base label even if a caller passes it: the base name wins
    assert tool_label("developer__shell", frozenset({"developer__shell"})) == "shell"
    named = Metrics(tools=[NAMED])
    body = "\n".join(f"{s.name} {s.labels}" for fam in named.registry.collect() for s in fam.samples)
    # preinitialised at 0, like the fixed labels: rate() sees the first failure as an increase
    assert sum(1 for fam in named.registry.collect() for s in fam.samples
               if s.name == "goose_ingest_tool_events_total" and s.labels["tool"] == NAMED) == 3, body


def test_the_list_is_capped_and_each_name_must_be_a_plain_tool_name():
    at_cap = [f"server__tool{i}" for i in range(METRIC_TOOLS_MAX)]
    assert metric_tools_problem(at_cap) is None
    Metrics(tools=at_cap)
    over = [*at_cap, "server__one_more"]
    assert metric_tools_problem(over) == f"{METRIC_TOOLS_MAX + 1} tools, at most {METRIC_TOOLS_MAX} (each one adds series to every worker)"
    with pytest.raises(ValueError, match="at most"):
        Metrics(tools=over)
    for bad, why in [("has space", "not a tool name"), ("", "not a tool name"), ("x" * 65, "not a tool name"),
                     ('quote"d', "not a tool name"), ("_leading", "not a tool name"), ("mcp", "a label of its own"),
                     ("other", "a label of its own"), ("developer__shell", "the contract tool 'shell'"),
                     ("read", "the contract tool 'read'")]:
        problem = metric_tools_problem(["fine__tool", bad])
        assert problem is not None and problem.startswith("entry 2: ") and why in problem, (bad, problem)


def _worker_cli(settings: Settings, value: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(settings, GOOSE_INGEST_METRIC_TOOLS=value)
    return subprocess.run([sys.executable, "-m", "services.cli", "worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("bad, says", [
    ('["has space"]', "entry 1: not a tool name"),
    (json.dumps([f"s__t{i}" for i in range(METRIC_TOOLS_MAX + 1)]), f"at most {METRIC_TOOLS_MAX}"),
    ('["developer__shell"]', "labelled 'shell' already"),
    ('github__create_issue', "not valid JSON"),
])
def test_a_bad_list_stops_the_worker_with_one_line_and_exit_2(settings, bad, says):
    p = _worker_cli(settings, bad)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "GOOSE_INGEST_METRIC_TOOLS" in lines[0] and says in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_a_name_that_looks_like_a_credential_is_refused_without_quoting_it(settings):
    token = "ghp_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"
    p = _worker_cli(settings, json.dumps(["github__create_issue", token]))
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "entry 2 looks like a credential" in lines[0], p.stderr
    assert token not in p.stderr and token[:12] not in p.stderr


@pytest.mark.e2e
def test_a_real_worker_labels_the_named_tool_in_its_metrics(settings, tmp_path):
    """The setting reaches the worker's /metrics: a goose run calling the named MCP tool and another
    MCP tool, through a real worker process on a real Redis. (A goose MCP call the normalizer does
    not map is an `unknown` event without `isSuccess`: outcome `unknown`.)"""
    log = tmp_path / "w.log"
    worker = start_worker(settings, log, GOOSE_INGEST_METRIC_TOOLS=json.dumps([NAMED]))
    run = "metric-tools/1"
    try:
        port = _metrics_port(log)
        r = redis.Redis.from_url(settings.redis_url)
        stream = settings.layout.raw_stream(shard_of(run, settings.shards))
        lines = [req("c1", NAMED, {"title": "x"}), resp("c1", status="error"),
                 req("c2", "github__list_issues", {}, mid="msg_02req"), resp("c2", status="error")]
        for seq, line in enumerate(lines):
            r.xadd(stream, {"run": run, "seq": seq, "ts": 1_790_000_000_000 + seq, "line": line})
        r.xadd(stream, {"run": run, "seq": len(lines), "ts": 1_790_000_000_100, "kind": "eof", "exit": 0})
        wait_until(lambda: run in ended_runs(settings), timeout=60)

        def tool_samples() -> dict[tuple[str, str], float]:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return {(s.labels["tool"], s.labels["outcome"]): s.value
                    for fam in text_string_to_metric_families(body) for s in fam.samples
                    if s.name == "goose_ingest_tool_events_total"}

        samples = wait_until(lambda: (got := tool_samples()).get((NAMED, "unknown")) and got, timeout=30)
    finally:
        stop(worker)
    assert worker.returncode == 0, log.read_text()[-2000:]
    assert samples[(NAMED, "unknown")] == 1
    assert samples[("mcp", "unknown")] == 1
    assert not any(tool == "github__list_issues" for tool, _ in samples)


def test_the_helm_schema_holds_the_same_cap_and_name_pattern():
    schema = json.loads((REPO / "helm" / "goose-ingest" / "values.schema.json").read_text())
    node = schema["properties"]["settings"]["properties"]["metric_tools"]
    assert node["maxItems"] == METRIC_TOOLS_MAX
    assert node["items"]["pattern"] == f"^{METRIC_TOOL_NAME.pattern}$"
