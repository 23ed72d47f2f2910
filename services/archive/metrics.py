"""Prometheus metrics of one archive process (its own registry, served by services.metrics.server).

Every label value comes from DATASETS or FAILURE_KINDS: no shard, stream, bucket or key names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DATASETS = ("raw", "control", "events", "runs")  # the stream kinds the archive reads
FAILURE_KINDS = ("store", "broker")
WRITE_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ArchiveMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.entries = Counter(
            "goose_ingest_archive_entries_total", "Stream entries archived (written whole, then acknowledged), by dataset.",
            ["dataset"], registry=r,
        )
        self.bytes = Counter(
            "goose_ingest_archive_bytes_total", "Bytes of objects written to the archive (compressed Parquet), by dataset.",
            ["dataset"], registry=r,
        )
        self.segments = Counter(
            "goose_ingest_archive_segments_total", "Segments written and acknowledged, by dataset.", ["dataset"], registry=r,
        )
        self.write_seconds = Histogram(
            "goose_ingest_archive_segment_write_seconds", "Time to encode and write one segment's objects to the store.",
            ["dataset"], buckets=WRITE_SECONDS_BUCKETS, registry=r,
        )
        self.failures = Counter(
            "goose_ingest_archive_write_failures_total",
            "Failed attempts: store (an object write or listing failed; retried) or broker (read or acknowledge failed).",
            ["kind"], registry=r,
        )
        self.lag_seconds = Gauge(
            "goose_ingest_archive_lag_seconds",
            "Age of the oldest entry not yet archived (0: everything archived), by dataset, over all shards.",
            ["dataset"], registry=r,
        )
        self.lag_entries = Gauge(
            "goose_ingest_archive_lag_entries", "Entries not yet archived (undelivered + pending), by dataset, over all shards.",
            ["dataset"], registry=r,
        )
        self.lake_rejected = Counter(
            "goose_ingest_archive_lake_rejected_total",
            "Topic entries with no event-lake row (the PostgreSQL sink would dead-letter them; the raw segments keep the source).",
            registry=r,
        )
        self.lost = Counter(
            "goose_ingest_archive_lost_entries_total",
            "Pending entries gone from Redis before they were archived (deleted by hand, or Redis lost them).",
            ["dataset"], registry=r,
        )
        self.already_archived = Counter(
            "goose_ingest_archive_already_archived_total",
            "Entries read again that the store already held (a broker rollback, a lost group, a takeover): "
            "acknowledged without being written twice.",
            ["dataset"], registry=r,
        )
        self.broker_lost = Counter(
            "goose_ingest_archive_broker_lost_entries_total",
            "Archived raw and control entries the broker lost (it came back older than the archive): kept only in the archive.",
            ["dataset"], registry=r,
        )
        self.gaps = Counter(
            "goose_ingest_archive_gaps_total",
            "Streams found at start with their group past what the archive holds and nothing pending in between "
            "(entries acknowledged without being archived: the runbook's last resort, a group moved by hand).",
            ["dataset"], registry=r,
        )
        self.broker_rollbacks = Counter(
            "goose_ingest_archive_broker_changes_total",
            "Times the archive found its broker restarted, failed over, flushed or rolled back (run_id or its lease changed).",
            registry=r,
        )
        self.ready = Gauge("goose_ingest_archive_ready", "1 when the archive is writing and not behind.", registry=r)
        self.last_success = Gauge(
            "goose_ingest_archive_last_success_timestamp_seconds", "When a segment was last written and acknowledged.", registry=r,
        )
        for dataset in DATASETS:
            for family in (self.entries, self.bytes, self.segments, self.lost, self.already_archived, self.broker_lost, self.gaps):
                family.labels(dataset)
            self.lag_seconds.labels(dataset)
            self.lag_entries.labels(dataset)
        for kind in FAILURE_KINDS:
            self.failures.labels(kind)
