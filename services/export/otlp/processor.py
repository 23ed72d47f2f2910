"""The OTLP exporter's consumer: topic batches in, spans out, acknowledged only once the spans they
carry are accepted by the collector (or dead-lettered).

`TraceExporter` is the consumer plumbing (issue 33 item 5 split the rest out by job): the batch
handlers and their heartbeat, the in-place retry of broker refusals, dead letters through the one
writer, the reclaim, the gauges, the order of a batch's steps. It composes:

- delivery.py (`Delivery`): spans to the collector, retried, split per run on a rejection;
- run_state.py (`RunStates`): the per-run state in the broker (its layout is described there);
- to_spans.py (`SpanMapper`): the mapping glue, entries into spans and a state into its root;
- batch.py: what a batch brings per run (`RunWork`, `RunFlags`); mapping.py: the span mapping.

A root is exported when the terminal record is in and ``n >= exp`` (events and records come from
different streams, in any order), or by the timeout sweep. The consumer runtime's parts (dead
letters, readiness, the watch, backoff) are services/streams/.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts.deadletters import INVALID_ENTRY, MAX_DELIVERIES, OTLP_REJECTED, DeadLetter
from services.backoff import Backoff
from services.broker.errors import TRANSIENT_CODES, describe, reply_code
from services.export.otlp.batch import RunWork, as_text, decode_entry
from services.export.otlp.delivery import HEARTBEAT, RETRY_INITIAL_S, Delivery, Stopping
from services.export.otlp.mapping import MappingConfig, fold_records
from services.export.otlp.metrics import OtlpMetrics
from services.export.otlp.run_state import EXPORTER, RunStates, ring_of
from services.export.otlp.sink import SpanSink, encode_request
from services.export.otlp.to_spans import SpanMapper
from services.settings import Settings
from services.streams.deadletter import DeadLetterWriter
from services.streams.groups import create_groups
from services.streams.lag import read_backlog
from services.streams.pending import drive_async, max_deliveries_detail, pending_page, reclaim

__all__ = ["EXPORTER", "Stopping", "TraceExporter"]  # what the app, the demo and the tests import from here

log = logging.getLogger("goose_ingest.export.otlp")

T = TypeVar("T")


class TraceExporter:
    def __init__(
        self,
        settings: Settings,
        client: Any,
        sink: SpanSink,
        cfg: MappingConfig,
        metrics: OtlpMetrics | None = None,
        consumer: str = "otlp",
    ) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.client = client
        self.cfg = cfg
        self.metrics = metrics if metrics is not None else OtlpMetrics()
        self.consumer = consumer
        self.group = settings.otlp_group
        self.broker_ok = True  # False while the broker refuses this process's writes
        self.stopping = asyncio.Event()
        self.delivery = Delivery(settings, sink, self.metrics, self.stopping)
        self.states = RunStates(settings, client, self.group, ring_of(cfg))
        self.spans = SpanMapper(cfg, self.states.ring, self.metrics)
        # Entry ids a handler of this process is working on, per stream: the reclaim never takes
        # them back (a batch slower than CLAIM_IDLE_MS, e.g. a slow collector, would be handled
        # twice and its roots exported twice: issue 20, finding 5).
        self.in_flight: dict[str, set[str]] = {}
        # Dead letters and the acknowledgement of their entries in one step, trimmed by age (deadletter.py).
        self._letters = DeadLetterWriter(client, self.group, settings.deadletter_keep_hours)

    @property
    def collector_ok(self) -> bool:
        """False from a failed send until one passes (delivery.py); /readyz reads it."""
        return self.delivery.collector_ok

    # ------------------------------------------------------------------ names
    def state_key(self, run: str) -> str:
        return self.states.key(run)

    def deadletter_key(self, run: str | None, stream: str) -> str:
        """The dead-letter partition of the shard of `stream` (the entry's: on a cluster the dead letter
        and the acknowledgement of its entry share a hash slot, one script), else of the run's."""
        partitions = self.layout.events_partitions() + self.layout.runs_partitions()
        if stream in partitions:
            shard = partitions.index(stream) % len(self.layout.events_partitions())
        else:  # no entry (a root closed by the timeout)
            shard = self.layout.shard_of(run) if run is not None else 0
        return self.layout.export_deadletter_partition(EXPORTER, shard)

    def streams(self) -> list[str]:
        return self.layout.events_partitions() + self.layout.runs_partitions()

    async def ensure_groups(self) -> None:
        """Our group on every partition, at id 0: export what the topics still retain.

        A broker that refuses the write for its own state (OOM at maxmemory, LOADING, READONLY, a
        topology change) is waited for, with one warning line, not a traceback: nothing is lost
        by starting later (issue 20, finding 3)."""
        await create_groups(self.client, self.streams(), self.group, self.settings.otlp_retry_max_s, self.stopping,
                            Stopping)

    async def adopt_legacy_state(self, chunk: int = 500) -> int:
        return await self.states.adopt_legacy(chunk)

    # ------------------------------------------------------------------ delivery
    async def deliver(
        self,
        spans_by_run: dict[str, list[tuple[str, ReadableSpan]]],
        heartbeat: Callable[[], Awaitable[None]] | None = None,
    ) -> dict[str, str]:
        """The runs the collector rejected, with the reason (delivery.py `Delivery.deliver`)."""
        return await self.delivery.deliver(spans_by_run, heartbeat)

    async def _broker(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run one broker command of a batch. While the broker refuses it for its own state (OOM at
        maxmemory, LOADING, READONLY, a topology change) or cannot be reached, wait and retry in
        place, holding the batch and keeping its claim fresh: an attempt the broker refused is not
        a delivery, so an outage never counts toward MAX_DELIVERIES, never dead-letters and never
        sends a span twice (issue 20 item 1, finding 3). Every command retried here is idempotent
        (the scripts count each event once; XACK; a dead letter's XADD refused was not written)."""
        # the claim must be refreshed well within CLAIM_IDLE_MS, or another replica takes it over
        most = max(0.05, min(self.settings.otlp_retry_max_s, self.settings.claim_idle_ms / 3000))
        backoff = Backoff(min(RETRY_INITIAL_S, most), most)
        refused = False
        while True:
            try:
                result = await call()
            except ResponseError as exc:
                if reply_code(exc) not in TRANSIENT_CODES:
                    raise
                reason = describe(exc)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                reason = describe(exc)
            else:
                if refused:
                    self.broker_ok = True
                    log.info("the broker accepts the batch's writes again")
                return result
            if not refused:
                log.warning("the broker refuses a write of a batch (%s); the batch waits, retried in place", reason)
                refused = True
            self.broker_ok = False
            self.metrics.ready.set(0)
            self.metrics.broker_refusals.inc()
            beat = HEARTBEAT.get()
            if beat is not None:
                await beat()
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=backoff.next())
            except TimeoutError:
                pass
            if self.stopping.is_set():
                raise Stopping()

    async def dead_letter(self, stream: str, run: str | None, entry_id: str, reason: str, detail: str,
                          payload: bytes | None = None, raw: dict[Any, Any] | None = None,
                          acks: Sequence[str] = ()) -> None:
        """Dead-letter an entry and acknowledge `acks` (ids of `stream`) in the same step (the one
        writer: services/streams/deadletter.py); `raw`: the entry's own fields (raw.*, for a resend
        after a fix). The refused spans travel as the OTLP/HTTP protobuf request body (`payload`):
        resent as-is after a fix (docs/otel.md "Resending dead-lettered spans")."""
        letter = DeadLetter(reason, detail, stream, entry_id, exporter=EXPORTER, group=self.group, run=run,
                            raw=raw or {}, payload=payload,
                            content_type="application/x-protobuf" if payload is not None else None)
        await self._broker(partial(self._letters.write, self.deadletter_key(run, stream), [letter],
                                   {stream: list(acks)} if acks else None))
        self.metrics.dead_letters.labels(reason=reason).inc()

    async def kill_run(self, stream: str, run: str, entry_id: str, detail: str, raw: dict[Any, Any] | None = None,
                       acks: Sequence[str] = ()) -> None:
        """Dead-letter a run's export: nothing more of it is sent, its later entries are acked (`acks`,
        this batch's entries of the run: with the dead letter, in one step)."""
        spans = self.delivery.rejected_spans.pop(run, None)
        payload = encode_request(spans) if spans else None
        await self.dead_letter(stream, run, entry_id, OTLP_REJECTED, detail, payload, raw=raw, acks=acks)
        await self._broker(partial(self.states.close, run, "dead", detail))

    # ------------------------------------------------------------------ batches
    def _heartbeat(self, stream: str, ids: Sequence[str]) -> Callable[[], Awaitable[None]]:
        async def beat() -> None:
            # Keep our claim fresh while we wait for the collector, so that other replicas do
            # not reclaim entries this one still holds (they would meet the same collector).
            if ids:
                try:
                    await self.client.xclaim(stream, self.group, self.consumer, 0, list(ids), justid=True)
                except Exception:  # a lost heartbeat only risks a duplicate export (same ids)
                    log.debug("heartbeat claim failed", exc_info=True)

        return beat

    async def _ack(self, stream: str, ids: Sequence[str]) -> None:
        if ids:
            await self._broker(partial(self.client.xack, stream, self.group, *ids))

    async def handle_events(self, stream: str, ids: Sequence[Any], fields: Sequence[dict[Any, Any]]) -> None:
        held = self.in_flight.setdefault(stream, set())
        mine = {as_text(i) or str(i) for i in ids} - held
        held |= mine
        token = HEARTBEAT.set(self._heartbeat(stream, [as_text(i) or str(i) for i in ids]))
        try:
            await self._handle_events(stream, ids, fields)
        finally:
            HEARTBEAT.reset(token)
            held -= mine

    async def handle_runs(self, stream: str, ids: Sequence[Any], fields: Sequence[dict[Any, Any]]) -> None:
        held = self.in_flight.setdefault(stream, set())
        mine = {as_text(i) or str(i) for i in ids} - held
        held |= mine
        token = HEARTBEAT.set(self._heartbeat(stream, [as_text(i) or str(i) for i in ids]))
        try:
            await self._handle_runs(stream, ids, fields)
        finally:
            HEARTBEAT.reset(token)
            held -= mine

    async def _handle_events(self, stream: str, ids: Sequence[Any], fields: Sequence[dict[Any, Any]]) -> None:
        work: dict[str, RunWork] = {}
        acks: list[str] = []
        for entry_id, fmap in zip(ids, fields, strict=True):
            d = decode_entry(entry_id, fmap)
            acks.append(d.entry_id)
            if d.run is None or d.seq is None:
                await self.dead_letter(stream, d.run, d.entry_id, INVALID_ENTRY, d.error or "no runId or seq",
                                       raw=fmap, acks=[d.entry_id])
                continue
            w = work.setdefault(d.run, RunWork())
            w.note_entry(d.entry_id, fmap)
            self.spans.map_event(d, w)
        await self._finish_batch(stream, ids=acks, work=work)

    async def _handle_runs(self, stream: str, ids: Sequence[Any], fields: Sequence[dict[Any, Any]]) -> None:
        work: dict[str, RunWork] = {}
        acks: list[str] = []
        for entry_id, fmap in zip(ids, fields, strict=True):
            d = decode_entry(entry_id, fmap)
            acks.append(d.entry_id)
            body = d.body
            try:
                if d.run is None or body is None:
                    raise ValueError(d.error or "no runId")
                facts = fold_records(d.run, [body])  # validates recordId, timestamp
            except (KeyError, ValueError, TypeError, IndexError) as exc:
                await self.dead_letter(stream, d.run, d.entry_id, INVALID_ENTRY, d.error or f"{type(exc).__name__}: {exc}",
                                       raw=fmap, acks=[d.entry_id])
                continue
            w = work.setdefault(d.run, RunWork())
            w.note_entry(d.entry_id, fmap)
            w.records[facts.last_k] = orjson.dumps(body)
            if facts.expected_events is not None:
                w.exp = facts.expected_events
        await self._finish_batch(stream, ids=acks, work=work)

    async def _finish_batch(self, stream: str, ids: Sequence[str], work: dict[str, RunWork]) -> None:
        if work:
            flags = await self._broker(partial(self.states.flags, work))
            spans: dict[str, list[tuple[str, ReadableSpan]]] = {}
            for run, w in work.items():
                f = flags[run]
                if f.dead:
                    for _ in w.tool_spans:
                        self.metrics.spans_dead_lettered.labels(kind="tool").inc()
                    continue
                if f.complete:
                    continue  # its events were all in the root and its tool spans are out (see RunStates.flags)
                if f.done:
                    late = sum(1 for ev in w.events.values() if ev is not None)
                    self.metrics.late_events.inc(late)
                spans[run] = [("tool", span) for seq, span in w.tool_spans if seq not in f.sent]
            rejected = await self.deliver(spans, self._heartbeat(stream, ids))
            for run, detail in rejected.items():
                w = work[run]
                await self.kill_run(stream, run, w.entry_ids[0], detail, raw=w.raw, acks=w.entry_ids)
            ready: list[str] = []
            now_ms = int(time.time() * 1000)
            for run, w in work.items():
                if run in rejected or flags[run].done or flags[run].dead:
                    continue
                n, exp, closed = await self._broker(partial(self.states.note, run, w, now_ms))
                self.metrics.span_events.inc(w.span_events)
                self.metrics.unmappable_events.inc(w.unmappable)
                if not closed and exp >= 0 and n >= exp:
                    ready.append(run)
            for run in ready:
                w = work[run]
                await self.finish_root(run, stream, w.entry_ids[0], raw=w.raw, acks=w.entry_ids)
        await self._ack(stream, ids)

    # ------------------------------------------------------------------ roots
    async def finish_root(self, run: str, stream: str, entry_id: str, timeout: bool = False,
                          raw: dict[Any, Any] | None = None, acks: Sequence[str] = ()) -> bool:
        """Export the run's root span from its state; False when it is closed already. `raw`, `acks`:
        the entry that completed the run and this batch's entries of it, for a dead letter."""
        state = await self._broker(partial(self.states.read, run))
        if not state or "done" in state or "dead" in state:
            await self._broker(partial(self.states.forget_open, run))
            return False
        span, facts = self.spans.root(run, state, timeout)
        rejected = await self.deliver({run: [("root", span)]})
        if run in rejected:
            await self.kill_run(stream, run, entry_id, rejected[run], raw=raw, acks=acks)
            return False
        reason = "timeout" if timeout else (facts.state or "timeout")
        await self._broker(partial(self.states.close, run, "done", reason))
        self.metrics.roots_closed.labels(reason=reason).inc()
        return True

    async def close_idle_roots(self, now_ms: int | None = None, limit: int = 100) -> int:
        """Close roots of runs without news for OTLP_ROOT_TIMEOUT_S (broker data lost): marked."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cutoff = now_ms - int(self.settings.otlp_root_timeout_s * 1000)
        closed = 0
        for run in await self.states.idle(cutoff, limit):
            if await self.finish_root(run, "timeout", "-", timeout=True):
                closed += 1
        return closed

    # ------------------------------------------------------------------ housekeeping
    async def gauge(self) -> int:
        """Lag and pending gauges; returns the total lag (services/streams/lag.py: an unknown lag is counted)."""
        total = 0
        for topic, streams in (("events", self.layout.events_partitions()), ("runs", self.layout.runs_partitions())):
            lag = pending = 0
            for stream in streams:
                backlog = await read_backlog(self.client, stream, self.group)  # unknown lag: counted
                if backlog.missing:
                    continue
                pending += backlog.pending
                lag += backlog.lag or 0
            self.metrics.lag.labels(topic=topic).set(lag)
            self.metrics.pending.labels(topic=topic).set(pending)
            total += lag
        self.metrics.open_runs.set(await self.states.open_count())
        return total

    async def reclaim(self, stream: str, handler: Callable[[str, Sequence[Any], Sequence[dict[Any, Any]]], Awaitable[None]]) -> int:
        """Take over entries another consumer left pending too long; dead-letter poison ones (the
        one reclaim: services/streams/pending.py)."""
        idle = self.settings.claim_idle_ms
        rows = await drive_async(self.client, pending_page(stream, self.group, self.settings.batch_size, idle_ms=idle))
        found = await drive_async(self.client, reclaim(stream, self.group, self.consumer, rows, idle_ms=idle,
                                                       max_deliveries=self.settings.max_deliveries,
                                                       in_flight=self.in_flight.get(stream, set())))
        for poison in found.poison:
            await self.dead_letter(stream, None, poison.entry.entry_id, MAX_DELIVERIES, max_deliveries_detail(poison.row),
                                   raw=poison.entry.fields, acks=[poison.entry.entry_id])
        if found.claimed:
            await handler(stream, [e.entry_id for e in found.claimed], [e.fields for e in found.claimed])
        return len(found.claimed) + len(found.poison)

    def handler_for(self, stream: str) -> Callable[[str, Sequence[Any], Sequence[dict[Any, Any]]], Awaitable[None]]:
        return self.handle_runs if stream in self.layout.runs_partitions() else self.handle_events
