"""Prometheus metrics of one sink process (its own registry, served by services.metrics.server).

Every label value comes from the fixed tuples below: no run, stream or table names from data.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TABLES = ("events", "run_records")
OUTCOMES = ("inserted", "duplicate", "dead_lettered", "expired")
ERROR_KINDS = ("database", "broker", "rejected_row", "invalid_entry", "max_deliveries")
TOPICS = ("events", "runs")
BATCH_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SinkMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rows = Counter(
            "goose_ingest_postgres_rows_total", "Topic entries handled by the PostgreSQL sink, by table and outcome.",
            ["table", "outcome"], registry=r,
        )
        self.batches = Counter("goose_ingest_postgres_batches_total", "Batches committed.", registry=r)
        self.batch_seconds = Histogram(
            "goose_ingest_postgres_batch_seconds", "Time to write and acknowledge one batch.",
            buckets=BATCH_SECONDS_BUCKETS, registry=r,
        )
        self.errors = Counter(
            "goose_ingest_postgres_errors_total",
            "Failures: database/broker unavailable (retried), rows refused or entries invalid (dead-lettered).",
            ["kind"], registry=r,
        )
        self.ready = Gauge("goose_ingest_postgres_ready", "1 when the last write succeeded and nothing is failing.", registry=r)
        self.lag = Gauge(
            "goose_ingest_postgres_lag_entries", "Entries of the topic not yet delivered to the sink's group (all partitions).",
            ["topic"], registry=r,
        )
        self.pending = Gauge(
            "goose_ingest_postgres_pending_entries", "Entries delivered to the sink's group but not acknowledged.",
            ["topic"], registry=r,
        )
        self.clamped = Counter(
            "goose_ingest_postgres_clamped_timestamps_total",
            "Events whose time was before 2000 or more than a day ahead: filed under their topic entry's time.",
            registry=r,
        )
        self.partitions_dropped = Counter(
            "goose_ingest_postgres_partitions_dropped_total", "Monthly events partitions dropped by retention.", registry=r,
        )
        for table in TABLES:
            for outcome in OUTCOMES:
                self.rows.labels(table, outcome)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        for topic in TOPICS:
            self.lag.labels(topic)
            self.pending.labels(topic)
