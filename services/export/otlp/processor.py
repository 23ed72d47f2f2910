"""The OTLP exporter's shell: topic batches in, spans out, per-run state in the broker.

Per run and consumer group, a hash at ``layout.export_group_state("otlp", group, run)`` holds what
a root span needs until the run ends, so any replica can finish any run and a crash resumes where
the acks stopped. Each group has its own (issue 20 item 5): two groups (two backends, a re-export
from scratch) each export every root. Its size is bounded whatever the run's length (issue 22 §3):

- ``r:<k>``  the run's lifecycle records (folded by `mapping.fold_records`), ``rn`` = 1 + highest k;
- ``v:<slot>`` the root's span events, a ring of ``ring`` slots (slot = seq mod ring; a slot keeps
  the highest seq it was offered), each ``<seq> <event JSON>`` of at most `STATE_EVENT_BYTES` / ring
  bytes (a larger event is kept without its attributes); ``ne`` how many distinct non-tool events came;
- which seqs were seen, for counting each event once: ``w`` (every seq below it was seen) and
  ``s:<seq>`` marks above it (``sc`` of them, at most `SEEN_WINDOW`: past it, ``w`` jumps to the
  lowest mark, and a seq below that arriving later is taken as seen);
- ``n`` how many distinct events were seen, ``exp`` how many the terminal record says there are,
  ``first``/``last`` the earliest/latest event time;
- ``done`` (root exported: why) or ``dead`` (the run's export was dead-lettered: why);
- ``legacy``: state adopted from an exporter of before (one state for every group; ``e:<seq>``,
  ``t:<seq>`` fields, unbounded), finished as it was written.

A root is exported when the terminal record is in and ``n >= exp`` (events and records come from
different streams, in any order), or by the timeout sweep. Nothing is acknowledged before the
spans it carries are accepted by the collector (or dead-lettered).

What a batch brings per run (entries decoded, `RunWork`, `RunFlags`) is services/export/otlp/batch.py;
the span mapping is mapping.py; the consumer plumbing (dead letters, readiness, the watch, backoff)
is services/streams/.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from functools import partial
from importlib import resources
from typing import Any, TypeVar

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts.deadletters import INVALID_ENTRY, MAX_DELIVERIES, OTLP_REJECTED, DeadLetter
from services.backoff import Backoff
from services.broker.errors import TRANSIENT_CODES, describe, reply_code
from services.export.otlp.batch import Decoded, RunFlags, RunWork, as_text, decode_entry
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
from services.export.otlp.sink import SendOutcome, SpanSink, encode_request
from services.settings import Settings
from services.streams.deadletter import DeadLetterWriter
from services.streams.groups import create_groups
from services.streams.lag import read_backlog
from services.streams.pending import max_deliveries_detail, pending_entries, plan_reclaim

log = logging.getLogger("goose_ingest.export.otlp")

EXPORTER = "otlp"
RETRY_INITIAL_S = 0.5
DETAIL_CHARS = 1000
# Bounds of a run's export state (issue 22 §3): the root keeps at most `ring` span events (the SDK's
# event count limit, OTEL_SPAN_EVENT_COUNT_LIMIT, within [1, MAX_RING]), of at most STATE_EVENT_BYTES
# in all (an equal share per slot: which events keep their attributes never depends on arrival
# order); seen-marks of out-of-order seqs at most SEEN_WINDOW (a redelivery runs a batch or a few
# behind, far less than this).
DEFAULT_RING = 128
MAX_RING = 10_000
STATE_EVENT_BYTES = 4 * 1024 * 1024
SEEN_WINDOW = 10_000
CAPPED_REASON = "state-bytes-cap"
T = TypeVar("T")
# The heartbeat of the batch the current handler works on (keeps its claim fresh while it waits).
_HEARTBEAT: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("otlp_heartbeat", default=None)

# The broker-side halves of a run's state, in .lua files beside this module (each file says its
# KEYS, ARGV and reply): recording a batch, adopting a state of before, closing a run.
_NOTE_LUA = resources.files("services.export.otlp").joinpath("note.lua").read_text()
_ADOPT_LUA = resources.files("services.export.otlp").joinpath("adopt.lua").read_text()
_CLOSE_LUA = resources.files("services.export.otlp").joinpath("close.lua").read_text()


class Stopping(Exception):
    """The process is shutting down while a batch waits for the collector: leave it unacked."""


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
        self.sink = sink
        self.cfg = cfg
        self.metrics = metrics if metrics is not None else OtlpMetrics()
        self.consumer = consumer
        self.group = settings.otlp_group
        self.collector_ok = True
        self.broker_ok = True  # False while the broker refuses this process's writes
        self.stopping = asyncio.Event()
        # One request at a time: the SDK exporter (its requests.Session) is not documented as
        # thread-safe, and the subscribers of all partitions share it.
        self._send_lock = asyncio.Lock()
        # The spans of each run the last `deliver` saw rejected: kept in its dead letter for a resend.
        self.rejected_spans: dict[str, list[ReadableSpan]] = {}
        # Entry ids a handler of this process is working on, per stream: the reclaim never takes
        # them back (a batch slower than CLAIM_IDLE_MS, e.g. a slow collector, would be handled
        # twice and its roots exported twice: issue 20, finding 5).
        self.in_flight: dict[str, set[str]] = {}
        self.state_ttl_s = max(1, int(settings.run_state_ttl_hours * 3600))
        events_limit = cfg.limits.max_events
        self.ring = min(MAX_RING, events_limit) if isinstance(events_limit, int) and events_limit > 0 else DEFAULT_RING
        self._note = client.register_script(_NOTE_LUA)
        self._close = client.register_script(_CLOSE_LUA)
        self._adopt = client.register_script(_ADOPT_LUA)
        # Dead letters and the acknowledgement of their entries in one step, trimmed by age (deadletter.py).
        self._letters = DeadLetterWriter(client, self.group, settings.deadletter_keep_hours)

    # ------------------------------------------------------------------ names
    def state_key(self, run: str) -> str:
        return self.layout.export_group_state(EXPORTER, self.group, run)

    def open_key(self, run: str) -> str:
        return self.layout.export_group_open_runs(EXPORTER, self.group, self.layout.shard_of(run))

    def open_sets(self) -> list[str]:
        return self.layout.export_group_open_run_sets(EXPORTER, self.group)

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
        """Runs left open by an exporter of before (one state shared by every group) move into
        this group's state, so an upgrade loses no open root. The first exporter to start after
        the upgrade takes them all (before, every group read and wrote that one state)."""
        adopted = 0
        for old_open in sorted(set(self.layout.export_open_runs(EXPORTER, i) for i in range(self.layout.shards))):
            while True:
                members = await self.client.zrange(old_open, 0, chunk - 1)
                if not members:
                    break
                for member in members:
                    run = as_text(member) or ""
                    keys = [self.layout.export_state(EXPORTER, run), old_open, self.state_key(run), self.open_key(run)]
                    adopted += int(await self._adopt(keys=keys, args=[member]))
        if adopted:
            log.info("adopted the export state of %d open runs from before per-group state (group %s)", adopted, self.group)
        return adopted

    # ------------------------------------------------------------------ delivery
    def _tally(self, tally: Tally) -> None:
        self.metrics.truncated_attributes.inc(tally.truncated_attributes)
        self.metrics.dropped_attributes.inc(tally.dropped_attributes)
        self.metrics.dropped_events.inc(tally.dropped_events)

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
                attempt = await self._beating(self._send(batch), heartbeat or _HEARTBEAT.get())
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
                beat = heartbeat or _HEARTBEAT.get()
                most = max(0.05, self.settings.claim_idle_ms / 3000)
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
        most = max(0.05, self.settings.claim_idle_ms / 3000)
        while True:
            done, _ = await asyncio.wait({task}, timeout=most)
            if done:
                return task.result()
            await beat()

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
            beat = _HEARTBEAT.get()
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
        spans = self.rejected_spans.pop(run, None)
        payload = encode_request(spans) if spans else None
        await self.dead_letter(stream, run, entry_id, OTLP_REJECTED, detail, payload, raw=raw, acks=acks)
        await self._broker(partial(self._close, keys=[self.state_key(run), self.open_key(run)],
                                   args=[run, "dead", detail[:DETAIL_CHARS], self.state_ttl_s]))

    # ------------------------------------------------------------------ batches
    async def _flags(self, work: dict[str, RunWork]) -> dict[str, RunFlags]:
        """The RunFlags of each run's state.

        complete: the root went out because every event its terminal record counts had been seen;
        sent: the seqs of this batch's tool events already seen. An event is noted seen only after
        its spans were accepted (`_finish_batch`), so the tool spans of a seen event, and all of a
        complete run's, are out already: a redelivery (a group recreated at 0, a batch re-read
        after a crash between the note and the ack) must not send them again. What stays is the
        window between the collector's acceptance and the note."""
        pipe = self.client.pipeline(transaction=False)
        runs = list(work)
        for run in runs:
            seqs = [seq for seq, _ in work[run].tool_spans]
            pipe.hmget(self.state_key(run), "done", "dead", "w", *[f"s:{q}" for q in seqs], *[f"t:{q}" for q in seqs])
        answers = await pipe.execute()
        out: dict[str, RunFlags] = {}
        for run, values in zip(runs, answers, strict=True):
            done, dead, mark = values[0], values[1], int(values[2] or 0)
            seqs = [seq for seq, _ in work[run].tool_spans]
            marks, legacy = values[3:3 + len(seqs)], values[3 + len(seqs):]
            sent = {q for q, m, t in zip(seqs, marks, legacy, strict=True) if q < mark or m is not None or t is not None}
            out[run] = RunFlags(done is not None, dead is not None, done is not None and done != b"timeout", sent)
        return out

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
        token = _HEARTBEAT.set(self._heartbeat(stream, [as_text(i) or str(i) for i in ids]))
        try:
            await self._handle_events(stream, ids, fields)
        finally:
            _HEARTBEAT.reset(token)
            held -= mine

    async def handle_runs(self, stream: str, ids: Sequence[Any], fields: Sequence[dict[Any, Any]]) -> None:
        held = self.in_flight.setdefault(stream, set())
        mine = {as_text(i) or str(i) for i in ids} - held
        held |= mine
        token = _HEARTBEAT.set(self._heartbeat(stream, [as_text(i) or str(i) for i in ids]))
        try:
            await self._handle_runs(stream, ids, fields)
        finally:
            _HEARTBEAT.reset(token)
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
            self._map_event(d, w)
        await self._finish_batch(stream, ids=acks, work=work)

    def _map_event(self, d: Decoded, w: RunWork) -> None:
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
                w.events[d.seq] = self._stored(bounded_event(span_event(body, self.cfg), self.cfg, tally))
                w.span_events += 1
            w.saw(ns)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            # Unmappable (malformed body, a newer contract's shape): a span event of the root.
            ev = unmappable_event(d.seq, w.max_ns or time.time_ns(), f"{type(exc).__name__}: {exc}"[:200])
            w.events[d.seq] = self._stored(ev)
            w.unmappable += 1
        self._tally(tally)

    def _stored(self, ev: StoredEvent) -> bytes:
        """An event as its ring slot holds it: within the slot's share of STATE_EVENT_BYTES, or kept
        with its name, time and ids only."""
        prefix = b"%d " % ev.seq
        value = prefix + ev.dumps()
        if len(value) <= STATE_EVENT_BYTES // self.ring:
            return value
        self.metrics.capped_events.inc()
        ids = {k: ev.attributes[k] for k in (GI_EVENT_ID, GI_EVENT_TYPE) if k in ev.attributes}
        return prefix + StoredEvent(ev.seq, ev.name, ev.time_ns, {**ids, GI_REASON: CAPPED_REASON}).dumps()

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
            flags = await self._broker(partial(self._flags, work))
            spans: dict[str, list[tuple[str, ReadableSpan]]] = {}
            for run, w in work.items():
                f = flags[run]
                if f.dead:
                    for _ in w.tool_spans:
                        self.metrics.spans_dead_lettered.labels(kind="tool").inc()
                    continue
                if f.complete:
                    continue  # its events were all in the root and its tool spans are out (see _flags)
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
                args: list[Any] = [
                    run,
                    now_ms,
                    "" if w.min_ns is None else w.min_ns,
                    "" if w.max_ns is None else w.max_ns,
                    "" if w.exp is None else w.exp,
                    self.ring,
                    SEEN_WINDOW,
                ]
                for k, record in w.records.items():
                    args.extend(("r", k, record))
                for seq, ev in w.events.items():
                    args.extend(("t", seq, b"") if ev is None else ("e", seq, ev))
                n, exp, closed = await self._broker(partial(self._note, keys=[self.state_key(run), self.open_key(run)], args=args))
                self.metrics.span_events.inc(w.span_events)
                self.metrics.unmappable_events.inc(w.unmappable)
                if not closed and exp >= 0 and n >= exp:
                    ready.append(run)
            for run in ready:
                w = work[run]
                await self.finish_root(run, stream, w.entry_ids[0], raw=w.raw, acks=w.entry_ids)
        await self._ack(stream, ids)

    # ------------------------------------------------------------------ roots
    async def _read_state(self, run: str) -> dict[str, bytes]:
        """What the root needs of a run's state: never the seen-marks, so the read stays as small
        as the ring however long the run (one HGETALL of a 200,000-event state blocked Redis 163 ms)."""
        key = self.state_key(run)
        head = ["done", "dead", "first", "last", "rn", "ne", "legacy"]
        values = await self.client.hmget(key, head)
        state = {name: v for name, v in zip(head, values, strict=True) if v is not None}
        if "legacy" in state:
            return {(as_text(k) or ""): v for k, v in (await self.client.hgetall(key)).items()}
        if not state or "done" in state or "dead" in state:
            return state
        names = [f"r:{k}" for k in range(int(state.get("rn") or 0))] + [f"v:{i}" for i in range(self.ring)]
        values = await self.client.hmget(key, names)
        state.update((name, v) for name, v in zip(names, values, strict=True) if v is not None)
        return state

    async def finish_root(self, run: str, stream: str, entry_id: str, timeout: bool = False,
                          raw: dict[Any, Any] | None = None, acks: Sequence[str] = ()) -> bool:
        """Export the run's root span from its state; False when it is closed already. `raw`, `acks`:
        the entry that completed the run and this batch's entries of it, for a dead letter."""
        state = await self._broker(partial(self._read_state, run))
        if not state or "done" in state or "dead" in state:
            await self._broker(partial(self.client.zrem, self.open_key(run), run))
            return False
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
        self._tally(tally)
        rejected = await self.deliver({run: [("root", span)]})
        if run in rejected:
            await self.kill_run(stream, run, entry_id, rejected[run], raw=raw, acks=acks)
            return False
        reason = "timeout" if timeout else (facts.state or "timeout")
        await self._broker(partial(self._close, keys=[self.state_key(run), self.open_key(run)],
                                   args=[run, "done", reason, self.state_ttl_s]))
        self.metrics.roots_closed.labels(reason=reason).inc()
        return True

    async def close_idle_roots(self, now_ms: int | None = None, limit: int = 100) -> int:
        """Close roots of runs without news for OTLP_ROOT_TIMEOUT_S (broker data lost): marked."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cutoff = now_ms - int(self.settings.otlp_root_timeout_s * 1000)
        closed = 0
        for key in self.open_sets():
            for member in await self.client.zrangebyscore(key, "-inf", cutoff, start=0, num=limit):
                run = as_text(member)
                if run is None:
                    continue
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
        open_runs = 0
        for key in self.open_sets():
            open_runs += await self.client.zcard(key)
        self.metrics.open_runs.set(open_runs)
        return total

    async def reclaim(self, stream: str, handler: Callable[[str, Sequence[Any], Sequence[dict[Any, Any]]], Awaitable[None]]) -> int:
        """Take over entries another consumer left pending too long; dead-letter poison ones."""
        idle = self.settings.claim_idle_ms
        rows = await self.client.xpending_range(stream, self.group, min="-", max="+", count=self.settings.batch_size, idle=idle)
        plan = plan_reclaim(pending_entries(rows), self.settings.max_deliveries, self.in_flight.get(stream, set()))
        for row in plan.poison:
            found = await self.client.xrange(stream, min=row.entry_id, max=row.entry_id)
            fields = found[0][1] if found else {}
            await self.dead_letter(stream, None, row.entry_id, MAX_DELIVERIES, max_deliveries_detail(row), raw=fields,
                                   acks=[row.entry_id])
        ids = [row.entry_id for row in plan.claim]
        if not ids:
            return len(plan.poison)
        claimed = await self.client.xclaim(stream, self.group, self.consumer, idle, ids)
        entries = [(eid, fmap) for eid, fmap in claimed if fmap is not None]
        gone = [i for i in ids if i not in {(as_text(e) or "") for e, _ in entries}]
        if gone:  # trimmed away while pending: nothing left to export
            await self._ack(stream, gone)
        if entries:
            await handler(stream, [e for e, _ in entries], [f for _, f in entries])
        return len(entries) + len(plan.poison)

    def handler_for(self, stream: str) -> Callable[[str, Sequence[Any], Sequence[dict[Any, Any]]], Awaitable[None]]:
        return self.handle_runs if stream in self.layout.runs_partitions() else self.handle_events
