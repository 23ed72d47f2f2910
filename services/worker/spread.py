"""Pages counted in runs and hosts, not lines (docs/operations.md "Pages counted in runs and hosts").

After each committed batch the worker adds the runs and the hosts that had a failure, per error
class (an `error` event or a retry `warning` carrying `errorClass`) and per tool, to sorted sets
in Redis shared by the whole fleet, each member scored with the time of its last failure. Every
worker drops the members older than ALERT_WINDOW_S and exports the sets' sizes as gauges
(`goose_ingest_error_class_runs`/`_hosts`, `goose_ingest_tool_failing_runs`/`_hosts`,
`goose_ingest_tool_calling_hosts`): distinct runs and hosts, whatever their volume. A run with
30 errors is one run; a host adding successes or exits is one host. The fleet's hosts with any
event and with an `error` event (`goose_ingest_hosts_active`, `goose_ingest_hosts_with_errors`)
are GooseIngestErrorSpike's second reading, a share of hosts that no host's volume can move by
more than one host.

A tool is failing *on a host* when it failed more than half of at least HOST_MIN_TOOL_CALLS of
that host's calls in the host's current window (a hash per tool and host, counting from its first
call for ALERT_WINDOW_S); the alert compares failing hosts with calling hosts, so a host's own
successes only ever change its own verdict.

Members are BLAKE2b digests of the run key and of the `host` label (a run without one counts as a
host of its own): Redis keeps no host name and no run key here, and every member has the same
size. The labels of the gauges are the bounded `class` and `tool` sets of the metrics registry.
Counting is best effort after the commit (idempotent: adding a member twice changes nothing): a
broker error here is logged and the batch stays committed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from contracts.events import ERROR_CLASSES
from services.metrics.registry import TOOL_EVENT_TYPES, Metrics, tool_label, tool_outcome
from services.settings import Settings

log = logging.getLogger(__name__)

# A host's verdict on a tool needs this many calls in its window: one failed call of two is no verdict.
HOST_MIN_TOOL_CALLS = 4
# A set not written for this many windows expires: a fleet gone quiet leaves nothing behind.
KEY_TTL_WINDOWS = 2
# (family, kind) of the sets: the runs and hosts of a class; a tool's failing runs, failing hosts, calling hosts.
CLASS_KINDS = ("runs", "hosts")
TOOL_KINDS = ("runs", "hosts", "calling")
# the fleet's hosts with any event and with an `error` event: GooseIngestErrorSpike's reading in hosts
HOST_KINDS = ("active", "errors")
_CLASSES = frozenset(ERROR_CLASSES)


def digest(text: str) -> str:
    """A fixed-size, one-way member for a run key or a host label."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


@dataclass
class Observation:
    """What one committed batch adds: members per class and per tool, and per (tool, host) tallies."""

    class_runs: dict[str, set[str]] = field(default_factory=dict)
    class_hosts: dict[str, set[str]] = field(default_factory=dict)
    tool_runs: dict[str, set[str]] = field(default_factory=dict)  # runs with a failed call
    tool_calls: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (tool, host) -> [calls, failures]
    active_hosts: set[str] = field(default_factory=set)  # hosts with any event
    error_hosts: set[str] = field(default_factory=set)  # hosts with an `error` event

    def __bool__(self) -> bool:
        return bool(self.active_hosts or self.class_runs or self.tool_calls)


def observe(events: Iterable[Mapping[str, Any]], hosts: Mapping[str, str | None],
            named_tools: frozenset[str] = frozenset()) -> Observation:
    """The failures of a batch's events by class and tool, with their runs' and hosts' digests."""
    obs = Observation()
    ids: dict[str, tuple[str, str]] = {}
    def ids_of(run: str) -> tuple[str, str]:
        pair = ids.get(run)
        if pair is None:
            host = hosts.get(run)
            pair = ids[run] = (digest(run), digest("host:" + host) if host else digest("run:" + run))
        return pair

    for ev in events:
        t = ev.get("type")
        cls: str | None = None
        outcome = ""
        run = ev.get("runId")
        if isinstance(run, str):
            host_d = ids_of(run)[1]
            obs.active_hosts.add(host_d)
            if t == "error":
                obs.error_hosts.add(host_d)
        if t == "error" or (t == "warning" and "errorClass" in ev):
            raw_cls = ev.get("errorClass")
            cls = raw_cls if isinstance(raw_cls, str) and raw_cls in _CLASSES else "other"
        elif t in TOOL_EVENT_TYPES:
            outcome = tool_outcome(ev)
            if outcome == "unknown":  # no answer yet: neither a call that worked nor one that failed
                continue
        else:
            continue
        if not isinstance(run, str):
            continue
        run_d, host_d = ids_of(run)
        if cls is not None:
            obs.class_runs.setdefault(cls, set()).add(run_d)
            obs.class_hosts.setdefault(cls, set()).add(host_d)
            continue
        tool = tool_label(ev.get("tool"), named_tools)
        tally = obs.tool_calls.setdefault((tool, host_d), [0, 0])
        tally[0] += 1
        if outcome == "failure":
            tally[1] += 1
            obs.tool_runs.setdefault(tool, set()).add(run_d)
    return obs


def host_failing(calls: int, failures: int) -> bool:
    return calls >= HOST_MIN_TOOL_CALLS and 2 * failures > calls


class Spread:
    """Records batches' failures in the fleet's sets and refreshes this worker's gauges from them."""

    def __init__(self, client: Any, settings: Settings, metrics: Metrics | None) -> None:
        self.client = client
        self.layout = settings.layout
        self.metrics = metrics
        self.window_ms = int(settings.alert_window_s * 1000)
        self.ttl_ms = self.window_ms * KEY_TTL_WINDOWS
        self.named_tools = metrics.named_tools if metrics is not None else frozenset()
        # 20 refreshes a window, at most every 5 s (the scrape interval's order), at least every 0.2 s
        self.refresh_interval_s = min(5.0, max(0.2, settings.alert_window_s / 20))
        self._failing = False  # the last write or refresh failed (logged once until one succeeds)
        if metrics is not None:
            metrics.set_alert_thresholds(settings.alert_min_runs, settings.alert_min_hosts)

    async def record(self, events: Iterable[Mapping[str, Any]], hosts: Mapping[str, str | None],
                     now_ms: int | None = None) -> None:
        obs = observe(events, hosts, self.named_tools)
        if not obs:
            return
        try:
            await self._write(obs, time.time_ns() // 1_000_000 if now_ms is None else now_ms)
        except RedisError as exc:
            self._failed("record", exc)

    async def _write(self, obs: Observation, now: int) -> None:
        layout, ttl = self.layout, self.ttl_ms
        tallies = list(obs.tool_calls.items())
        replies: list[Any] = []
        if tallies:
            pipe = self.client.pipeline(transaction=False)
            for (tool, host), (calls, failures) in tallies:
                key = layout.spread_tally(tool, host)
                pipe.hincrby(key, "calls", calls)
                pipe.hincrby(key, "failures", failures)
                pipe.pexpire(key, self.window_ms, nx=True)  # the host's window starts at its first call
            replies = await pipe.execute()
        pipe = self.client.pipeline(transaction=False)

        def add(key: str, members: Iterable[str]) -> None:
            pipe.zadd(key, {m: now for m in members})
            pipe.pexpire(key, ttl)

        if obs.active_hosts:
            add(layout.spread("hosts", "all", "active"), obs.active_hosts)
        if obs.error_hosts:
            add(layout.spread("hosts", "all", "errors"), obs.error_hosts)
        for cls, runs in obs.class_runs.items():
            add(layout.spread("class", cls, "runs"), runs)
            add(layout.spread("class", cls, "hosts"), obs.class_hosts[cls])
        for tool, runs in obs.tool_runs.items():
            add(layout.spread("tool", tool, "runs"), runs)
        for i, ((tool, host), _) in enumerate(tallies):
            add(layout.spread("tool", tool, "calling"), (host,))
            if host_failing(int(replies[3 * i]), int(replies[3 * i + 1])):
                add(layout.spread("tool", tool, "hosts"), (host,))
        await pipe.execute()
        self._recovered()

    def _sets(self) -> list[tuple[str, str, str]]:
        tools = self.metrics.tool_labels() if self.metrics is not None else ()
        return ([("hosts", "all", kind) for kind in HOST_KINDS]
                + [("class", cls, kind) for cls in ERROR_CLASSES for kind in CLASS_KINDS]
                + [("tool", tool, kind) for tool in tools for kind in TOOL_KINDS])

    async def refresh(self, now_ms: int | None = None) -> dict[tuple[str, str, str], int]:
        """Drop members older than the window from every set and set the gauges to the sizes."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        sets = self._sets()
        pipe = self.client.pipeline(transaction=False)
        for family, label, kind in sets:
            key = self.layout.spread(family, label, kind)
            pipe.zremrangebyscore(key, "-inf", now - self.window_ms)
            pipe.zcard(key)
        replies = await pipe.execute()
        sizes = {s: int(replies[2 * i + 1]) for i, s in enumerate(sets)}
        if self.metrics is not None:
            for (family, label, kind), n in sizes.items():
                self.metrics.set_spread(family, kind, label, n)
        self._recovered()
        return sizes

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except RedisError as exc:  # the broker's outage has its own alerts; the gauges keep their values
                self._failed("refresh", exc)
            await asyncio.sleep(self.refresh_interval_s)

    def _failed(self, what: str, exc: Exception) -> None:
        if not self._failing:
            log.warning("runs/hosts counts: %s failed (%s); retrying", what, type(exc).__name__)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.info("runs/hosts counts: the broker answers again")
        self._failing = False
