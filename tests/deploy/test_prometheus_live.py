"""GooseIngestErrorSpike end to end: real workers, a real Prometheus, the real rules, 60x faster.

Two real worker processes (``python -m services.cli worker``, each with its own fixed
``GOOSE_INGEST_METRICS_PORT``) consume runs published by a background thread at a controlled
event rate. A real ``prometheus`` server scrapes both workers and evaluates a time-scaled copy of
``deploy/prometheus/rules.yml``; the test only talks to Prometheus's HTTP API.

Time scaling (``TIME_FACTOR`` = 60, done by ``tests/support/prometheus_server.py::scale_rules``):
every duration in the rule file is divided by 60 and nothing else changes. Concretely
``[5m]`` -> ``[5s]`` (all recording rules, GooseIngestStalled), ``[15m]`` -> ``[15s]``,
``[1h] offset 5m`` -> ``[1m] offset 5s`` (the ErrorSpike baseline), ``for: 5m`` -> ``for: 5s``,
``for: 10m`` -> ``for: 10s``, ``for: 15m`` -> ``for: 15s``; the workers' ALERT_WINDOW_S (the window of
the runs/hosts gauges the class and tool alerts read) 300 s -> 5 s. Names (``job:...:rate5m``), matchers,
operators, thresholds (``> 3 *``, ``> 0.05``, ``> 0.5`` events/s), labels and annotations are
untouched; scale_rules asserts the scaled file equals the source with every duration masked, and
``promtool check config`` validates the generated config and the scaled rule file. Thresholds on
rates are per second and keep their meaning. The server config is deploy/prometheus/prometheus.yml
scaled the same way (scrape_interval 15s -> 250ms, evaluation_interval 1m -> 1s), so a 5s rate
window holds ~20 scrapes (as 5m holds 20 at 15s) and the 1m baseline 60 evaluations (as 1h holds
60 at 1m); scale_rules refuses any window shorter than 4 scrape intervals.

Volume: the rule pages only above ``> 0.5`` events/s (read from the rule), i.e. 2.5 events per
scaled 5s window. The fleet runs at 20x that (10 events/s), with a normal 2% error share (one
error run in 50), like the promtool unit test of deploy/prometheus/tests/rules_test.yml.
The runs come from FLEET_HOSTS hosts: the spike pages only with errors on ALERT_MIN_HOSTS hosts.

Main test (~90 s): calm for scaled(1h) + scaled(5m) + 10 s = 75 s so the baseline window is full
(the runbook promises silence during a deployment's first hour), asserting every 0.5 s and then
through Prometheus's ALERTS history that the alert was never pending nor firing; then a burst of
error-heavy runs (75% error events at the same 10 events/s) until Prometheus reports the alert
``firing`` (observed 6-7.5 s; timeout 90 s).

Second test (~40 s): the same burst on a fleet only 30 s (half a scaled hour) old stays silent, as
docs/operations.md says (the rule requires an hour of history before it has a baseline).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
import yaml

from services.broker.embedded import free_port
from services.settings import Settings
from services.tap.publisher import Publisher
from tests.support.pipeline import REPO, start_worker, stop
from tests.support.prometheus_server import (
    PrometheusServer,
    format_duration_ms,
    parse_duration_ms,
    parse_go_time,
    require_binary,
    scale_rules,
)

pytestmark = pytest.mark.e2e

RULES = REPO / "deploy" / "prometheus" / "rules.yml"
PROM_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
ALERT = "GooseIngestErrorSpike"
TIME_FACTOR = 60
WORKERS = 2
VOLUME_MULTIPLE = 20  # events/s published, as a multiple of the rule's volume floor
CALM_ERROR_EVERY = 50  # one error run (1 error event) per 50 runs of 1 event: 2%
CALM_MARGIN_S = 10.0
FLEET_HOSTS = 5  # more than ALERT_MIN_HOSTS (3)
FIRING_TIMEOUT_S = 90.0

MESSAGE = (b'{"type":"message","message":{"id":"m1","role":"assistant",'
           b'"content":[{"type":"text","text":"hi"}]}}')
ERROR = b'{"type":"error","error":"boom"}'
CALM_RUN = [MESSAGE]  # 1 agent event
CALM_ERROR_RUN = [ERROR]  # 1 error event
BURST_RUN = [MESSAGE, ERROR, ERROR, ERROR]  # 1 agent + 3 error events: 75%


# --------------------------------------------------------------------------- rule facts
def _alert_rule(name: str) -> dict:
    doc = yaml.safe_load(RULES.read_text())
    return next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name)


def _volume_floor() -> float:
    """The events/s floor of GooseIngestErrorSpike, as written in the rule."""
    m = re.search(r"job:goose_ingest_events:rate5m\s*>\s*([0-9.]+)", _alert_rule(ALERT)["expr"])
    assert m, "GooseIngestErrorSpike lost its volume floor"
    return float(m.group(1))


def _baseline_window_s() -> tuple[float, float]:
    """(range, offset) of the spike's baseline, in scaled seconds."""
    m = re.search(r"avg_over_time\(job:goose_ingest_error_ratio:rate5m\[(\w+)\]\s+offset\s+(\w+)\)",
                  _alert_rule(ALERT)["expr"])
    assert m, "GooseIngestErrorSpike lost its avg_over_time baseline"
    return (parse_duration_ms(m.group(1)) / 1000 / TIME_FACTOR, parse_duration_ms(m.group(2)) / 1000 / TIME_FACTOR)


def _scaled(text: str) -> str:
    return format_duration_ms(parse_duration_ms(text) // TIME_FACTOR)


def scaled_alert_window_s() -> str:
    """The workers' ALERT_WINDOW_S (the window of the runs/hosts gauges the class and tool alerts
    read), scaled like the rules' windows: the shipped default divided by TIME_FACTOR."""
    return f"{Settings.model_fields['alert_window_s'].default / TIME_FACTOR:g}"


# --------------------------------------------------------------------------- publishing
class RunStream(threading.Thread):
    """Publishes runs at a fixed event rate; ``mode`` ("calm"/"burst") picks what the next runs hold."""

    TICK_S = 0.1

    def __init__(self, settings, events_per_s: float):
        super().__init__(name="run-stream", daemon=True)
        self.settings = settings
        self.events_per_s = events_per_s
        self.mode = "calm"
        self.halt = threading.Event()
        self.runs = 0
        self.events = {"agent": 0, "error": 0}
        self.error: BaseException | None = None
        self.max_lag_s = 0.0
        self._client = redis.Redis.from_url(settings.redis_url)

    def host(self) -> str:
        """The `host` label of the next run: round robin over FLEET_HOSTS (the spike pages only with
        errors on ALERT_MIN_HOSTS hosts)."""
        return f"host-{self.runs % FLEET_HOSTS}"

    def _next_run(self) -> list[bytes]:
        if self.mode == "burst":
            return BURST_RUN
        return CALM_ERROR_RUN if self.runs % CALM_ERROR_EVERY == CALM_ERROR_EVERY // 2 else CALM_RUN

    def run(self) -> None:
        try:
            start = time.monotonic()
            published = 0
            while not self.halt.is_set():
                due = (time.monotonic() - start) * self.events_per_s
                batch: list[Publisher] = []
                while published < due:
                    lines = self._next_run()
                    pub = Publisher(self.settings, f"prom/{self.runs}", {"host": self.host()}, client=self._client)
                    for line in lines:
                        pub.add_line(line, "stdout")
                    pub.add_eof(0)
                    batch.append(pub)
                    self.runs += 1
                    published += len(lines)
                    for line in lines:
                        self.events["error" if line is ERROR else "agent"] += 1
                for pub in batch:  # their sender threads sent concurrently; wait for all
                    pub.close()
                self.max_lag_s = max(self.max_lag_s, (due - published) / self.events_per_s)
                self.halt.wait(self.TICK_S)
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.error = exc
        finally:
            self._client.close()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"publisher thread failed: {self.error!r}") from self.error
        assert self.is_alive(), "publisher thread stopped"

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)


# --------------------------------------------------------------------------- the stack
class Stack:
    """Workers + Prometheus on the scaled config; everything stopped by ``close``."""

    def __init__(self, settings, tmp_path: Path):
        self.tmp = tmp_path
        prometheus = require_binary("prometheus")
        promtool = require_binary("promtool")
        self.scaling = scale_rules(RULES, tmp_path / "rules.yml", TIME_FACTOR, self._scaled_scrape_s())
        self.workers = []
        self.prom: PrometheusServer | None = None
        self.stream: RunStream | None = None
        ports = [free_port() for _ in range(WORKERS)]
        config = self._config(ports)
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        log = tmp_path / "workers.log"
        for port in ports:
            self.workers.append(start_worker(settings, log, GOOSE_INGEST_METRICS_PORT=str(port),
                                             GOOSE_INGEST_METRICS_HOST="127.0.0.1",
                                             GOOSE_INGEST_ALERT_WINDOW_S=scaled_alert_window_s()))
        self.prom = PrometheusServer(prometheus, tmp_path / "prometheus.yml", tmp_path, free_port())
        self.prom.wait_ready()
        self.job = config["scrape_configs"][0]["job_name"]
        deadline = time.monotonic() + 60
        while len(self.prom.targets_up()) < WORKERS:
            for w in self.workers:
                assert w.poll() is None, f"worker exited {w.returncode}:\n{self.worker_log()}"
            assert time.monotonic() < deadline, f"targets not up: {self.prom.get('/api/v1/targets')}"
            time.sleep(0.25)
        self.stream = RunStream(settings, VOLUME_MULTIPLE * _volume_floor())

    @staticmethod
    def _scaled_scrape_s() -> float:
        g = yaml.safe_load(PROM_CONFIG.read_text())["global"]
        return parse_duration_ms(_scaled(g["scrape_interval"])) / 1000

    def _config(self, ports: list[int]) -> dict:
        """deploy/prometheus/prometheus.yml, its intervals scaled, pointed at our workers and rules."""
        config = yaml.safe_load(PROM_CONFIG.read_text())
        g = config["global"]
        g["scrape_interval"] = _scaled(g["scrape_interval"])
        g["evaluation_interval"] = _scaled(g["evaluation_interval"])
        g["scrape_timeout"] = g["scrape_interval"]
        config["rule_files"] = [str(self.tmp / "rules.yml")]
        job = config["scrape_configs"][0]  # the workers' job; the other components do not run here
        job["static_configs"] = [{"targets": [f"127.0.0.1:{p}" for p in ports]}]
        config["scrape_configs"] = [job]
        return config

    def worker_log(self) -> str:
        try:
            return "\n".join((self.tmp / "workers.log").read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return "(no log)"

    def diagnostics(self) -> str:
        out = [f"scaling:\n{self.scaling.describe()}"]
        if self.stream is not None:
            out.append(f"published runs={self.stream.runs} events={self.stream.events} "
                       f"max publish lag={self.stream.max_lag_s:.2f}s")
        if self.prom is not None:
            base_range_s, base_offset_s = _baseline_window_s()
            for expr in ("job:goose_ingest_events:rate5m", "job:goose_ingest_error_ratio:rate5m",
                         f"avg_over_time(job:goose_ingest_error_ratio:rate5m[{base_range_s:g}s]"
                         f" offset {base_offset_s:g}s)",
                         "sum by (instance, type) (goose_ingest_events_total{type=~\"agent|error\"})",
                         "ALERTS"):
                try:
                    out.append(f"{expr} = {[(s['metric'], s['value'][1]) for s in self.prom.query(expr)]}")
                except Exception as exc:  # noqa: BLE001 - diagnostics only
                    out.append(f"{expr}: {exc!r}")
            out.append(f"prometheus log:\n{self.prom.log_tail(15)}")
        out.append(f"worker log:\n{self.worker_log()}")
        return "\n".join(out)

    def close(self) -> None:
        try:
            if self.stream is not None and self.stream.is_alive():
                self.stream.stop()
        finally:
            try:
                if self.prom is not None:
                    self.prom.stop()
            finally:
                for w in self.workers:
                    stop(w)


@pytest.fixture
def stack(settings, tmp_path):
    s = Stack(settings, tmp_path)
    try:
        yield s
    finally:
        s.close()


def _spike_states(prom: PrometheusServer) -> list[tuple[str, str]]:
    return [(a["state"], a["activeAt"]) for a in prom.alerts(ALERT)]


def _calm(stack: Stack, seconds: float) -> None:
    """Publish calmly for ``seconds``, asserting every 0.5 s that the spike alert is quiet."""
    prom = stack.prom
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stack.stream.check()
        states = _spike_states(prom)
        assert not states, f"{ALERT} {states} during the calm phase\n{stack.diagnostics()}"
        time.sleep(0.5)


# --------------------------------------------------------------------------- tests
def test_calm_fleet_stays_quiet_then_an_error_burst_fires_the_spike_alert(stack):
    prom, stream = stack.prom, stack.stream
    floor = _volume_floor()
    base_range_s, base_offset_s = _baseline_window_s()
    calm_s = base_range_s + base_offset_s + CALM_MARGIN_S
    t0 = time.time()
    stream.start()
    try:
        # 1. calm: a full baseline window of a normal fleet, above the volume floor.
        _calm(stack, calm_s)
        rate = prom.value(f'job:goose_ingest_events:rate5m{{job="{stack.job}"}}')
        ratio = prom.value(f'job:goose_ingest_error_ratio:rate5m{{job="{stack.job}"}}')
        baseline = prom.value(f"avg_over_time(job:goose_ingest_error_ratio:rate5m{{job=\"{stack.job}\"}}"
                              f"[{base_range_s:g}s] offset {base_offset_s:g}s)")
        history = prom.value(f"count_over_time(job:goose_ingest_error_ratio:rate5m[{base_range_s:g}s]"
                             f" offset {base_offset_s:g}s)")
        max_ratio = prom.value(f"max_over_time(job:goose_ingest_error_ratio:rate5m[{calm_s:g}s])")
        print(f"calm after {time.time() - t0:.1f}s: events/s={rate} ratio={ratio} baseline={baseline} "
              f"baseline samples={history} max ratio={max_ratio}")
        assert rate is not None and rate > 2 * floor, f"calm volume too low for the rule\n{stack.diagnostics()}"
        assert ratio is not None and baseline is not None, stack.diagnostics()
        assert 0 < baseline < 0.05, stack.diagnostics()
        # Prometheus's own history of the calm phase: never pending, never firing.
        assert prom.query(f'ALERTS{{alertname="{ALERT}"}}') == []
        assert prom.query(f'count_over_time(ALERTS{{alertname="{ALERT}"}}[{calm_s + 5:g}s])') == []
        # the other alerts stayed quiet too (a calm fleet is calm for every rule)
        assert prom.query("ALERTS") == [], prom.query("ALERTS")

        # 2. burst: same volume, 75% error events.
        burst_at = time.time()
        stream.mode = "burst"
        pending_seen = None
        deadline = time.monotonic() + FIRING_TIMEOUT_S
        firing = []
        while not firing:
            stream.check()
            assert time.monotonic() < deadline, (
                f"{ALERT} not firing {FIRING_TIMEOUT_S}s after the burst\n{stack.diagnostics()}")
            alerts = prom.alerts(ALERT)
            if any(a["state"] == "pending" for a in alerts) and pending_seen is None:
                pending_seen = time.time() - burst_at
            firing = [a for a in alerts if a["state"] == "firing"]
            time.sleep(0.25)
        fired_after = time.time() - burst_at
        print(f"burst: pending after {pending_seen}s, firing after {fired_after:.1f}s")
        (alert,) = firing
        assert alert["labels"] == {"alertname": ALERT, "job": stack.job, "severity": "critical"}, alert
        assert alert["annotations"]["runbook_url"] == "docs/operations.md#gooseingesterrorspike"
        active_at = parse_go_time(alert["activeAt"])
        assert active_at >= burst_at - 1.0, f"alert active since {alert['activeAt']}, before the burst"
        scaled_for_s = parse_duration_ms(_alert_rule(ALERT)["for"]) / 1000 / TIME_FACTOR
        assert pending_seen is not None, "went to firing without being pending first"
        assert fired_after >= scaled_for_s, f"fired {fired_after:.1f}s after the burst, `for` is {scaled_for_s}s"
        assert prom.value(f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}') == 1.0
    finally:
        stream.stop()
    assert stream.error is None, stream.error


YOUNG_CALM_S = 30.0
YOUNG_WATCH_S = 20.0


def test_a_fleet_younger_than_the_baseline_window_does_not_page(stack):
    """The runbook's "silent during a deployment's first hour", at half a (scaled) hour of history."""
    prom, stream = stack.prom, stack.stream
    base_range_s, _ = _baseline_window_s()
    assert YOUNG_CALM_S + YOUNG_WATCH_S < base_range_s, "the fleet must stay younger than the baseline window"
    stream.start()
    try:
        _calm(stack, YOUNG_CALM_S)
        stream.mode = "burst"
        burst_at = time.time()
        end = time.monotonic() + YOUNG_WATCH_S
        while time.monotonic() < end:
            stream.check()
            firing = [a for a in prom.alerts(ALERT) if a["state"] == "firing"]
            assert not firing, (f"{ALERT} fired {time.time() - burst_at:.1f}s after a burst, with only "
                                f"{YOUNG_CALM_S:g}s of a {base_range_s:g}s baseline window of history")
            time.sleep(0.25)
    finally:
        stream.stop()
    assert stream.error is None, stream.error
