"""Alerts delivered for real: workers -> Prometheus (the rules) -> Alertmanager (the shipped config) -> webhooks.

Real worker processes normalize published goose runs; a real Prometheus scrapes them and evaluates
deploy/prometheus/rules.yml time-scaled 60x (tests/support/prometheus_server.py, as in
tests/deploy/test_prometheus_live.py: windows and `for` shrink, thresholds and names do not); it sends its
alerts to a real Alertmanager running deploy/alertmanager/alertmanager.yml with the webhook URLs
pointed at a receiver in this test. Group waits are the shipped ones (30 s): they are what lets a
cause's alert arrive before the alert it inhibits.

The fleet is calm for a scaled hour (a baseline for GooseIngestErrorSpike), then a storm from
STORM_HOSTS hosts: every run is rate-limited (two `Rate limit exceeded` errors) and its shell calls
fail (HOST_MIN_TOOL_CALLS of them, so each storm host is a host the tool fails on). The class and tool
alerts count runs and hosts (docs/operations.md "Pages counted in runs and hosts"): the storm has
more runs than ALERT_MIN_RUNS and exactly ALERT_MIN_HOSTS hosts within the workers' scaled window,
the shipped defaults. Expected at the
webhooks: GooseIngestRateLimited (class rate_limit) and GooseIngestToolFailing (tool shell) as
tickets, each its own group; GooseIngestErrorSpike fires in Prometheus, reaches Alertmanager, which
shows it `suppressed` and inhibited by the rate-limit alert, and its group wait passes without a
notification of it. ~2.5 minutes.

The timeouts come from the shipped files (tests/support/alert_delivery.py, the latency table of
docs/operations.md): each alert's longest window, `for` and evaluation interval scaled as the rules
are, plus the route's group_wait as shipped, plus a margin for the pipeline.
"""

from __future__ import annotations

import subprocess
import time
import urllib.parse
import urllib.request

import orjson
import pytest
import yaml

from services.broker.embedded import free_port
from services.settings import Settings
from services.worker.spread import HOST_MIN_TOOL_CALLS
from tests.deploy.test_alertmanager import CONFIG, Webhooks, _test_config
from tests.deploy.test_prometheus_live import (
    CALM_MARGIN_S,
    MESSAGE,
    TIME_FACTOR,
    RunStream,
    Stack,
    _baseline_window_s,
)
from tests.support import alert_delivery
from tests.support.normalizer import req, resp
from tests.support.prometheus_server import require_binary

pytestmark = pytest.mark.e2e

RATE_LIMITED = orjson.dumps({"type": "error", "error": "Rate limit exceeded: 429 Too Many Requests"})
STORM_HOSTS = Settings.model_fields["alert_min_hosts"].default  # the fewest hosts that page, as shipped
# agent, 2 x rate_limit, HOST_MIN_TOOL_CALLS failed commands
STORM_RUN = [MESSAGE, RATE_LIMITED, RATE_LIMITED] + [
    line.encode() for n in range(HOST_MIN_TOOL_CALLS)
    for line in (req(f"call_{n}", "developer__shell", {"command": "make test"}, mid=f"q{n}"),
                 resp(f"call_{n}", status="error", mid=f"r{n}"))]
# Lines/s of the stack's stream, as a multiple of the spike's floor: the storm's runs are long, so at
# the spike test's rate fewer than ALERT_MIN_RUNS of them would fit in the scaled window.
STORM_VOLUME = 2
SPIKE = "GooseIngestErrorSpike"
DELIVERED = ("GooseIngestRateLimited", "GooseIngestToolFailing")
# publish -> worker -> scrape -> Prometheus -> Alertmanager -> webhook, beyond the rules' own
# timings, on a 2-core machine shared with other tests: how long the spike must stay undelivered
PIPELINE_MARGIN_S = 40.0


def scaled_latency_s(alert: str) -> float:
    """The alert's documented delivery bound as this test runs it: the longest window it reads (a
    sudden storm fills it), `for` and the evaluation interval divided by TIME_FACTOR like the rules;
    the group_wait as shipped (the test keeps the shipped route timings)."""
    lat = alert_delivery.latency(alert)
    return (lat.window_ms + lat.for_ms + lat.evaluation_ms) / 1000 / TIME_FACTOR + lat.group_wait_ms / 1000


# The wait for the deliveries ends as soon as they arrive, so its margin is generous: on four xdist
# workers a scrape can time out (the scaled scrape_timeout is 250 ms) and a pending alert starts its
# `for` again; with 20 s and then 40 s the deliveries were still on their way at the deadline.
LOADED_MARGIN_S = 120.0
DELIVERY_TIMEOUT_S = max(scaled_latency_s(a) for a in (*DELIVERED, SPIKE)) + LOADED_MARGIN_S


class StormStream(RunStream):
    def _next_run(self) -> list[bytes]:
        return STORM_RUN if self.mode == "storm" else super()._next_run()

    def host(self) -> str:
        return f"storm-{self.runs % STORM_HOSTS}" if self.mode == "storm" else super().host()


class AlertingStack(Stack):
    """Stack (workers + scaled Prometheus) whose Prometheus sends to a real Alertmanager."""

    def __init__(self, settings, tmp_path, alertmanager_port: int):
        self.alertmanager_port = alertmanager_port
        super().__init__(settings, tmp_path)
        self.stream = StormStream(settings, STORM_VOLUME * self.stream.events_per_s)

    def _config(self, ports: list[int]) -> dict:
        config = super()._config(ports)
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]}
        return config


@pytest.fixture
def delivery(settings, tmp_path):
    binary = require_binary("prometheus-alertmanager")
    hooks = Webhooks()
    config = _test_config(hooks.port)
    # the shipped group timings: only the webhook URLs change (see the module docstring)
    config["route"] = yaml.safe_load(CONFIG.read_text())["route"]
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    am = subprocess.Popen([binary, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
                           f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                          stdout=log, stderr=subprocess.STDOUT)
    stack = None
    try:
        deadline = time.monotonic() + 30
        while True:
            assert am.poll() is None, (tmp_path / "alertmanager.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "alertmanager not ready"
                time.sleep(0.2)
        (tmp_path / "stack").mkdir()
        stack = AlertingStack(settings, tmp_path / "stack", port)
        yield stack, hooks
    finally:
        if stack is not None:
            stack.close()
        am.terminate()
        am.wait(timeout=10)
        hooks.close()
        log.close()


def _am_alerts(port: int, alertname: str) -> list[dict]:
    """Alertmanager's view of an alert (active, suppressed or unprocessed), from its API."""
    query = urllib.parse.urlencode({"filter": f'alertname="{alertname}"'})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/alerts?{query}", timeout=5) as r:
        return orjson.loads(r.read())


def test_the_timeout_is_the_documented_latency_scaled():
    # the spike's bound, as docs/operations.md states it (6 min 30 s) and as this test scales it
    lat = alert_delivery.latency(SPIKE)
    assert (lat.for_ms, lat.evaluation_ms, lat.group_wait_ms) == (300_000, 60_000, 30_000)
    assert scaled_latency_s(SPIKE) == (300 + 300 + 60) / TIME_FACTOR + 30
    assert DELIVERY_TIMEOUT_S == scaled_latency_s("GooseIngestToolFailing") + LOADED_MARGIN_S


def test_a_rate_limit_storm_and_a_failing_tool_reach_the_webhooks_and_the_spike_is_inhibited(delivery):
    stack, hooks = delivery
    prom, stream = stack.prom, stack.stream
    base_range_s, base_offset_s = _baseline_window_s()
    stream.start()
    try:
        # 1. calm for a (scaled) hour: the spike alert gets its baseline; nothing fires
        end = time.monotonic() + base_range_s + base_offset_s + CALM_MARGIN_S
        while time.monotonic() < end:
            stream.check()
            time.sleep(0.5)
        assert prom.query("ALERTS") == [], prom.query("ALERTS")
        assert hooks.firing() == {}
        # 2. the storm
        stream.mode = "storm"
        spike_fired_at: float | None = None
        # The spike is relative to the last (scaled) hour: once the storm is a third of that window
        # the baseline catches up and it resolves, well before the tool alert's longer `for` is
        # over. So Alertmanager's view of it is read while it fires, in the same loop.
        inhibited: list[dict] = []
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        wanted = set(DELIVERED)
        while not (wanted <= set(hooks.firing()) and inhibited):
            stream.check()
            assert time.monotonic() < deadline, (f"delivered {sorted(hooks.firing())}, spike fired {spike_fired_at}, "
                                                 f"seen inhibited {inhibited}\n{stack.diagnostics()}")
            if spike_fired_at is None and any(a["state"] == "firing" for a in prom.alerts(SPIKE)):
                spike_fired_at = time.monotonic()
            if spike_fired_at is not None and not inhibited:
                causes = _am_alerts(stack.alertmanager_port, "GooseIngestRateLimited")
                spikes = _am_alerts(stack.alertmanager_port, SPIKE)
                if causes and spikes and all(a["status"]["state"] == "suppressed" for a in spikes):
                    inhibited = [{"cause": causes[0]["fingerprint"], **a["status"]} for a in spikes]
            time.sleep(0.5)
        # 3. Alertmanager held the spike back because of the named cause, not a silence
        for status in inhibited:
            assert status["inhibitedBy"] == [status["cause"]] and status["silencedBy"] == [], status
        # 4. the spike's own group wait (its route's, as shipped) passes: still no notification of it
        assert spike_fired_at is not None
        settle = spike_fired_at + alert_delivery.latency(SPIKE).group_wait_ms / 1000 + PIPELINE_MARGIN_S
        while time.monotonic() < settle:
            stream.check()
            time.sleep(0.5)
        firing = hooks.firing()
    finally:
        stream.stop()
    assert stream.error is None, stream.error
    assert "GooseIngestErrorSpike" not in firing, "the spike was delivered although a named cause inhibits it"
    (rate_limited,) = firing["GooseIngestRateLimited"]
    assert rate_limited["labels"]["class"] == "rate_limit" and rate_limited["labels"]["severity"] == "warning"
    assert rate_limited["_path"] == "/goose-ingest-tickets"
    assert rate_limited["_group"] == {"alertname": "GooseIngestRateLimited", "job": stack.job, "class": "rate_limit"}
    failing = firing["GooseIngestToolFailing"]
    assert {a["labels"]["tool"] for a in failing} == {"shell"}
    assert failing[0]["_group"] == {"alertname": "GooseIngestToolFailing", "job": stack.job, "tool": "shell"}
    assert set(firing) <= {"GooseIngestRateLimited", "GooseIngestToolFailing"}, sorted(firing)

