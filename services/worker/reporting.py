"""Batch results -> Prometheus metrics."""

from __future__ import annotations

from services.metrics import Metrics
from services.worker.batch import BatchResult


def record_result(metrics: Metrics | None, result: BatchResult, seconds: float, entries: int) -> None:
    if metrics is None:
        return
    for outcome, n in result.outcomes.items():
        if outcome != "dead_lettered":
            metrics.raw(outcome, n)
    for reason, n in result.dead.items():
        metrics.raw("dead_lettered", n, reason=reason)
    metrics.events(result.events)
    for record in result.records:
        metrics.run_record(record)
    metrics.observe_batch(seconds, entries)
    for rule, n in result.redactions.items():
        metrics.redactions(rule, n)
    for ms in result.latencies_ms:
        metrics.observe_latency(ms / 1000.0)
