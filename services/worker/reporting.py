"""Batch results -> Prometheus metrics."""

from __future__ import annotations

from contracts.raw import DEAD
from services.metrics import Metrics
from services.worker.processor import BatchResult

LATENCY_SAMPLES_PER_BATCH = 50


def record_result(metrics: Metrics | None, result: BatchResult, seconds: float, entries: int) -> None:
    if metrics is None:
        return
    for outcome, n in result.outcomes.items():
        if outcome != DEAD:
            metrics.raw(outcome, n)
    for reason, n in result.dead.items():
        metrics.raw(DEAD, n, reason=reason)
    for fmt, events in result.events_by_format.items():
        metrics.events(events, fmt)
    for record in result.records:
        metrics.run_record(record)
    metrics.observe_batch(seconds, entries)
    for rule, n in result.redactions.items():
        metrics.redactions(rule, n)
    for cap, n in result.evictions.items():
        metrics.pending_tool_evictions(cap, n)
    # A uniform sample of each batch's entries estimates the latency distribution as well as all
    # of them would, at a fraction of the cost (entry counts are in the raw-entries counter).
    step = max(1, len(result.processed_ids) // LATENCY_SAMPLES_PER_BATCH)
    for ms in result.latencies_ms(step):
        metrics.observe_latency(ms / 1000.0)
