"""How long an alert takes to reach a receiver, from the shipped files alone.

From the moment an alert's condition holds, Prometheus notices it at its next rule evaluation (at
most one `evaluation_interval`, deploy/prometheus/prometheus.yml), keeps it pending for the rule's
`for` (deploy/prometheus/rules.yml), then sends it to Alertmanager, which holds a new group for the
`group_wait` of the route the alert takes (deploy/alertmanager/alertmanager.yml) before the first
notification. docs/operations.md ("Delivery latency") states these numbers per alert;
tests/deploy/test_alertmanager.py holds the table equal to what this module computes, and
tests/deploy/test_alerts_delivered_live.py derives its timeout from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.prometheus_server import parse_duration_ms

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"

_MATCHER = re.compile(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')
# A range selector read now (a baseline read `offset` back is history, not what a new cause fills),
# and the window a recording rule's name states (`job:...:rate5m`, `...:increase15m`).
_RANGE = re.compile(r"\[(\w+)(?::\w*)?\](?!\s*offset)")
_RECORDED = re.compile(r":(?:rate|increase)(\d+[smhd])\b")
_CLASS = re.compile(r'\bclass="(\w+)"')


@dataclass(frozen=True)
class Latency:
    """One alert's delivery timings, in milliseconds."""

    alert: str
    severity: str
    for_ms: int
    evaluation_ms: int
    group_wait_ms: int
    window_ms: int  # the longest window read now: a sudden cause holds the condition within it

    @property
    def bound_ms(self) -> int:
        """At most this long from the condition holding to the first notification."""
        return self.for_ms + self.evaluation_ms + self.group_wait_ms


def alert_rules() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def evaluation_interval_ms() -> int:
    return parse_duration_ms(yaml.safe_load(PROM_CONFIG.read_text())["global"]["evaluation_interval"])


def alert_labels(rule: dict) -> dict[str, str]:
    """The labels Alertmanager routes on: the rule's own, plus a `class` the expression fixes."""
    labels = {"alertname": rule["alert"], **{k: str(v) for k, v in rule.get("labels", {}).items()}}
    classes = set(_CLASS.findall(rule["expr"]))
    if len(classes) == 1:
        labels.setdefault("class", classes.pop())
    return labels


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    m = _MATCHER.match(matcher)
    if m is None:
        raise ValueError(f"alertmanager.yml: matcher {matcher!r} is not name<op>\"value\"")
    name, op, value = m.groups()
    have = labels.get(name, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    hit = re.fullmatch(value, have) is not None
    return hit if op == "=~" else not hit


def group_wait_ms(labels: dict[str, str], config: dict | None = None) -> int:
    """The group_wait of the route Alertmanager picks for these labels (first matching child route,
    none of the shipped routes `continue`; a child without group_wait inherits its parent's)."""
    route = config if config is not None else yaml.safe_load(AM_CONFIG.read_text())["route"]
    wait = route["group_wait"]
    while True:
        for child in route.get("routes", []):
            if child.get("continue"):
                raise ValueError("a route with `continue` is not modelled here")
            if all(_matches(m, labels) for m in child.get("matchers", [])):
                route = child
                wait = child.get("group_wait", wait)
                break
        else:
            return parse_duration_ms(wait)


def latency(alert: str) -> Latency:
    rule = alert_rules()[alert]
    labels = alert_labels(rule)
    windows = [parse_duration_ms(w) for w in (*_RANGE.findall(rule["expr"]), *_RECORDED.findall(rule["expr"]))]
    return Latency(alert=alert, severity=labels["severity"],
                   for_ms=parse_duration_ms(rule["for"]) if rule.get("for") else 0,
                   evaluation_ms=evaluation_interval_ms(), group_wait_ms=group_wait_ms(labels),
                   window_ms=max(windows, default=0))
