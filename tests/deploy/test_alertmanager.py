"""deploy/alertmanager/alertmanager.yml in a real Alertmanager: routes, grouping and inhibition.

Debian's `prometheus-alertmanager` runs as a process on a loopback port with a copy of the shipped
config whose webhook URLs point at a receiver in this test and whose group_wait/group_interval are
shortened (delivery pacing only; routes, matchers, grouping keys and inhibit rules are the file's,
checked equal below). Alerts are posted to its API exactly as Prometheus sends them (labels of the
rules in deploy/prometheus/rules.yml), and the test asserts what the webhooks receive: a rate-limit
storm and a failing tool as tickets with their class and tool labels, a fleet-wide auth failure
paged, and the inhibited alerts (the generic error spike during a named cause, the stall while no
worker is up) absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from services.broker.embedded import free_port
from tests.support import alert_delivery
from tests.support.needs import missing

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
JOB = "goose-ingest"
DELIVERY_TIMEOUT_S = 30


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing(name, "apt-get install -y prometheus-alertmanager")
    return path


class Webhooks:
    """A local webhook receiver: every notification body, by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with outer.lock:
                    outer.received.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def firing(self) -> dict[str, list[dict]]:
        """alertname -> the firing alerts notified for it, with the receiver path in `_path`."""
        out: dict[str, list[dict]] = {}
        with self.lock:
            for path, body in self.received:
                for alert in body["alerts"]:
                    if alert["status"] == "firing":
                        out.setdefault(alert["labels"]["alertname"], []).append({**alert, "_path": path,
                                                                                 "_group": body["groupLabels"]})
        return out

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _test_config(webhook_port: int) -> dict:
    config = yaml.safe_load(CONFIG.read_text())
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"http://127.0.0.1:{webhook_port}/{receiver['name']}"
    # delivery pacing only: seconds instead of 10-30 s / 5 min
    for route in [config["route"], *config["route"]["routes"]]:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = "1s"
    return config


@pytest.fixture
def alertmanager(tmp_path):
    binary = _binary("prometheus-alertmanager")
    hooks = Webhooks()
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(_test_config(hooks.port), sort_keys=False))
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "alertmanager.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "alertmanager not ready"
            time.sleep(0.2)
        yield url, hooks
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        hooks.close()
        log.close()


def _rule(name: str) -> dict:
    doc = yaml.safe_load(RULES.read_text())
    return next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name)


def _alert(name: str, **labels: str) -> dict:
    """An alert as Prometheus posts it for the rule `name` (its severity and annotations)."""
    rule = _rule(name)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return {"labels": {"alertname": name, "job": JOB, "severity": rule["labels"]["severity"], **labels},
            "annotations": {k: v.replace("{{ $labels.job }}", JOB) for k, v in rule["annotations"].items()},
            "startsAt": now, "generatorURL": "http://prometheus.test/graph"}


def _active(url: str) -> set[str]:
    """The names of the alerts Alertmanager holds as active (not yet inhibited or silenced ones included)."""
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as r:
        return {a["labels"]["alertname"] for a in json.loads(r.read())}


def _post(url: str, alerts: list[dict]) -> None:
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_the_shipped_config_is_valid_and_routes_by_severity_and_class():
    amtool = _binary("amtool")
    check = subprocess.run([amtool, "check-config", str(CONFIG)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    def route(*labels: str) -> str:
        out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={CONFIG}", *labels],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert route("severity=critical", "class=auth", "alertname=GooseIngestAuthErrors") == "goose-ingest-pager"
    assert route("severity=critical", "alertname=GooseIngestErrorSpike") == "goose-ingest-pager"
    assert route("severity=warning", "class=rate_limit", "alertname=GooseIngestRateLimited") == "goose-ingest-tickets"
    assert route("severity=warning", "tool=shell", "alertname=GooseIngestToolFailing") == "goose-ingest-tickets"


def test_every_alert_the_rules_define_has_a_route_and_every_inhibit_rule_names_real_alerts():
    config = yaml.safe_load(CONFIG.read_text())
    doc = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    severities = {r["labels"]["severity"] for r in alerts.values()}
    routed = {m.split("=", 1)[1].strip('"') for r in config["route"]["routes"] for m in r["matchers"]
              if m.startswith("severity=")}
    assert severities <= routed | {"info"}
    for rule in config["inhibit_rules"]:
        for side in ("source_matchers", "target_matchers"):
            for matcher in rule[side]:
                assert matcher.startswith("alertname=")
                names = matcher.split("=", 1)[1].lstrip("~").strip('"').split("|")
                assert set(names) <= set(alerts), f"{side} names an alert the rules do not define: {names}"
        assert rule["equal"] == ["job", "namespace"]


def test_a_real_alertmanager_delivers_grouped_labelled_and_inhibits(alertmanager):
    url, hooks = alertmanager
    # A rate-limit storm: the named cause and the generic error spike it explains (inhibited);
    # a failing tool; a fleet-wide auth failure; no workers, with the stall it explains (inhibited).
    # The causes first, then the effects once Alertmanager holds the causes: its inhibitor learns of
    # an alert asynchronously, so effects posted in the same request could, on a loaded machine, be
    # grouped before their cause is known (Prometheus sends each rule's alerts on its own schedule
    # anyway; a cause whose `for` is shorter than its effect's is what the rules ship).
    _post(url, [_alert("GooseIngestRateLimited", **{"class": "rate_limit"}),
                _alert("GooseIngestToolFailing", tool="shell"),
                _alert("GooseIngestToolFailing", tool="mcp"),
                _alert("GooseIngestAuthErrors", **{"class": "auth"}),
                _alert("GooseIngestNoWorkers")])
    causes = {"GooseIngestRateLimited", "GooseIngestNoWorkers"}
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while not causes <= _active(url):
        assert time.monotonic() < deadline, f"Alertmanager holds: {sorted(_active(url))}"
        time.sleep(0.2)
    time.sleep(1.0)  # the inhibitor's own subscription lags the API's view under load
    _post(url, [_alert("GooseIngestErrorSpike"), _alert("GooseIngestStalled")])
    expected = {"GooseIngestRateLimited", "GooseIngestToolFailing", "GooseIngestAuthErrors", "GooseIngestNoWorkers"}
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while not expected <= set(hooks.firing()) or len(hooks.firing().get("GooseIngestToolFailing", [])) < 2:
        assert time.monotonic() < deadline, f"delivered: {sorted(hooks.firing())}"
        time.sleep(0.2)
    time.sleep(3)  # a few group intervals more: an inhibited alert would have arrived by now
    firing = hooks.firing()
    assert set(firing) == expected, f"inhibited alerts were delivered: {sorted(set(firing) - expected)}"

    (rate_limit,) = firing["GooseIngestRateLimited"]
    assert rate_limit["_path"] == "/goose-ingest-tickets" and rate_limit["labels"]["class"] == "rate_limit"
    assert rate_limit["annotations"]["runbook_url"] == "docs/operations.md#gooseingestratelimited"
    # one notification group per tool, each naming its tool
    tools = sorted(a["labels"]["tool"] for a in firing["GooseIngestToolFailing"])
    assert tools == ["mcp", "shell"]
    assert {a["_group"].get("tool") for a in firing["GooseIngestToolFailing"]} == {"mcp", "shell"}
    assert all(a["_path"] == "/goose-ingest-tickets" for a in firing["GooseIngestToolFailing"])
    (auth,) = firing["GooseIngestAuthErrors"]
    assert auth["_path"] == "/goose-ingest-pager" and auth["labels"]["class"] == "auth"
    assert auth["_group"] == {"alertname": "GooseIngestAuthErrors", "job": JOB, "class": "auth"}
    (no_workers,) = firing["GooseIngestNoWorkers"]
    assert no_workers["_path"] == "/goose-ingest-pager"


def _seconds(text: str) -> int:
    """'6 min 30 s' -> 390 (the docs table's durations)."""
    parts = re.fullmatch(r"(?:(\d+) min)? ?(?:(\d+) s)?", text.strip())
    assert parts and any(parts.groups()), f"not a duration of the table: {text!r}"
    return int(parts.group(1) or 0) * 60 + int(parts.group(2) or 0)


def test_the_docs_state_every_alerts_delivery_latency_as_the_shipped_files_give_it():
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("#### Delivery latency"):]
    rows = re.findall(r"^\| (GooseIngest\w+) \| (\w+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    documented = {name: (sev, *(_seconds(x) for x in rest)) for name, sev, *rest in rows}
    computed = {}
    for name in alert_delivery.alert_rules():
        lat = alert_delivery.latency(name)
        computed[name] = (lat.severity, lat.for_ms // 1000, lat.evaluation_ms // 1000, lat.group_wait_ms // 1000,
                          lat.bound_ms // 1000)
    assert documented == computed


def test_the_latency_model_picks_the_routes_group_wait():
    # the fleet-wide critical causes take the 10 s route; a critical without such a class, and every
    # warning, the root's 30 s (the same routes amtool names in the routing test above)
    assert alert_delivery.latency("GooseIngestAuthErrors").group_wait_ms == 10_000
    assert alert_delivery.latency("GooseIngestProviderUnavailable").group_wait_ms == 10_000
    assert alert_delivery.latency("GooseIngestErrorSpike").group_wait_ms == 30_000
    assert alert_delivery.latency("GooseIngestRateLimited").group_wait_ms == 30_000
    assert alert_delivery.group_wait_ms({"severity": "critical", "class": "quota"}) == 10_000
    assert alert_delivery.group_wait_ms({"severity": "warning", "class": "auth"}) == 30_000
    with pytest.raises(ValueError, match="not name<op>"):
        alert_delivery.group_wait_ms({"severity": "critical"}, {"group_wait": "30s", "routes": [{"matchers": ["bad"]}]})
