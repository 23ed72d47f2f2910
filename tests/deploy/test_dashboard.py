"""deploy/grafana/dashboard.json references only metrics a worker exports or rules.yml records."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from contracts.events import ERROR_CLASSES
from services.metrics import Metrics
from tests.support.needs import missing

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"

# a metric name that mentions goose_ingest_, including recorded names like job:goose_ingest_events:rate5m
NAME = re.compile(r"(?<![A-Za-z0-9_:])(?:[a-z_]+:)?goose_ingest_[a-z_]+(?::[a-z0-9_]+)?")

REQUIRED_SUBJECTS = {
    # what the brief asks the dashboard to show -> a metric that must be queried for it
    "rates by event type": "job_type:goose_ingest_events:rate5m",
    "error ratio": "job:goose_ingest_error_ratio:rate5m",
    "unknown ratio": "job:goose_ingest_unknown_ratio:rate5m",
    "tool events by tool and outcome": "job_tool_outcome:goose_ingest_tool_events:rate5m",
    "latency quantiles": "goose_ingest_event_latency_seconds_bucket",
    "lag by shard": "goose_ingest_consumer_lag",
    "pending by shard": "goose_ingest_pending_entries",
    "dead letters by reason": "goose_ingest_dead_letters_total",
    "tokens by kind": "goose_ingest_tokens_total",
    "cost": "goose_ingest_cost_usd_total",
    "runs by state": "goose_ingest_runs_total",
}


def exported_names() -> set[str]:
    """Every series name a Metrics() exports, with the suffixes of its type.

    Derived from the family type as well as from the samples, so a labelled family that has no
    child yet (e.g. redactions before the first one) still counts as exported.
    """
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}
    names: set[str] = set()
    for fam in Metrics().registry.collect():
        names.add(fam.name)
        names.update(fam.name + sfx for sfx in suffixes.get(fam.type, ()))
        names.update(s.name for s in fam.samples)
    return names


def recorded_rules() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def all_panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def panel_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p.get("title", ""), t["expr"]) for p in all_panels(dash["panels"]) for t in p.get("targets", []) if "expr" in t]


def resolve(name: str, rules: dict[str, str], exported: set[str], seen: tuple[str, ...] = ()) -> list[str]:
    """Problems with `name`: not exported, or a recording rule built on something not exported."""
    if name in exported:
        return []
    if name in rules:
        if name in seen:
            return [f"recording rule cycle at {name}"]
        return [p for ref in NAME.findall(rules[name]) for p in resolve(ref, rules, exported, seen + (name,))]
    return [f"{name} is neither exported by Metrics() nor recorded in rules.yml"]


def test_dashboard_basics():
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in all_panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in all_panels(dash["panels"]):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_every_queried_metric_exists():
    exported = exported_names()
    rules = recorded_rules()
    exprs = panel_exprs()
    assert exprs, "no panel queries found"
    problems = []
    for title, expr in exprs:
        names = NAME.findall(expr)
        assert names, f"panel {title!r} queries no goose_ingest metric: {expr}"
        for name in names:
            problems += [f"panel {title!r}: {p}" for p in resolve(name, rules, exported)]
    assert not problems, "\n".join(problems)


def test_dashboard_covers_the_required_subjects():
    queried = {n for _, e in panel_exprs() for n in NAME.findall(e)}
    missing = {subject: metric for subject, metric in REQUIRED_SUBJECTS.items() if metric not in queried}
    assert not missing


def test_resolver_rejects_unknown_names():
    exported = exported_names()
    assert resolve("goose_ingest_no_such_metric_total", recorded_rules(), exported)
    assert resolve("job:goose_ingest_nope:rate5m", recorded_rules(), exported)
    assert not resolve("job:goose_ingest_error_ratio:rate5m", recorded_rules(), exported)


def test_panel_queries_parse_as_promql(tmp_path):
    """Each query, with Grafana's variables substituted, must parse (via `promtool check rules`)."""
    tool = shutil.which("promtool")
    if not tool:
        missing("promtool", "apt-get install -y prometheus")
    rules = []
    for i, (_, expr) in enumerate(panel_exprs()):
        expr = expr.replace("$__rate_interval", "5m").replace("$__range", "6h").replace("$job", ".*").replace("$format", ".*")
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def _panels_by_title() -> dict[str, dict]:
    dash = json.loads(DASHBOARD.read_text())
    return {p.get("title", ""): p for p in all_panels(dash["panels"]) if p["type"] != "row"}


def test_one_panel_per_error_class_of_the_vocabulary():
    # a class panel selects exactly one class (class="x"), errors and retries of it
    by_class: dict[str, list[str]] = {}
    for title, panel in _panels_by_title().items():
        exprs = [t["expr"] for t in panel.get("targets", [])]
        classes = {c for e in exprs for c in re.findall(r'\bclass="(\w+)"', e)}
        if len(classes) == 1:
            (cls,) = classes
            by_class.setdefault(cls, []).append(title)
            assert any("goose_ingest_errors" in e for e in exprs), title
            assert any("goose_ingest_error_retries" in e for e in exprs), title
    assert set(by_class) == set(ERROR_CLASSES), sorted(set(ERROR_CLASSES) ^ set(by_class))
    assert all(len(titles) == 1 for titles in by_class.values()), by_class


def _alert_expr(name: str) -> str:
    doc = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name]
    return rule["expr"]


def test_the_what_is_failing_now_row_shows_runs_and_hosts_per_class_and_the_top_failing_tools():
    """The row reads the numbers the class and tool alerts read (distinct runs and hosts, bounded
    series), beside the thresholds the workers export: what the on-call sees is what pages."""
    dash = json.loads(DASHBOARD.read_text())
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    assert rows[1]["title"] == "What is failing now", "the row comes right after the overview"
    panels = _panels_by_title()
    runs = [t["expr"] for t in panels["Runs failing now, by error class"]["targets"]]
    hosts = [t["expr"] for t in panels["Hosts failing now, by error class"]["targets"]]
    assert any("job_class:goose_ingest_error_runs:max" in e and "by (class)" in e for e in runs), runs
    assert any("job:goose_ingest_alert_min_runs:max" in e for e in runs), runs
    assert any("job_class:goose_ingest_error_hosts:max" in e and "by (class)" in e for e in hosts), hosts
    assert any("job:goose_ingest_alert_min_hosts:max" in e for e in hosts), hosts
    # the class alerts read the same recorded series, through the rule that applies both thresholds
    paging = recorded_rules()["job_class:goose_ingest_error_hosts:paging"]
    assert "job_class:goose_ingest_error_runs:max" in paging and "job_class:goose_ingest_error_hosts:max" in paging
    assert "job_class:goose_ingest_error_hosts:paging" in _alert_expr("GooseIngestAuthErrors")
    table = panels["Top failing tools now (runs, hosts)"]
    assert table["type"] == "table"
    exprs = [t["expr"] for t in table["targets"]]
    assert re.match(r"\s*topk\(\d+, max by \(tool\) \(job_tool:goose_ingest_tool_failing_runs:max", exprs[0]), exprs
    assert all("by (tool)" in e for e in exprs)
    # the same series GooseIngestToolFailing compares: a tool the table ranks first is the one it names
    alert = _alert_expr("GooseIngestToolFailing")
    for name in ("job_tool:goose_ingest_tool_failing_runs:max", "job_tool:goose_ingest_tool_failing_hosts:max",
                 "job_tool:goose_ingest_tool_calling_hosts:max"):
        assert name in alert and any(name in e for e in exprs), name
    assert all(t.get("instant") and t.get("format") == "table" for t in table["targets"])


def test_the_tool_failure_ratio_table_keeps_a_minimum_calls_floor():
    tables = [p for p in _panels_by_title().values() if p["type"] == "table"
              and any("job_tool:goose_ingest_tool_failure_ratio:rate15m" in t["expr"] for t in p["targets"])]
    assert len(tables) == 1, "no tool failure ratio table"
    (expr,) = [t["expr"] for t in tables[0]["targets"]]
    assert re.match(r"\s*topk\(\d+,", expr), expr
    m = re.search(r"job_tool:goose_ingest_tool_calls:increase15m\{[^}]*\}\)\s*>=\s*(\d+)", expr)
    assert m and int(m.group(1)) >= 10, f"a tool called twice that failed once would top the table: {expr}"
    assert "by (tool)" in expr


def test_the_open_runs_panel_shows_the_active_runs_gauge():
    panel = _panels_by_title().get("Open runs")
    assert panel is not None, "no 'Open runs' panel"
    assert any(NAME.findall(t["expr"]) == ["goose_ingest_active_runs"] for t in panel["targets"]), panel["targets"]
