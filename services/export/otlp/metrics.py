"""Metrics of one OTLP exporter process (its own registry; every label from a fixed set)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from contracts.consumers import BY_NAME, OTLP

SPAN_KINDS = ("root", "tool")
TOPICS = ("events", "runs")
DEAD_LETTER_REASONS = BY_NAME[OTLP].reasons  # contracts/consumers.py
ROOT_CLOSE_REASONS = ("ended", "abandoned", "timeout")
EXPORT_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OtlpMetrics:
    """`registry` is what services.metrics.serve exposes on /metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.spans_exported = Counter(
            "goose_ingest_otlp_spans_exported", "Spans the collector accepted, by kind (root, tool).", ["kind"], registry=r
        )
        self.spans_failed = Counter(
            "goose_ingest_otlp_spans_failed",
            "Spans in export attempts that failed (unreachable collector, 5xx, timeout, rejection), by kind.",
            ["kind"],
            registry=r,
        )
        self.spans_retried = Counter(
            "goose_ingest_otlp_spans_retried", "Spans sent again after a transient failure, by kind.", ["kind"], registry=r
        )
        self.spans_dead_lettered = Counter(
            "goose_ingest_otlp_spans_dead_lettered",
            "Spans not exported because their run's export was dead-lettered, by kind.",
            ["kind"],
            registry=r,
        )
        self.span_events = Counter(
            "goose_ingest_otlp_span_events", "Harness events kept as span events of their run's root.", registry=r
        )
        self.late_events = Counter(
            "goose_ingest_otlp_late_events",
            "Non-tool events that arrived after their run's root span was exported (not in the trace).",
            registry=r,
        )
        self.unmappable_events = Counter(
            "goose_ingest_otlp_unmappable_events", "Events that could not be mapped (kept as root span events).", registry=r
        )
        self.truncated_attributes = Counter(
            "goose_ingest_otlp_truncated_attributes", "Attribute values cut to the SDK's length limit.", registry=r
        )
        self.dropped_attributes = Counter(
            "goose_ingest_otlp_dropped_attributes", "Attributes dropped by the SDK's count limit.", registry=r
        )
        self.dropped_events = Counter(
            "goose_ingest_otlp_dropped_span_events", "Span events dropped by the SDK's event count limit.", registry=r
        )
        self.capped_events = Counter(
            "goose_ingest_otlp_state_capped_events",
            "Root span events kept without their attributes: the run's export state was at its byte cap.",
            registry=r,
        )
        self.broker_refusals = Counter(
            "goose_ingest_otlp_broker_refusals",
            "Broker commands of a batch refused (OOM, LOADING, READONLY, a topology change) or unreachable: retried in place.",
            registry=r,
        )
        self.dead_letters = Counter(
            "goose_ingest_otlp_dead_letters", "Entries written to the exporter's dead-letter stream, by reason.", ["reason"], registry=r
        )
        self.roots_closed = Counter(
            "goose_ingest_otlp_roots", "Root spans exported, by what closed them.", ["reason"], registry=r
        )
        self.export_seconds = Histogram(
            "goose_ingest_otlp_export_seconds", "Duration of one export request.", buckets=EXPORT_SECONDS_BUCKETS, registry=r
        )
        self.lag = Gauge(
            "goose_ingest_otlp_lag", "Topic entries not yet delivered to the exporter's group (summed over partitions).", ["topic"], registry=r
        )
        self.pending = Gauge(
            "goose_ingest_otlp_pending", "Entries delivered to the exporter's group but not acknowledged.", ["topic"], registry=r
        )
        self.open_runs = Gauge("goose_ingest_otlp_open_runs", "Runs whose root span is not exported yet.", registry=r)
        self.ready = Gauge("goose_ingest_otlp_ready", "1 while the exporter is ready (broker and collector reachable).", registry=r)
        for kind in SPAN_KINDS:
            for c in (self.spans_exported, self.spans_failed, self.spans_retried, self.spans_dead_lettered):
                c.labels(kind=kind)
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason=reason)
        for reason in ROOT_CLOSE_REASONS:
            self.roots_closed.labels(reason=reason)
        for topic in TOPICS:
            self.lag.labels(topic=topic)
            self.pending.labels(topic=topic)
