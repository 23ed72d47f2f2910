"""The sink's imperative shell: read the topics with a consumer group, write, then acknowledge.

A plain reader thread and writer loop (not FastStream; see docs/analytics.md "Why a plain loop"):

1. reader: read a batch from every partition of `harness.events` and `harness.runs` (XREADGROUP;
   on start, first this consumer's own pending entries, i.e. what a killed predecessor of the same
   name had read but not acknowledged) and parse it (rows.py, pure);
2. writer: write it with the consumer positions in one transaction (store.py); while the
   database is unreachable, retry the same batch with backoff and report not ready: nothing is
   acknowledged, the topic keeps the data;
3. after the commit, in one MULTI per shard: dead letters (invalid entries, rows the database
   refused) to the sink's own dead-letter stream (`<deadletter>.postgres`, the only stream its
   `postgres-exporter` ACL user may write; never the workers' `goose.deadletter`), then XACK of
   the whole batch.

A crash between 2 and 3 re-delivers the batch; every write is idempotent, so that doubles nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts.deadletters import MAX_DELIVERIES, DeadLetter
from services.broker.errors import TRANSIENT_CODES, describe, reply_code
from services.export.postgres.metrics import SinkMetrics
from services.export.postgres.rows import (
    INVALID_ENTRY,
    SANE_AHEAD,
    EntryRef,
    Parsed,
    RefusedEntry,
    parse_topic_batch,
    rfc3339,
)
from services.export.postgres.store import Store, WriteResult, utcnow
from services.settings import Settings
from services.streams.groups import create_group_sync
from services.streams.lag import read_backlog_sync
from services.streams.pending import PendingEntry, max_deliveries_detail, pending_entries, plan_reclaim
from services.streams.readiness import READY, Readiness, not_ready

log = logging.getLogger("goose_ingest.export.postgres")

DEFAULT_GROUP = "goose-ingest-postgres"
EXPORTER = "postgres"  # its key names (contracts/keys.py) and ACL role (services/broker/acl.py)
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
MAINTENANCE_INTERVAL_S = 3600.0  # partitions ahead and retention
OWN_PENDING_PAGES = 10  # own pending entries checked at start: a few batches at most (queue of one + writer)
_BROKER_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

class TopicRow(NamedTuple):
    """One topic entry as read (not the raw `services.sequencer.Entry`): its partition, id and fields."""

    stream: str
    entry_id: str
    fields: dict[bytes, bytes]


def redact_dsn(dsn: str) -> str:
    """host:port/dbname of a DSN, safe to log (no user, no password, no other options)."""
    try:
        d = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparseable DSN)"
    return f"{d.get('host', 'localhost')}:{d.get('port', 5432)}/{d.get('dbname', '')}"


@dataclass(frozen=True)
class Batch:
    entries: list[TopicRow]
    parsed: Parsed
    refs: list[EntryRef]


@dataclass(frozen=True)
class SinkOptions:
    group: str
    consumer: str
    retention: timedelta
    batch_size: int
    block_ms: int
    claim_idle_ms: int
    sweep_interval_s: float


class Sink:
    """Two threads: the reader (XREADGROUP, claims, group recovery) hands batches to the writer
    (this thread: database writes, acknowledgements) through a queue of one, so reading and parsing
    batch N+1 overlaps with PostgreSQL writing batch N. Each side backs off on its own failures."""

    def __init__(self, settings: Settings, client: Any, store: Store, options: SinkOptions, metrics: SinkMetrics):
        self.settings = settings
        self.client = client
        self.store = store
        self.opts = options
        self.metrics = metrics
        layout = settings.layout
        events, runs = layout.events_partitions(), layout.runs_partitions()
        # Partition i of each topic belongs to shard i (one partition each on a single node): the
        # streams of one shard share a hash slot, so one MULTI per shard works on a cluster too.
        self.shards: list[list[str]] = [[e, r] for e, r in zip(events, runs, strict=True)]
        self.topic: dict[str, str] = {s: "events" for s in events} | {s: "runs" for s in runs}
        self.shard_of: dict[str, int] = {s: i for i, pair in enumerate(self.shards) for s in pair}
        self.next_id: dict[str, str] = {s: "0" for s in self.topic}  # own pending entries first
        self.stopping = threading.Event()
        self._batches: queue.Queue[Batch] = queue.Queue(maxsize=1)
        self._db_ok = False
        self._broker_ok = False
        # what /readyz says while not ready: the latest reason of each side, safe to show (no credentials)
        self._db_why = f"connecting to the database {redact_dsn(store.dsn)}"
        self._broker_why = "connecting to the broker"
        self._groups_ok = False
        self._own_poison_checked = False
        # Entry ids read and not yet acknowledged by this process (the writer's batch, the one
        # queued): the sweep never claims them back from ourselves. A batch held through a database
        # outage longer than CLAIM_IDLE_MS would otherwise be claimed again, each claim a delivery,
        # and the outage would push good entries toward MAX_DELIVERIES (services/streams/pending.py).
        self._held: dict[str, set[str]] = {s: set() for s in self.topic}
        self._held_lock = threading.Lock()
        self._setup_done = False
        self._last_sweep = 0.0
        self._last_maintenance = 0.0
        self._last_ping = 0.0

    # ------------------------------------------------------------------ state
    def is_ready(self) -> Readiness:
        """Ready, or not with the reason /readyz shows (services/streams/readiness.py)."""
        if self.stopping.is_set():
            return not_ready("stopping")
        if not self._db_ok:
            return not_ready(self._db_why)
        if not self._broker_ok:
            return not_ready(self._broker_why)
        return READY

    def _set(self, db: bool | None = None, broker: bool | None = None, why: str = "") -> None:
        if db is not None:
            self._db_ok = db
            if not db and why:
                self._db_why = why
        if broker is not None:
            self._broker_ok = broker
            if not broker and why:
                self._broker_why = why
        self.metrics.ready.set(1 if self.is_ready() else 0)

    def stop(self) -> None:
        self.stopping.set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless asked to stop; True when stopping."""
        return self.stopping.wait(seconds)

    # ------------------------------------------------------------------ setup
    def ensure_groups(self) -> None:
        for stream in self.topic:
            create_group_sync(self.client, stream, self.opts.group)  # at 0: export what the topics retain

    def _setup(self) -> None:
        applied = self.store.migrate()
        if applied:
            log.info("applied migrations %s", ", ".join(applied))
        self._maintain(force=True)
        self._setup_done = True
        self._set(db=True)

    def _maintain(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_maintenance < MAINTENANCE_INTERVAL_S:
            return
        dropped = self.store.maintain(utcnow(), self.opts.retention)
        for month in dropped:
            log.info("retention: dropped events partition %s", month)
        self.metrics.partitions_dropped.inc(len(dropped))
        self._last_maintenance = time.monotonic()

    # ------------------------------------------------------------------ writer (this thread)
    def run(self) -> None:
        reader = threading.Thread(target=self._reader, name="postgres-sink-reader", daemon=True)
        reader.start()
        try:
            self._writer()
        finally:
            self.stopping.set()
            reader.join(timeout=30)
            self._set(db=False, broker=False)

    def _writer(self) -> None:
        backoff = BACKOFF_START_S
        while not self.stopping.is_set():
            try:
                if not self._setup_done:
                    self._setup()
                self._maintain()
                try:
                    batch = self._batches.get(timeout=0.2)
                except queue.Empty:
                    self._ping()
                    continue
                if not self.process(batch):
                    return  # stopping while the database was down: nothing acknowledged
                backoff = BACKOFF_START_S
                continue
            except psycopg.Error as exc:
                self._db_failure(exc, backoff)
            if self._sleep(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _ping(self) -> None:
        """While idle, notice a database that went away (readiness), once per sweep interval."""
        if time.monotonic() - self._last_ping >= self.opts.sweep_interval_s:
            self._last_ping = time.monotonic()
            self.store.connect().execute("SELECT 1")
            self._set(db=True)

    def _db_failure(self, exc: psycopg.Error, backoff: float) -> None:
        self._set(db=False, why=f"database {redact_dsn(self.store.dsn)} failed: {_describe(exc)}")
        self.metrics.errors.labels("database").inc()
        log.warning("database %s failed: %s; retrying in %.1fs", redact_dsn(self.store.dsn), _describe(exc), backoff)
        self.store.close()
        self._setup_done = False

    # ------------------------------------------------------------------ reader thread
    def _reader(self) -> None:
        backoff = BACKOFF_START_S
        while not self.stopping.is_set():
            try:
                if not self._groups_ok:
                    self.ensure_groups()
                    self._groups_ok = True
                entries = self._sweep() or self._read()
                self._set(broker=True)
                backoff = BACKOFF_START_S
                if entries:
                    batch = self.prepare(entries)
                    self._hold(entries)
                    while not self.stopping.is_set():
                        try:
                            self._batches.put(batch, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                continue
            except _BROKER_ERRORS as exc:
                self._set(broker=False, why=f"broker unreachable ({type(exc).__name__})")
                self.metrics.errors.labels("broker").inc()
                log.warning("broker unreachable (%s); retrying in %.1fs", type(exc).__name__, backoff)
                self.next_id = {s: "0" for s in self.topic}  # re-read what we hold but did not ack
                self._groups_ok = False
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    log.error("broker refused a read: %s", exc)
                else:
                    # The broker lost the stream or the group (restart without persistence):
                    # recreate at 0 and re-read; the idempotent writes absorb what was exported.
                    log.warning("consumer group missing on a topic partition; recreating it at 0")
                self.next_id = {s: "0" for s in self.topic}
                self._groups_ok = False
            if self._sleep(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _hold(self, entries: list[TopicRow]) -> None:
        with self._held_lock:
            for row in entries:
                self._held[row.stream].add(row.entry_id)

    def _release(self, entries: list[TopicRow]) -> None:
        with self._held_lock:
            for row in entries:
                self._held[row.stream].discard(row.entry_id)

    def _drop_own_poison(self) -> None:
        """At start, before re-reading this consumer's own pending entries (a predecessor of the
        same name read them and died): those delivered more than MAX_DELIVERIES times (each
        restart's re-read is one) are dead-lettered, so an entry that kills the sink cannot stop
        it for good. Only at start: a re-read after a broker outage is not checked here (an outage
        is not an attempt on the entry; services/streams/pending.py)."""
        for stream in self.topic:
            rows = self.client.xpending_range(stream, self.opts.group, min="-", max="+",
                                              count=OWN_PENDING_PAGES * self.opts.batch_size,
                                              consumername=self.opts.consumer)
            self._dead_letter_poison(stream, plan_reclaim(pending_entries(rows), self.settings.max_deliveries).poison)
        self._own_poison_checked = True

    def _dead_letter_poison(self, stream: str, poison: list[PendingEntry]) -> None:
        if not poison:
            return
        rows, letters = [], []
        for row in poison:
            found = self.client.xrange(stream, min=row.entry_id, max=row.entry_id)
            fields = found[0][1] if found else {}
            rows.append(TopicRow(stream, row.entry_id, fields))
            letters.append(RefusedEntry(EntryRef(stream, row.entry_id), MAX_DELIVERIES, max_deliveries_detail(row),
                                        {k.decode("utf-8", "replace"): v for k, v in fields.items()}))
        self._acknowledge(rows, letters)
        table = "events" if self.topic[stream] == "events" else "run_records"
        self.metrics.rows.labels(table, "dead_lettered").inc(len(poison))
        self.metrics.errors.labels("max_deliveries").inc(len(poison))

    def _read(self) -> list[TopicRow]:
        if not self._own_poison_checked:
            self._drop_own_poison()
        out: list[TopicRow] = []
        catching_up = any(v == "0" for v in self.next_id.values())
        single = len(self.shards) == 1
        for pair in self.shards:
            ids = {s: self.next_id[s] for s in pair}
            block = self.opts.block_ms if single and not catching_up else None
            reply = self.client.xreadgroup(self.opts.group, self.opts.consumer, ids, count=self.opts.batch_size, block=block)
            got = _flatten(reply)
            gone = _trimmed(reply)
            if gone:
                # Pending entries trimmed by retention before we acknowledged them: nothing to write.
                pipe = self.client.pipeline(transaction=True)
                for stream, entry_id in gone:
                    pipe.xack(stream, self.opts.group, entry_id)
                pipe.execute()
            for stream in pair:
                if ids[stream] == "0" and not any(s == stream for s, _, _ in got):
                    self.next_id[stream] = ">"  # own pending entries all handled
            out += got
        if not out and not single and not catching_up:
            self._sleep(self.opts.block_ms / 1000)  # a cluster is read shard by shard without BLOCK
        return out

    def _sweep(self) -> list[TopicRow]:
        """Every sweep interval: lag gauges, and entries another consumer read but did not
        acknowledge for CLAIM_IDLE_MS (it died) are claimed and processed here; those delivered
        more than MAX_DELIVERIES times are dead-lettered `max-deliveries` instead (services/streams)."""
        if time.monotonic() - self._last_sweep < self.opts.sweep_interval_s:
            return []
        self._last_sweep = time.monotonic()
        claimed: list[TopicRow] = []
        lag = {"events": 0, "runs": 0}
        pending = {"events": 0, "runs": 0}
        for stream, topic in self.topic.items():
            rows = self.client.xpending_range(stream, self.opts.group, min="-", max="+", count=self.opts.batch_size,
                                              idle=self.opts.claim_idle_ms)
            with self._held_lock:
                held = set(self._held[stream])
            plan = plan_reclaim(pending_entries(rows), self.settings.max_deliveries, held)
            self._dead_letter_poison(stream, plan.poison)
            if plan.claim:
                reply = self.client.xclaim(stream, self.opts.group, self.opts.consumer, self.opts.claim_idle_ms,
                                           [row.entry_id for row in plan.claim])
                claimed += [TopicRow(stream, _s(entry_id), fields) for entry_id, fields in reply or [] if fields is not None]
            backlog = read_backlog_sync(self.client, stream, self.opts.group)  # unknown lag: counted
            lag[topic] += backlog.lag or 0
            pending[topic] += backlog.pending
        for topic in lag:
            self.metrics.lag.labels(topic).set(lag[topic])
            self.metrics.pending.labels(topic).set(pending[topic])
        if claimed:
            log.info("claimed %d entries left pending by another consumer", len(claimed))
        return claimed

    # ------------------------------------------------------------------ one batch
    def prepare(self, entries: list[TopicRow]) -> Batch:
        """Parse a batch read from the topics (pure work, done on the reader thread)."""
        now = utcnow()
        horizon = (now - self.opts.retention).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        ceiling = rfc3339(now + SANE_AHEAD)
        events = [e for e in entries if self.topic[e[0]] == "events"]
        records = [e for e in entries if self.topic[e[0]] == "runs"]
        return Batch(entries, parse_topic_batch(events, records, horizon, ceiling), [EntryRef(s, i) for s, i, _ in entries])

    def process(self, batch: Batch) -> bool:
        """Write then acknowledge one batch. False when asked to stop before it was written."""
        started = time.perf_counter()
        entries, parsed, refs = batch.entries, batch.parsed, batch.refs
        result = self._write(parsed, refs)
        if result is None:
            return False
        dead = parsed.dead + result.rejected
        backoff = BACKOFF_START_S
        while True:
            try:
                self._acknowledge(entries, dead)
                break
            except _BROKER_ERRORS as exc:
                # Written but not acknowledged: retry the acknowledgement (a re-delivery meanwhile
                # is harmless, the rows are idempotent; a dead letter may then appear twice).
                self._set(broker=False, why=f"broker unreachable while acknowledging ({type(exc).__name__})")
                self.metrics.errors.labels("broker").inc()
                log.warning("broker unreachable while acknowledging (%s); retrying in %.1fs", type(exc).__name__, backoff)
            except ResponseError as exc:
                # The broker refuses the dead letters' XADD (OOM at maxmemory; LOADING, READONLY, a
                # topology change): the MULTI wrote nothing, so retrying it writes each dead letter
                # once. An outage, not a failure of the batch: it stays written and held meanwhile.
                if reply_code(exc) not in TRANSIENT_CODES | {"EXECABORT"}:
                    raise
                self._set(broker=False)
                self.metrics.errors.labels("broker").inc()
                log.warning("broker refuses the acknowledgement (%s); retrying in %.1fs", describe(exc), backoff)
            if self._sleep(backoff):
                return False
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        self._release(entries)
        self._count(parsed, result)
        self.metrics.batches.inc()
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        return True

    def _write(self, parsed: Parsed, refs: list[EntryRef]) -> WriteResult | None:
        backoff = BACKOFF_START_S
        while True:
            try:
                if not self._setup_done:
                    self._setup()
                result = self.store.write(parsed.events, parsed.records, refs)
                self._set(db=True)
                return result
            except psycopg.Error as exc:
                self._db_failure(exc, backoff)
            if self._sleep(backoff):
                return None
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _acknowledge(self, entries: list[TopicRow], dead: list[RefusedEntry]) -> None:
        by_shard: dict[int, tuple[dict[str, list[str]], list[RefusedEntry]]] = {}
        for stream, entry_id, _ in entries:
            by_shard.setdefault(self.shard_of[stream], ({}, []))[0].setdefault(stream, []).append(entry_id)
        for letter in dead:
            by_shard.setdefault(self.shard_of[letter.ref.stream], ({}, []))[1].append(letter)
        layout = self.settings.layout
        for shard, (acks, letters) in sorted(by_shard.items()):
            pipe = self.client.pipeline(transaction=True)
            for letter in letters:
                pipe.xadd(layout.export_deadletter_partition(EXPORTER, shard), _dead_fields(letter, self.opts.group))
            for stream, ids in acks.items():
                pipe.xack(stream, self.opts.group, *ids)
            pipe.execute()
        for letter in dead:
            log.warning("dead-lettered %s %s: %s (%s)", letter.ref.stream, letter.ref.entry_id, letter.reason, letter.detail)

    def _count(self, parsed: Parsed, result: WriteResult) -> None:
        rows = self.metrics.rows
        rows.labels("events", "inserted").inc(result.events_inserted)
        rows.labels("events", "duplicate").inc(result.events_duplicate)
        rows.labels("events", "expired").inc(parsed.expired)
        self.metrics.clamped.inc(parsed.clamped)
        rows.labels("run_records", "inserted").inc(result.records_inserted)
        rows.labels("run_records", "duplicate").inc(result.records_duplicate)
        for letter in parsed.dead + result.rejected:
            table = "events" if self.topic[letter.ref.stream] == "events" else "run_records"
            rows.labels(table, "dead_lettered").inc()
            self.metrics.errors.labels("invalid_entry" if letter.reason == INVALID_ENTRY else "rejected_row").inc()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flatten(reply: Any) -> list[TopicRow]:
    out: list[TopicRow] = []
    for stream, items in reply or []:
        name = _s(stream)
        for entry_id, fields in items:
            if fields is not None:  # an entry trimmed while pending comes back empty
                out.append(TopicRow(name, _s(entry_id), fields))
    return out


def _trimmed(reply: Any) -> list[tuple[str, str]]:
    return [(_s(stream), _s(entry_id)) for stream, items in reply or [] for entry_id, fields in items if fields is None]


def _dead_fields(letter: RefusedEntry, group: str) -> dict[bytes, Any]:
    return DeadLetter(letter.reason, letter.detail, letter.ref.stream, letter.ref.entry_id, exporter=EXPORTER,
                      group=group, raw=letter.fields).to_fields()


def _describe(exc: BaseException) -> str:
    """Class, SQLSTATE and first line of a database error (libpq messages carry no password)."""
    state = getattr(exc, "sqlstate", None)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}{f' {state}' if state else ''}: {first}"
