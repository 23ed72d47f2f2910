"""The metrics one worker process exports (prometheus_client, one registry per :class:`Metrics`).

Label values are always drawn from the bounded sets below: anything else (a run id, a path, a
command, an MCP tool name, a misspelt outcome) is mapped to ``"other"`` / ``"mcp"`` so a
misbehaving agent can never explode the number of series. The one extension: the tool names an
operator lists in GOOSE_INGEST_METRIC_TOOLS (at most ``METRIC_TOOLS_MAX``, checked by
``metric_tool_problem``) keep their own ``tool`` label, so the per-tool alert can name an MCP tool.

Not multiprocess-safe by design: each worker process has its own registry and its own port.
Never start workers with ``faststream run --workers N`` (N processes behind one port, each scrape
sees one of them); run N processes with N ports, or N pods.
"""

from __future__ import annotations

import math
from collections import Counter as _Tally
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from contracts.events import ERROR_CLASSES as ERROR_CLASSES
from contracts.events import EVENT_TYPES as _CONTRACT_EVENT_TYPES
from contracts.events import FORMATS as FORMATS
from contracts.events import TOOL_EVENT_TYPES as _CONTRACT_TOOL_EVENT_TYPES
from contracts.raw import DEAD_LETTER_REASONS as DEAD_LETTER_REASONS  # one source: the contract
from contracts.raw import PENDING_TOOL_CAPS as PENDING_TOOL_CAPS
from contracts.raw import RAW_OUTCOMES as RAW_OUTCOMES
from contracts.runs import RUN_STATES as RUN_STATES
from contracts.tool_labels import _BASE_NAMES as _BASE_NAMES
from contracts.tool_labels import METRIC_TOOL_NAME as METRIC_TOOL_NAME
from contracts.tool_labels import METRIC_TOOLS_MAX as METRIC_TOOLS_MAX
from contracts.tool_labels import OTHER as OTHER
from contracts.tool_labels import TOOL_BASE_NAMES as TOOL_BASE_NAMES
from contracts.tool_labels import TOOL_LABELS as TOOL_LABELS
from contracts.tool_labels import metric_tool_problem as metric_tool_problem
from contracts.tool_labels import metric_tools_problem as metric_tools_problem
from contracts.tool_labels import tool_label as tool_label

# `format` label of a run whose input format is not decided yet (only stderr or non-JSON so far).
UNDECIDED = "undecided"
FORMAT_LABELS = (*FORMATS, UNDECIDED)

EVENT_TYPES: tuple[str, ...] = _CONTRACT_EVENT_TYPES
TOOL_EVENT_TYPES: frozenset[str] = frozenset(_CONTRACT_TOOL_EVENT_TYPES)
TOOL_OUTCOMES: tuple[str, ...] = ("success", "failure", "unknown")
TERMINAL_RUN_STATES: frozenset[str] = frozenset({"ended", "abandoned"})
# record field -> `kind` label of goose_ingest_tokens_total
TOKEN_FIELDS: tuple[tuple[str, str], ...] = (
    ("inputTokens", "input"),
    ("outputTokens", "output"),
    ("totalTokens", "total"),
    ("cacheReadInputTokens", "cache_read"),
    ("cacheWriteInputTokens", "cache_write"),
)
TOKEN_KINDS: tuple[str, ...] = tuple(kind for _, kind in TOKEN_FIELDS)
MAX_SHARDS = 1024  # Settings.shards upper bound

BATCH_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_ENTRIES_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_RAW_OUTCOMES = frozenset(RAW_OUTCOMES)
_DL_REASONS = frozenset(DEAD_LETTER_REASONS)
_EVENT_TYPES = frozenset(EVENT_TYPES)
_ERROR_CLASSES = frozenset(ERROR_CLASSES)
_FORMATS = frozenset(FORMATS)
_RUN_STATES = frozenset(RUN_STATES)


def tool_outcome(ev: Mapping[str, Any]) -> str:
    ok = ev.get("isSuccess")
    if ok is True:
        return "success"
    if ok is False:
        return "failure"
    return "unknown"


def _count(n: object) -> int:
    """A usable counter increment (non-negative int); anything else counts as nothing."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return 0
    return n


def _error_class(ev: Mapping[str, Any]) -> str:
    """Bounded `class` label: the event's errorClass when it is one of the vocabulary, else other."""
    cls = ev.get("errorClass")
    return cls if cls in _ERROR_CLASSES else "other"


def _format_label(fmt: object) -> str:
    if fmt is None:
        return UNDECIDED
    return fmt if fmt in _FORMATS else OTHER


class Metrics:
    """All metrics of one worker process, in its own ``CollectorRegistry``."""

    def __init__(self, registry: CollectorRegistry | None = None, tools: Iterable[str] = ()):
        tools = tuple(tools)
        problem = metric_tools_problem(tools)
        if problem is not None:  # Settings refuses these first; a direct caller gets the same bound
            raise ValueError(f"metric tools: {problem}")
        # Tool names that keep their own `tool` label (GOOSE_INGEST_METRIC_TOOLS).
        self.named_tools: frozenset[str] = frozenset(tools)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # Optional upper bound for the `shard` label (set it to settings.shards); None: MAX_SHARDS.
        self.shards: int | None = None
        self._known_rules: frozenset[str] = frozenset()

        self.raw_entries = Counter(
            "goose_ingest_raw_entries",
            "Raw entries handled, by outcome (reason is set only for dead_lettered).",
            ["outcome", "reason"],
            registry=r,
        )
        self.dead_letters = Counter(
            "goose_ingest_dead_letters",
            "Raw entries written to the dead-letter stream, by reason.",
            ["reason"],
            registry=r,
        )
        self.events_total = Counter(
            "goose_ingest_events",
            "Harness events published, by type and by the input format of their run.",
            ["type", "format"],
            registry=r,
        )
        self.errors = Counter(
            "goose_ingest_errors",
            "Error harness events, by error class (closed vocabulary, docs/contract.md) and input format.",
            ["class", "format"],
            registry=r,
        )
        self.error_retries = Counter(
            "goose_ingest_error_retries",
            "Warnings announcing a retry of a failure (api_retry, retry, rate_limit), by error class and input format.",
            ["class", "format"],
            registry=r,
        )
        self.tool_events = Counter(
            "goose_ingest_tool_events",
            "Tool harness events, by bounded tool label and outcome.",
            ["tool", "outcome"],
            registry=r,
        )
        self.runs = Counter(
            "goose_ingest_runs",
            "Run lifecycle records published, by state and input format.",
            ["state", "format"],
            registry=r,
        )
        self.tokens = Counter(
            "goose_ingest_tokens",
            "Model tokens of finished runs (ended/abandoned records only), by kind.",
            ["kind"],
            registry=r,
        )
        self.cost = Counter(
            "goose_ingest_cost_usd",
            "Model cost in USD of finished runs (ended/abandoned records only).",
            registry=r,
        )
        self.redaction_counter = Counter(
            "goose_ingest_redactions",
            "Redactions applied, by configured rule.",
            ["rule"],
            registry=r,
        )
        self.pending_tool_eviction_counter = Counter(
            "goose_ingest_pending_tool_evictions",
            "Unanswered tool calls surfaced early as `unknown` because a run's pending calls passed a cap"
            " (count: MAX_PENDING_TOOLS, bytes: MAX_PENDING_TOOL_BYTES).",
            ["cap"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "goose_ingest_batch_seconds",
            "Time to process one batch of raw entries (read to ack).",
            buckets=BATCH_SECONDS_BUCKETS,
            registry=r,
        )
        self.batch_entries = Histogram(
            "goose_ingest_batch_entries",
            "Raw entries per processed batch.",
            buckets=BATCH_ENTRIES_BUCKETS,
            registry=r,
        )
        self.event_latency = Histogram(
            "goose_ingest_event_latency_seconds",
            "Time from a raw entry's publication to its harness events' publication.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.consumer_lag = Gauge(
            "goose_ingest_consumer_lag",
            "Entries of the shard's raw stream not yet delivered to the group (NaN: Redis cannot tell).",
            ["shard"],
            registry=r,
        )
        self.pending_entries = Gauge(
            "goose_ingest_pending_entries",
            "Entries delivered to the group but not yet acknowledged, by shard.",
            ["shard"],
            registry=r,
        )
        self.oldest_pending_age = Gauge(
            "goose_ingest_oldest_pending_age_seconds",
            "Age of the shard's oldest entry delivered but not acknowledged (0: nothing pending).",
            ["shard"],
            registry=r,
        )
        self.shard_damaged = Gauge(
            "goose_ingest_raw_shard_damaged",
            "1 while a raw shard shows damage no worker does (reason: deleted-unexpired, id-ahead).",
            ["shard", "reason"],
            registry=r,
        )
        self.worker_ready = Gauge(
            "goose_ingest_worker_ready",
            "1 while this worker is ready (connected, groups created, consuming), else 0.",
            registry=r,
        )
        self.active_runs = Gauge(
            "goose_ingest_active_runs",
            "Open runs (started, not ended or abandoned) in the broker's active-runs index; every worker reports "
            "the same fleet-wide count, so aggregate with max(), not sum().",
            registry=r,
        )
        # `group` is bounded by the consumer groups registered on the topics (the exporters' and
        # the operator's: docs/operations.md), not by data.
        self.topic_trimmed_unread = Counter(
            "goose_ingest_topic_trimmed_unread",
            "Topic entries a registered consumer group had not read, trimmed because they were older than "
            "TOPIC_MAX_UNREAD_HOURS (data that group will never see), by group.",
            ["group"],
            registry=r,
        )
        # Pages counted in runs and hosts (services/worker/spread.py): fleet-wide distinct counts kept in
        # Redis, so every worker reports the same value (aggregate with max(), not sum()). Never a run or
        # host label: the runs and hosts behind a number are found in the runbook's queries.
        self.class_runs = Gauge(
            "goose_ingest_error_class_runs",
            "Distinct runs with an error or retry warning of the class within ALERT_WINDOW_S (fleet-wide; max, not sum).",
            ["class"],
            registry=r,
        )
        self.class_hosts = Gauge(
            "goose_ingest_error_class_hosts",
            "Distinct hosts with an error or retry warning of the class within ALERT_WINDOW_S (fleet-wide; max, not sum).",
            ["class"],
            registry=r,
        )
        self.tool_failing_runs = Gauge(
            "goose_ingest_tool_failing_runs",
            "Distinct runs with a failed call of the tool within ALERT_WINDOW_S (fleet-wide; max, not sum).",
            ["tool"],
            registry=r,
        )
        self.tool_failing_hosts = Gauge(
            "goose_ingest_tool_failing_hosts",
            "Distinct hosts on which the tool failed more than half of at least 4 calls within ALERT_WINDOW_S (fleet-wide).",
            ["tool"],
            registry=r,
        )
        self.tool_calling_hosts = Gauge(
            "goose_ingest_tool_calling_hosts",
            "Distinct hosts that called the tool (success or failure) within ALERT_WINDOW_S (fleet-wide; max, not sum).",
            ["tool"],
            registry=r,
        )
        # GooseIngestErrorSpike's second reading, in hosts: a host's volume moves neither number by more than one.
        self.hosts_active = Gauge(
            "goose_ingest_hosts_active",
            "Distinct hosts with any harness event within ALERT_WINDOW_S (fleet-wide; max, not sum).",
            registry=r,
        )
        self.hosts_with_errors = Gauge(
            "goose_ingest_hosts_with_errors",
            "Distinct hosts with an `error` event within ALERT_WINDOW_S (fleet-wide; max, not sum).",
            registry=r,
        )
        self.alert_min_runs = Gauge(
            "goose_ingest_alert_min_runs",
            "ALERT_MIN_RUNS: the distinct runs an error-class or tool alert needs (the rules read it).",
            registry=r,
        )
        self.alert_min_hosts = Gauge(
            "goose_ingest_alert_min_hosts",
            "ALERT_MIN_HOSTS: the distinct hosts an error-class or tool alert needs (the rules read it).",
            registry=r,
        )
        self.shard_leases = Gauge(
            "goose_ingest_shard_leases_held",
            "Raw shards this worker holds the lease of (reads and commits); summed over workers: the shards being read.",
            registry=r,
        )

        # Pre-initialise every bounded series at 0, so rate()/increase() see the first increment.
        self._raw_children = {o: self.raw_entries.labels(o, "") for o in RAW_OUTCOMES if o != "dead_lettered"}
        self._raw_children[OTHER] = self.raw_entries.labels(OTHER, "")
        self._dl_raw_children = {
            reason: self.raw_entries.labels("dead_lettered", reason) for reason in DEAD_LETTER_REASONS + (OTHER,)
        }
        self._dl_children = {reason: self.dead_letters.labels(reason) for reason in DEAD_LETTER_REASONS + (OTHER,)}
        self._event_children = {
            (t, fmt): self.events_total.labels(t, fmt) for t in EVENT_TYPES for fmt in FORMAT_LABELS
        }
        self._error_children = {
            (cls, fmt): self.errors.labels(cls, fmt) for cls in ERROR_CLASSES for fmt in FORMAT_LABELS
        }
        self._retry_children = {
            (cls, fmt): self.error_retries.labels(cls, fmt) for cls in ERROR_CLASSES for fmt in FORMAT_LABELS
        }
        self._tool_children = {
            (tool, outcome): self.tool_events.labels(tool, outcome)
            for tool in (*TOOL_LABELS, *sorted(self.named_tools)) for outcome in TOOL_OUTCOMES
        }
        self._run_children = {(s, fmt): self.runs.labels(s, fmt) for s in RUN_STATES for fmt in FORMAT_LABELS}
        self._token_children = {kind: self.tokens.labels(kind) for kind in TOKEN_KINDS}
        self._eviction_children = {cap: self.pending_tool_eviction_counter.labels(cap) for cap in PENDING_TOOL_CAPS}
        for cls in ERROR_CLASSES:
            self.class_runs.labels(cls)
            self.class_hosts.labels(cls)
        for tool in self.tool_labels():
            for gauge in (self.tool_failing_runs, self.tool_failing_hosts, self.tool_calling_hosts):
                gauge.labels(tool)
        self.worker_ready.set(0)

    # --- configuration ---------------------------------------------------------------------
    @property
    def known_rules(self) -> frozenset[str]:
        """Configured redaction rule names; empty: any rule name is accepted as its own label."""
        return self._known_rules

    @known_rules.setter
    def known_rules(self, rules: Iterable[str]) -> None:
        self._known_rules = frozenset(rules)
        for rule in self._known_rules:
            self.redaction_counter.labels(rule)

    # --- counters --------------------------------------------------------------------------
    def raw(self, outcome: str, n: int = 1, reason: str | None = None) -> None:
        n = _count(n)
        if not n:
            return
        if outcome == "dead_lettered":
            key = reason if reason in _DL_REASONS else OTHER
            self._dl_raw_children[key].inc(n)
            self._dl_children[key].inc(n)
            return
        self._raw_children[outcome if outcome in _RAW_OUTCOMES else OTHER].inc(n)

    def events(self, events: Iterable[Mapping[str, Any]], fmt: str | None = None) -> None:
        """Count events of runs in input format `fmt` (None: not decided yet)."""
        flabel = _format_label(fmt)
        by_type: _Tally[str] = _Tally()
        by_tool: _Tally[tuple[str, str]] = _Tally()
        errors: _Tally[str] = _Tally()
        retries: _Tally[str] = _Tally()
        for ev in events:
            t = ev.get("type")
            by_type[t if t in _EVENT_TYPES else OTHER] += 1
            if t in TOOL_EVENT_TYPES or (t == "unknown" and "tool" in ev):
                by_tool[(tool_label(ev.get("tool"), self.named_tools), tool_outcome(ev))] += 1
            elif t == "error":
                errors[_error_class(ev)] += 1
            elif t == "warning" and "errorClass" in ev:
                retries[_error_class(ev)] += 1
        for cls, n in errors.items():
            child = self._error_children.get((cls, flabel))
            if child is None:  # the `other` format label
                child = self._error_children[(cls, flabel)] = self.errors.labels(cls, flabel)
            child.inc(n)
        for cls, n in retries.items():
            child = self._retry_children.get((cls, flabel))
            if child is None:
                child = self._retry_children[(cls, flabel)] = self.error_retries.labels(cls, flabel)
            child.inc(n)
        for t, n in by_type.items():
            child = self._event_children.get((t, flabel))
            if child is None:
                child = self._event_children[(t, flabel)] = self.events_total.labels(t, flabel)
            child.inc(n)
        for key, n in by_tool.items():
            self._tool_children[key].inc(n)

    def run_record(self, record: Mapping[str, Any]) -> None:
        state = record.get("state")
        if state not in _RUN_STATES:
            state = OTHER
        fmt = _format_label(record.get("format"))
        child = self._run_children.get((state, fmt))
        if child is None:
            child = self._run_children[(state, fmt)] = self.runs.labels(state, fmt)
        child.inc()
        # Only terminal records carry the run's final usage; `completed` ones may be superseded.
        if state not in TERMINAL_RUN_STATES:
            return
        for field, kind in TOKEN_FIELDS:
            n = _count(record.get(field))
            if n:
                self._token_children[kind].inc(n)
        cost = record.get("costUsd")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost > 0:
            self.cost.inc(float(cost))

    def redactions(self, rule: str, n: int = 1) -> None:
        n = _count(n)
        if not n:
            return
        if self._known_rules and rule not in self._known_rules:
            rule = OTHER
        elif not isinstance(rule, str) or not rule:
            rule = OTHER
        self.redaction_counter.labels(rule).inc(n)

    def pending_tool_evictions(self, cap: str, n: int = 1) -> None:
        n = _count(n)
        child = self._eviction_children.get(cap)
        if n and child is not None:  # an unknown cap is a bug of the core, never a new series
            child.inc(n)

    # --- histograms ------------------------------------------------------------------------
    def observe_batch(self, seconds: float, entries: int) -> None:
        self.batch_seconds.observe(max(0.0, float(seconds)))
        self.batch_entries.observe(max(0, int(entries)))

    def observe_latency(self, seconds: float) -> None:
        # Clock skew between a tap and the worker can make this negative: clamp to 0.
        self.event_latency.observe(max(0.0, float(seconds)))

    # --- gauges ----------------------------------------------------------------------------
    def _shard_label(self, shard: int) -> str:
        limit = self.shards if self.shards is not None else MAX_SHARDS
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < limit:
            return OTHER
        return str(shard)

    def set_backlog(self, shard: int, lag: int | None, pending: int, oldest_pending_age_s: float | None = None) -> None:
        label = self._shard_label(shard)
        # lag None: Redis cannot compute it (e.g. entries deleted inside the group's window): NaN.
        self.consumer_lag.labels(label).set(float("nan") if lag is None else lag)
        self.pending_entries.labels(label).set(pending)
        if oldest_pending_age_s is not None:
            # Clock skew between Redis ids and now can make it negative: clamp to 0.
            self.oldest_pending_age.labels(label).set(max(0.0, float(oldest_pending_age_s)) if pending else 0.0)

    def set_shard_damage(self, found: dict[int, list[str]], reasons: tuple[str, ...]) -> None:
        """Every shard's series of each of ``reasons`` (a fixed set): 1 where ``found`` says so, else 0."""
        shards = range(self.shards) if self.shards is not None else sorted(found)
        for shard in shards:
            label = self._shard_label(shard)
            for reason in reasons:
                self.shard_damaged.labels(label, reason).set(1 if reason in found.get(shard, ()) else 0)

    def set_ready(self, ready: bool) -> None:
        self.worker_ready.set(1 if ready else 0)

    def set_active_runs(self, count: int) -> None:
        self.active_runs.set(count)

    def seen_topic_group(self, group: str) -> None:
        """A registered group exists: its trimmed-unread series starts at 0 (so increase() sees the first)."""
        self.topic_trimmed_unread.labels(group)

    def trimmed_unread(self, group: str, n: int) -> None:
        self.topic_trimmed_unread.labels(group).inc(_count(n))

    def set_leases(self, held: int) -> None:
        self.shard_leases.set(held)

    def tool_labels(self) -> tuple[str, ...]:
        """Every `tool` label this worker can report (bounded: base names, mcp, other, named tools)."""
        return (*TOOL_LABELS, *sorted(self.named_tools))

    def set_alert_thresholds(self, min_runs: int, min_hosts: int) -> None:
        self.alert_min_runs.set(min_runs)
        self.alert_min_hosts.set(min_hosts)

    def set_spread(self, family: str, kind: str, label: str, count: int) -> None:
        """A runs/hosts gauge (services/worker/spread.py); a label outside the bounded sets is dropped."""
        if family == "hosts":
            gauge_of_hosts = {"active": self.hosts_active, "errors": self.hosts_with_errors}.get(kind)
            if gauge_of_hosts is not None:
                gauge_of_hosts.set(count)
            return
        if family == "class" and label in _ERROR_CLASSES:
            gauge = self.class_runs if kind == "runs" else self.class_hosts
        elif family == "tool" and (label in TOOL_LABELS or label in self.named_tools):
            gauge = {"runs": self.tool_failing_runs, "hosts": self.tool_failing_hosts}.get(kind, self.tool_calling_hosts)
        else:
            return
        gauge.labels(label).set(count)
