"""deploy/prometheus/rules.yml: promtool check + unit tests, and the runbook contract of every alert.

promtool comes from Debian's `prometheus` package (`apt-get install -y prometheus`). Without it
the promtool tests skip locally but FAIL when the `CI` environment variable is set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "tests" / "rules_test.yml"
OPERATIONS = ROOT / "docs" / "operations.md"

EXPECTED_ALERTS = {
    "GooseIngestErrorSpike",
    "GooseIngestHighUnknownRatio",
    "GooseIngestDeadLetters",
    "GooseIngestLagGrowing",
    "GooseIngestStalled",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("promtool not found: CI must `apt-get install -y prometheus`")
    pytest.skip("promtool not installed (apt-get install -y prometheus)")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules():
    res = run("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


def test_promtool_unit_tests():
    res = run("test", "rules", str(RULES_TEST))
    assert res.returncode == 0, res.stdout + res.stderr


def load_rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def github_anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_every_alert_has_severity_annotations_and_an_existing_runbook_anchor():
    alerts = [r for r in load_rules() if "alert" in r]
    assert {a["alert"] for a in alerts} == EXPECTED_ALERTS
    anchors = {github_anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", OPERATIONS.read_text(), re.M)}
    for a in alerts:
        assert a["labels"]["severity"] in {"critical", "warning", "info"}, a["alert"]
        ann = a["annotations"]
        assert ann["summary"] and ann["description"], a["alert"]
        url = ann["runbook_url"]
        assert url.startswith("docs/operations.md#"), url
        assert url.split("#", 1)[1] in anchors, f"{a['alert']}: no heading for {url} in docs/operations.md"


def test_every_alert_has_a_firing_and_a_quiet_case():
    doc = yaml.safe_load(RULES_TEST.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for t in case.get("alert_rule_test", []):
            (fires if t["exp_alerts"] else quiet).add(t["alertname"])
    assert fires >= EXPECTED_ALERTS
    assert quiet >= EXPECTED_ALERTS
