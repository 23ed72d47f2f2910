"""deploy/prometheus/rules.yml: promtool check + unit tests, and the runbook contract of every alert.

promtool comes from Debian's `prometheus` package (`apt-get install -y prometheus`). Without it
the promtool tests skip locally but FAIL when the `CI` environment variable is set.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.needs import missing

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "tests" / "rules_test.yml"
# every promtool test file of the rules: rules_test.yml plus one per later group of alerts
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*_test.yml"))
OPERATIONS = ROOT / "docs" / "operations.md"

EXPECTED_ALERTS = {
    "GooseIngestErrorSpike",
    "GooseIngestHighUnknownRatio",
    "GooseIngestDeadLetters",
    "GooseIngestLagGrowing",
    "GooseIngestStalled",
    "GooseIngestNoWorkers",
    "GooseIngestComponentDown",
    "GooseIngestPendingEntryStuck",
    # error classes and per-tool failures (group goose-ingest.error-classes)
    "GooseIngestAuthErrors",
    "GooseIngestQuotaExhausted",
    "GooseIngestProviderUnavailable",
    "GooseIngestRateLimited",
    "GooseIngestTimeouts",
    "GooseIngestContextLengthErrors",
    "GooseIngestAgentExitSpike",
    "GooseIngestToolFailing",
    "GooseIngestTopicTrimmedUnread",
    # the exporters' group (goose-ingest.exporters)
    "GooseIngestExportLagGrowing",
    "GooseIngestExportFailing",
    "GooseIngestExportDeadLetters",
    "GooseIngestGatewayErrors",
    "GooseIngestGatewayRefusalsSpike",
    "GooseIngestGatewayTokenAtLimit",
    "GooseIngestRawShardDamaged",
    # the archive (goose-ingest.archive)
    "GooseIngestArchiveLagging",
    "GooseIngestArchiveWritesFailing",
    "GooseIngestBrokerLostEntries",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    missing("promtool", "apt-get install -y prometheus")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules():
    res = run("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


def test_promtool_unit_tests():
    assert RULES_TEST in RULE_TESTS
    res = run("test", "rules", *map(str, RULE_TESTS))
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
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (fires if t["exp_alerts"] else quiet).add(t["alertname"])
    assert fires >= EXPECTED_ALERTS
    assert quiet >= EXPECTED_ALERTS


def test_a_live_worker_reports_the_age_of_a_stuck_pending_entry(settings, tmp_path):
    """The gauge GooseIngestPendingEntryStuck needs: a real worker, an entry held by a dead consumer."""
    import time
    import urllib.request

    from services.broker.connect import sync_client
    from tests.support.pipeline import start_worker, stop, wait_until

    r = sync_client(settings)
    layout = settings.layout
    stream = layout.raw_stream(0)
    r.xgroup_create(stream, settings.group, id="0", mkstream=True)
    old_ms = int(time.time() * 1000) - 120_000  # published two minutes ago
    r.xadd(stream, {"run": "stuck", "seq": "0", "ts": str(old_ms), "kind": "line", "stream": "stdout",
                    "line": "{}"}, id=f"{old_ms}-0")
    r.xreadgroup(settings.group, "dead-consumer", {stream: ">"})  # delivered, never acknowledged
    r.set(layout.shard_lease(0), "dead-consumer", px=600_000)  # by a stuck worker that keeps its lease
    log = tmp_path / "w.log"
    worker = start_worker(settings, log, GOOSE_INGEST_CLAIM_IDLE_MS="600000")
    try:
        port = int(wait_until(lambda: re.search(r"metrics on port (\d+)", log.read_text()), timeout=60).group(1))

        def age() -> float | None:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            m = re.search(r'^goose_ingest_oldest_pending_age_seconds\{shard="0"\} (\S+)$', text, re.M)
            return float(m.group(1)) if m and float(m.group(1)) > 0 else None

        value = wait_until(age, timeout=30, interval=0.3)
        assert 115 <= value <= 200, value
    finally:
        stop(worker)
