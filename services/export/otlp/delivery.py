"""The OTLP exporter's delivery: spans to the collector, retried while it is away, split per run
when it rejects a request (issue 33 item 5: one job of what was processor.py's `TraceExporter`).

It knows nothing of topics or of a run's state: it takes spans by run, answers the runs the
collector rejected (their spans kept in `rejected_spans` for the dead letter), and keeps the
batch's claim fresh while it waits (`HEARTBEAT`, set by the consumer around each batch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry.sdk.trace import ReadableSpan

from services.backoff import Backoff
from services.export.otlp.metrics import OtlpMetrics
from services.export.otlp.sink import SendOutcome, SpanSink
from services.settings import Settings
from services.streams.groups import RETRY_INITIAL_S

log = logging.getLogger("goose_ingest.export.otlp")

T = TypeVar("T")
# The heartbeat of the batch the current handler works on (keeps its claim fresh while it waits).
HEARTBEAT: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("otlp_heartbeat", default=None)


class Stopping(Exception):
    """The process is shutting down while a batch waits for the collector: leave it unacked."""


def beat_every_s(settings: Settings) -> float:
    """How often a waiting batch refreshes its claim: well within CLAIM_IDLE_MS, or a replica's
    reclaim takes it over."""
    return max(0.05, settings.claim_idle_ms / 3000)


class Delivery:
    def __init__(self, settings: Settings, sink: SpanSink, metrics: OtlpMetrics, stopping: asyncio.Event) -> None:
        self.settings = settings
        self.sink = sink
        self.metrics = metrics
        self.stopping = stopping  # the exporter's: a stop ends a wait for the collector (Stopping)
        self.collector_ok = True
        # One request at a time: the SDK exporter (its requests.Session) is not documented as
        # thread-safe, and the subscribers of all partitions share it.
        self._send_lock = asyncio.Lock()
        # The spans of each run the last `deliver` saw rejected: kept in its dead letter for a resend.
        self.rejected_spans: dict[str, list[ReadableSpan]] = {}

    async def deliver(
        self,
        spans_by_run: dict[str, list[tuple[str, ReadableSpan]]],
        heartbeat: Callable[[], Awaitable[None]] | None = None,
    ) -> dict[str, str]:
        """Export every run's spans; retry transient failures until they pass (or we stop).

        Returns the runs the collector rejected, with the reason. A rejected request of several
        runs is split per run so that one bad run never takes the others down with it.
        """
        pending = {run: spans for run, spans in spans_by_run.items() if spans}
        rejected: dict[str, str] = {}
        split = False
        backoff = Backoff(RETRY_INITIAL_S, self.settings.otlp_retry_max_s)
        attempts: dict[str, int] = {}
        while pending:
            groups = [[run] for run in pending] if split else [list(pending)]
            transient = False
            for group in groups:
                batch = [span for run in group for _, span in pending[run]]
                kinds = [kind for run in group for kind, _ in pending[run]]
                for run in group:
                    if attempts.get(run):
                        for kind, _ in pending[run]:
                            self.metrics.spans_retried.labels(kind=kind).inc()
                    attempts[run] = attempts.get(run, 0) + 1
                started = time.perf_counter()
                attempt = await self._beating(self._send(batch), heartbeat or HEARTBEAT.get())
                self.metrics.export_seconds.observe(time.perf_counter() - started)
                if attempt.outcome is SendOutcome.OK:
                    self._collector_back()
                    for kind in kinds:
                        self.metrics.spans_exported.labels(kind=kind).inc()
                    for run in group:
                        pending.pop(run)
                    continue
                for kind in kinds:
                    self.metrics.spans_failed.labels(kind=kind).inc()
                if attempt.outcome is SendOutcome.REJECTED:
                    self._collector_back()  # it answered
                    if len(group) == 1:
                        log.warning("collector rejected the spans of run %s: %s", group[0], attempt.detail)
                        rejected[group[0]] = attempt.detail
                        self.rejected_spans[group[0]] = [span for _, span in pending.pop(group[0])]
                    else:
                        split = True
                        break
                else:
                    # One line when it goes down and one when it is back (`_collector_back`): the
                    # retries in between are the metrics' (spans_retried), not the log's.
                    say = log.warning if self.collector_ok else log.debug
                    self.collector_ok = False
                    self.metrics.ready.set(0)  # at once; housekeeping sets it back when all is well
                    transient = True
                    say("collector unavailable (%s); %d spans wait, retrying with backoff up to %.0fs", attempt.detail,
                        len(batch), self.settings.otlp_retry_max_s)
                    break
            if pending and transient:
                # The claim is refreshed at least every CLAIM_IDLE_MS/3 however long the backoff: a
                # replica's reclaim would otherwise take the batch over (a delivery counted for an
                # outage, and the spans sent by both once the collector is back).
                beat = heartbeat or HEARTBEAT.get()
                most = beat_every_s(self.settings)
                left = backoff.next()
                while left > 0:
                    if beat is not None:
                        await beat()
                    step = min(left, most)
                    try:
                        await asyncio.wait_for(self.stopping.wait(), timeout=step)
                    except TimeoutError:
                        pass
                    if self.stopping.is_set():
                        raise Stopping()
                    left -= step
        return rejected

    def _collector_back(self) -> None:
        if not self.collector_ok:
            log.info("collector reachable again")
        self.collector_ok = True

    async def _send(self, batch: list[ReadableSpan]) -> Any:
        async with self._send_lock:
            return await asyncio.to_thread(self.sink.send, batch)

    async def _beating(self, work: Awaitable[T], beat: Callable[[], Awaitable[None]] | None) -> T:
        """Await `work` (waiting for the send lock, the SDK's own retries within its timeout: up to
        OTEL_EXPORTER_OTLP_TIMEOUT) while refreshing the batch's claim every CLAIM_IDLE_MS/3, so
        no replica takes over a batch that is only slow."""
        if beat is None:
            return await work
        task = asyncio.ensure_future(work)
        most = beat_every_s(self.settings)
        while True:
            done, _ = await asyncio.wait({task}, timeout=most)
            if done:
                return task.result()
            await beat()
