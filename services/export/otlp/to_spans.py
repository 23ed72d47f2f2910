"""The OTLP exporter's mapping glue (issue 33 item 5: one job of what was processor.py's
`TraceExporter`): a decoded topic entry into what a batch sends (tool spans) and keeps (the root's
span events, within a ring slot's bytes), and a run's stored state into its root span. The mapping
itself, pure, is mapping.py; this module counts what the mapping truncated or dropped.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan

from services.export.otlp import run_state
from services.export.otlp.batch import Decoded, RunWork
from services.export.otlp.mapping import (
    GI_EVENT_ID,
    GI_EVENT_TYPE,
    GI_REASON,
    MappingConfig,
    RootFacts,
    StoredEvent,
    Tally,
    bounded_event,
    fold_records,
    is_tool_span,
    ns_of,
    root_span,
    span_event,
    tool_span,
    unmappable_event,
)
from services.export.otlp.metrics import OtlpMetrics

CAPPED_REASON = "state-bytes-cap"


class SpanMapper:
    def __init__(self, cfg: MappingConfig, ring: int, metrics: OtlpMetrics) -> None:
        self.cfg = cfg
        self.ring = ring
        self.metrics = metrics

    def tally(self, tally: Tally) -> None:
        self.metrics.truncated_attributes.inc(tally.truncated_attributes)
        self.metrics.dropped_attributes.inc(tally.dropped_attributes)
        self.metrics.dropped_events.inc(tally.dropped_events)

    def map_event(self, d: Decoded, w: RunWork) -> None:
        """An event entry into its run's work: a tool span to send, or a span event of the root."""
        assert d.seq is not None
        tally = Tally()
        body = d.body
        try:
            if body is None:
                raise ValueError(d.error or "no data")
            ns = ns_of(body["timestamp"])
            if is_tool_span(body):
                w.tool_spans.append((d.seq, tool_span(body, self.cfg, tally)))
                w.events[d.seq] = None
            else:
                w.events[d.seq] = self.stored(bounded_event(span_event(body, self.cfg), self.cfg, tally))
                w.span_events += 1
            w.saw(ns)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            # Unmappable (malformed body, a newer contract's shape): a span event of the root.
            ev = unmappable_event(d.seq, w.max_ns or time.time_ns(), f"{type(exc).__name__}: {exc}"[:200])
            w.events[d.seq] = self.stored(ev)
            w.unmappable += 1
        self.tally(tally)

    def stored(self, ev: StoredEvent) -> bytes:
        """An event as its ring slot holds it: within the slot's share of STATE_EVENT_BYTES, or kept
        with its name, time and ids only."""
        prefix = b"%d " % ev.seq
        value = prefix + ev.dumps()
        if len(value) <= run_state.STATE_EVENT_BYTES // self.ring:
            return value
        self.metrics.capped_events.inc()
        ids = {k: ev.attributes[k] for k in (GI_EVENT_ID, GI_EVENT_TYPE) if k in ev.attributes}
        return prefix + StoredEvent(ev.seq, ev.name, ev.time_ns, {**ids, GI_REASON: CAPPED_REASON}).dumps()

    def root(self, run: str, state: dict[str, Any], timeout: bool) -> tuple[ReadableSpan, RootFacts]:
        """The root span of a run from its state (run_state.RunStates.read), and the facts its
        records folded into."""
        records: list[dict[str, Any]] = []
        events: list[StoredEvent] = []
        for name, value in state.items():
            if name.startswith("r:"):
                records.append(orjson.loads(value))
            elif name.startswith("v:"):
                events.append(StoredEvent.loads(value.partition(b" ")[2]))
            elif name.startswith("e:"):  # legacy state
                events.append(StoredEvent.loads(value))
        try:
            facts = fold_records(run, records)
        except (KeyError, ValueError, TypeError, IndexError):  # stored only after validation; belt and braces
            facts = RootFacts(run)
        first = int(state["first"]) if state.get("first") else None
        last = int(state["last"]) if state.get("last") else None
        tally = Tally()
        span = root_span(facts, events, self.cfg, tally, first_ns=first, last_ns=last, closed_by_timeout=timeout)
        if "legacy" not in state:  # events the ring let go: as the SDK's event limit would have
            tally.dropped_events += max(0, int(state.get("ne") or 0) - len(events))
        self.tally(tally)
        return span, facts
