"""A real Prometheus server for live tests, and a time-scaled copy of deploy/prometheus/rules.yml.

Time scaling (``scale_rules``): every duration of the rule file is divided by the same integer
factor, and nothing else changes:

* in every ``expr``: range selectors ``[d]`` (and the ``[d:r]`` of subqueries) and ``offset d``;
* the ``for`` (and ``keep_firing_for``) of every alert.

Metric and recording-rule names (``job:...:rate5m``), label matchers, comparison operators,
thresholds (``> 3 *``, ``> 0.05``, ``> 0.5`` events/s, ...), annotations and the group structure
stay byte-for-byte what the source says: ``scale_rules`` checks that the scaled document equals
the source once every duration is masked, and refuses range windows shorter than
``MIN_SAMPLES_PER_WINDOW`` scrape intervals (rate() needs at least two samples per window; four
keep it stable against scrape jitter).

Rates are per second, so thresholds on rates keep their meaning under the scaling; only the
windows (how long "5 minutes" or "an hour" is) shrink.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from tests.support.needs import missing

MIN_SAMPLES_PER_WINDOW = 4

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
             "y": 31_536_000_000}
_DUR = r"(?:\d+(?:ms|[smhdwy]))+"
_DUR_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_RANGE = re.compile(rf"\[(\s*)({_DUR})(\s*)(?::(\s*)({_DUR})?(\s*))?\]")
_OFFSET = re.compile(rf"\b(offset\s+)(-?)({_DUR})\b")
_FOR_KEYS = ("for", "keep_firing_for")
_MASK = "<DURATION>"


# --------------------------------------------------------------------------- binaries
def require_binary(name: str) -> str:
    """Path of a Prometheus binary: FAIL when missing and $CI is set, else skip the test."""
    path = shutil.which(name)
    if path:
        return path
    missing(name, "apt-get install -y prometheus")


# --------------------------------------------------------------------------- durations
def parse_duration_ms(text: str) -> int:
    if not re.fullmatch(_DUR, text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNITS_MS[unit] for n, unit in _DUR_PART.findall(text))


def format_duration_ms(ms: int) -> str:
    if ms <= 0:
        raise ValueError(f"duration must be positive, got {ms}ms")
    for unit in ("h", "m", "s", "ms"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    raise AssertionError("unreachable")


@dataclass
class Scaling:
    """How a rule file was scaled: the factor and every (rule, place, before, after) rewrite."""

    factor: int
    min_window_ms: int
    changes: list[tuple[str, str, str, str]] = field(default_factory=list)

    def scale(self, text: str, where: str, what: str, *, is_window: bool) -> str:
        ms = parse_duration_ms(text)
        if ms % self.factor:
            raise ValueError(f"{where}: {what} {text} is not divisible by {self.factor}")
        scaled = ms // self.factor
        if is_window and scaled < self.min_window_ms:
            raise ValueError(f"{where}: range {text} scaled to {scaled}ms, shorter than "
                             f"{MIN_SAMPLES_PER_WINDOW} scrape intervals ({self.min_window_ms}ms)")
        out = format_duration_ms(scaled)
        self.changes.append((where, what, text, out))
        return out

    def expr(self, expr: str, where: str) -> str:
        def on_range(m: re.Match) -> str:
            lead, window, trail, sub_lead, step, sub_trail = m.groups()
            out = f"[{lead}{self.scale(window, where, 'range', is_window=True)}{trail}"
            if sub_lead is not None:
                out += f":{sub_lead}"
                if step:
                    out += self.scale(step, where, "subquery step", is_window=False)
                out += sub_trail or ""
            return out + "]"

        def on_offset(m: re.Match) -> str:
            kw, sign, dur = m.groups()
            return f"{kw}{sign}{self.scale(dur, where, 'offset', is_window=False)}"

        return _OFFSET.sub(on_offset, _RANGE.sub(on_range, expr))

    def describe(self) -> str:
        return "\n".join(f"  {w}: {what} {a} -> {b}" for w, what, a, b in self.changes)


def _mask_expr(expr: str) -> str:
    expr = _RANGE.sub(lambda m: "[" + _MASK + "]", expr)
    return _OFFSET.sub(lambda m: m.group(1) + _MASK, expr)


def _masked(doc: dict) -> dict:
    out = {"groups": []}
    for group in doc["groups"]:
        g = dict(group)
        g["rules"] = []
        for rule in group["rules"]:
            r = dict(rule)
            r["expr"] = _mask_expr(r["expr"])
            for key in _FOR_KEYS:
                if key in r:
                    r[key] = _MASK
            g["rules"].append(r)
        out["groups"].append(g)
    return out


class _BlockDumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_representer)


def scale_rules(src: Path, dst: Path, factor: int, scrape_interval_s: float) -> Scaling:
    """Write ``src`` divided in time by ``factor`` to ``dst`` (see the module docstring)."""
    doc = yaml.safe_load(src.read_text())
    scaling = Scaling(factor, int(MIN_SAMPLES_PER_WINDOW * scrape_interval_s * 1000))
    scaled = {"groups": []}
    for group in doc["groups"]:
        if "interval" in group:  # a group-level interval would override evaluation_interval
            raise ValueError(f"group {group['name']} sets its own interval; scale it too")
        g = dict(group)
        g["rules"] = []
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            r = dict(rule)
            r["expr"] = scaling.expr(rule["expr"], name)
            for key in _FOR_KEYS:
                if key in r:
                    r[key] = scaling.scale(str(r[key]), name, key, is_window=False)
            g["rules"].append(r)
        scaled["groups"].append(g)
    if set(doc) != {"groups"}:
        raise ValueError(f"unexpected top-level keys in {src}: {sorted(doc)}")
    # Nothing but durations changed: thresholds, names, matchers and structure are the source's.
    assert _masked(scaled) == _masked(doc), "scaling changed more than durations"
    dst.write_text(f"# {src.name} with every duration divided by {factor} (tests/support/prometheus_server.py)\n"
                   + yaml.dump(scaled, Dumper=_BlockDumper, sort_keys=False, width=1000))
    return scaling


# --------------------------------------------------------------------------- server
def parse_go_time(text: str) -> float:
    """Unix time of a Prometheus RFC3339(Nano) timestamp such as 2025-01-02T03:04:05.123456789Z."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise ValueError(f"unexpected timestamp {text!r}")
    base, frac, tz = m.groups()
    dt = datetime.fromisoformat(base + ("+00:00" if tz == "Z" else tz))
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


class PrometheusServer:
    def __init__(self, binary: str, config: Path, workdir: Path, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
            cwd=workdir, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> dict:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise AssertionError(f"{url}: {body}")
        return body["data"]

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready within {timeout}s:\n{self.log_tail()}")

    def query(self, expr: str) -> list[dict]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def value(self, expr: str) -> float | None:
        """The single sample of an instant query (None when empty; fails on several)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {result}"
        return float(result[0]["value"][1]) if result else None

    def alerts(self, name: str) -> list[dict]:
        return [a for a in self.get("/api/v1/alerts")["alerts"] if a["labels"].get("alertname") == name]

    def targets_up(self) -> list[str]:
        return [t["scrapeUrl"] for t in self.get("/api/v1/targets")["activeTargets"] if t["health"] == "up"]

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
