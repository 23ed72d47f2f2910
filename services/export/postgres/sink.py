"""The sink's imperative shell: read the topics with a consumer group, write, then acknowledge.

A plain reader thread and writer loop (not FastStream; see docs/analytics.md "Why a plain loop"):

1. reader: read a batch from every partition of `harness.events` and `harness.runs` through the
   consumer skeleton's `GroupReader` (services/streams/reader.py: on start, first this consumer's
   own pending entries, i.e. what a killed predecessor of the same name had read but not
   acknowledged; the sweep; the group's creation and recreation) and parse it (rows.py, pure);
2. writer: write it with the consumer positions in one transaction (store.py); while the
   database is unreachable, retry the same batch with backoff and report not ready: nothing is
   acknowledged, the topic keeps the data;
3. after the commit, in one step per shard (`GroupReader.ack`: the one dead-letter writer,
   services/streams/deadletter.py): dead letters (invalid entries, rows the database refused) to
   the sink's own dead-letter stream (`<deadletter>.postgres`, the only stream its
   `postgres-exporter` ACL user may write; never the workers' `goose.deadletter`), trimmed by age,
   and XACK of the whole batch.

A crash between 2 and 3 re-delivers the batch; every write is idempotent, so that doubles nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from redis.exceptions import ResponseError

from contracts.consumers import BY_NAME, POSTGRES
from contracts.deadletters import DeadLetter
from services.backoff import Backoff
from services.broker.errors import describe
from services.broker.url import BrokerTLSError
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
from services.streams.groups import is_nogroup
from services.streams.reader import BROKER_ERRORS, GroupReader, StreamEntry, by_stream
from services.streams.readiness import READY, Readiness, not_ready
from services.streams.watch import EXIT_READER_DIED

log = logging.getLogger("goose_ingest.export.postgres")

EXPORTER = POSTGRES  # its row of contracts/consumers.py: key names, ACL role, dead-letter reasons
DEFAULT_GROUP = BY_NAME[POSTGRES].default_group  # GOOSE_INGEST_POSTGRES_GROUP's default
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
MAINTENANCE_INTERVAL_S = 3600.0  # partitions ahead and retention
# The exit code of a sink one of whose threads failed on an error it does not know how to wait out
# (a bug, a server on the broker's port that does not speak Redis...): not 0 (the supervisor must
# restart it) and not 2 (a configuration error found at start, which a restart would not fix).
_MAX_ERROR_TEXT = 200


def redact_dsn(dsn: str) -> str:
    """host:port/dbname of a DSN, safe to log (no user, no password, no other options)."""
    try:
        d = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparseable DSN)"
    return f"{d.get('host', 'localhost')}:{d.get('port', 5432)}/{d.get('dbname', '')}"


@dataclass(frozen=True)
class Batch:
    entries: list[StreamEntry]
    parsed: Parsed
    refs: list[EntryRef]


@dataclass(frozen=True)
class ThreadFailure:
    """Why the sink stopped on its own: the thread and its error, as one line safe to log."""

    thread: str
    error: str


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
        # streams of one shard share a hash slot, so one MULTI or script per shard works on a cluster too.
        self.shards: list[list[str]] = [[e, r] for e, r in zip(events, runs, strict=True)]
        self.topic: dict[str, str] = {s: "events" for s in events} | {s: "runs" for s in runs}
        # Positions (own pending entries first), sweep, held entries, acknowledgements with dead
        # letters into the sink's own stream: the consumer skeleton's reader.
        self.reader = GroupReader(client, self.shards, options.group, options.consumer,
                                  max_deliveries=settings.max_deliveries, claim_idle_ms=options.claim_idle_ms,
                                  deadletter_stream=lambda shard: layout.export_deadletter_partition(EXPORTER, shard),
                                  exporter=EXPORTER, logger=log,
                                  deadletter_retention_hours=settings.deadletter_keep_hours)
        self.stopping = threading.Event()
        self._batches: queue.Queue[Batch] = queue.Queue(maxsize=1)
        self._db_ok = False
        self._broker_ok = False
        # what /readyz says while not ready: the latest reason of each side, safe to show (no credentials)
        self._db_why = f"connecting to the database {redact_dsn(store.dsn)}"
        self._broker_why = "connecting to the broker"
        self._setup_done = False
        self._last_sweep = 0.0
        self._last_maintenance = 0.0
        self._last_ping = 0.0
        self.failure: ThreadFailure | None = None  # set once, by the first thread that fails

    # ------------------------------------------------------------------ state
    def readiness(self) -> Readiness:
        """Ready, or not with the reason /readyz shows (services/streams/readiness.py)."""
        if self.failure is not None:
            return not_ready(f"the {self.failure.thread} thread failed: {self.failure.error}")
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
        self.metrics.ready.set(1 if self.readiness() else 0)

    def stop(self) -> None:
        self.stopping.set()

    def fault(self) -> str | None:
        """Why `run` ended on its own: a thread failed (the shell then exits EXIT_READER_DIED)."""
        return None if self.failure is None else f"the {self.failure.thread} thread failed: {self.failure.error}"

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless asked to stop; True when stopping."""
        return self.stopping.wait(seconds)

    # ------------------------------------------------------------------ setup
    def ensure_groups(self) -> None:
        self.reader.ensure_groups()  # at 0: export what the topics retain

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
        """Until stopped, or until either thread fails on an error it does not retry (`failure`
        says which and why; the command then exits EXIT_READER_DIED). Either way both stop:
        a reader that died would otherwise leave a writer idling, and the process up, forever."""
        reader = threading.Thread(target=self._guarded, args=("reader", self._reader), name="postgres-sink-reader",
                                  daemon=True)
        reader.start()
        try:
            self._guarded("writer", self._writer)
        finally:
            self.stopping.set()
            reader.join(timeout=30)
            self._set(db=False, broker=False)

    def _guarded(self, thread: str, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as exc:  # anything the loops do not retry: end the process, say why in one line
            self._fail(thread, exc)

    def _fail(self, thread: str, exc: Exception) -> None:
        error = _one_line(exc)
        if self.failure is None:
            self.failure = ThreadFailure(thread, error)
        self.stopping.set()
        self.metrics.ready.set(0)
        # One line at the default level; the traceback (a bug's) with --log-level DEBUG only, so the
        # line a supervisor's log shows is this one. Messages carry no credentials: redis-py's and
        # libpq's name the address, not the password, and the broker's are cut to the server's text.
        log.error("export postgres stops: the %s thread failed: %s; exiting with code %d so that it is restarted",
                  thread, error, EXIT_READER_DIED)
        log.debug("the %s thread's traceback", thread, exc_info=exc)

    def _writer(self) -> None:
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
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
                backoff.reset()
                continue
            except psycopg.Error as exc:
                self._db_failure(exc, backoff.delay)
            if self._sleep(backoff.next()):
                return

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
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
        while not self.stopping.is_set():
            try:
                entries = self._sweep() or self._read()
                self._set(broker=True)
                backoff.reset()
                if entries:
                    batch = self.prepare(entries)
                    while not self.stopping.is_set():
                        try:
                            self._batches.put(batch, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                continue
            except BrokerTLSError as exc:
                # Mid-run (the start check let it pass, so it worked then): a certificate rotated
                # to one we do not trust. An outage, not an exit: a restart would meet the same
                # certificate, and waiting recovers as soon as a trusted one is back.
                self._tls_failure(exc, backoff.delay)
                self.reader.reset()
            except BROKER_ERRORS as exc:
                self._set(broker=False, why=f"broker unreachable ({type(exc).__name__})")
                self.metrics.errors.labels("broker").inc()
                log.warning("broker unreachable (%s); retrying in %.1fs", type(exc).__name__, backoff.delay)
                self.reader.reset()  # re-read what we hold but did not ack
            except ResponseError as exc:
                if not is_nogroup(exc):
                    log.error("broker refused a read: %s", exc)
                else:
                    # The broker lost the stream or the group (restart without persistence):
                    # recreate at 0 and re-read; the idempotent writes absorb what was exported.
                    log.warning("consumer group missing on a topic partition; recreating it at 0")
                self.reader.reset()
            if self._sleep(backoff.next()):
                return

    def _tls_failure(self, exc: BrokerTLSError, backoff: float, doing: str = "") -> None:
        self._set(broker=False, why=str(exc))
        self.metrics.errors.labels("broker").inc()
        log.warning("%s%s; retrying in %.1fs", exc, doing, backoff)

    def _count_poison(self, poison: list[StreamEntry]) -> None:
        """Entries the reader dead-lettered `max-deliveries` (and acknowledged)."""
        for stream, ids in by_stream(poison).items():
            table = "events" if self.topic[stream] == "events" else "run_records"
            self.metrics.rows.labels(table, "dead_lettered").inc(len(ids))
            self.metrics.errors.labels("max_deliveries").inc(len(ids))

    def _read(self) -> list[StreamEntry]:
        out: list[StreamEntry] = []
        catching_up = self.reader.catching_up
        single = len(self.shards) == 1
        for pair in self.shards:
            block = self.opts.block_ms if single and not catching_up else None
            got = self.reader.read(pair, self.opts.batch_size, block)
            self._count_poison(got.dead_lettered)  # own pending poison, checked at the first read
            out += got.entries
        if not out and not single and not catching_up:
            self._sleep(self.opts.block_ms / 1000)  # a cluster is read shard by shard without BLOCK
        return out

    def _sweep(self) -> list[StreamEntry]:
        """Every sweep interval: lag gauges, and entries another consumer read but did not
        acknowledge for CLAIM_IDLE_MS (it died) are claimed and processed here; those delivered
        more than MAX_DELIVERIES times are dead-lettered `max-deliveries` instead (services/streams)."""
        if time.monotonic() - self._last_sweep < self.opts.sweep_interval_s:
            return []
        self._last_sweep = time.monotonic()
        swept = self.reader.sweep(self.opts.batch_size)
        self._count_poison(swept.poison)
        lag = {"events": 0, "runs": 0}
        pending = {"events": 0, "runs": 0}
        for stream, backlog in swept.backlog.items():  # unknown lag: counted
            lag[self.topic[stream]] += backlog.lag or 0
            pending[self.topic[stream]] += backlog.pending
        for topic in lag:
            self.metrics.lag.labels(topic).set(lag[topic])
            self.metrics.pending.labels(topic).set(pending[topic])
        return swept.claimed

    # ------------------------------------------------------------------ one batch
    def prepare(self, entries: list[StreamEntry]) -> Batch:
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
        dead = [_dead_letter(self.reader, letter) for letter in parsed.dead + result.rejected]
        # Written but not acknowledged: a refused acknowledgement is retried in place (a
        # re-delivery meanwhile is harmless, the rows are idempotent). A refusal of the dead
        # letters' XADD (OOM at maxmemory; LOADING, READONLY, a topology change) comes before the
        # script acknowledged anything (deadletter_ack.lua writes the dead letters first), so the
        # retry writes each dead letter once; the batch stays written and held.
        if not self._ack(by_stream(entries), dead):
            return False
        self._count(parsed, result)
        self.metrics.batches.inc()
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        return True

    def _write(self, parsed: Parsed, refs: list[EntryRef]) -> WriteResult | None:
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
        while True:
            try:
                if not self._setup_done:
                    self._setup()
                result = self.store.write(parsed.events, parsed.records, refs)
                self._set(db=True)
                return result
            except psycopg.Error as exc:
                self._db_failure(exc, backoff.delay)
            if self._sleep(backoff.next()):
                return None

    def _ack(self, pending: dict[str, list[str]], dead: list[DeadLetter]) -> bool:
        """`ack_in_place`, also retried in place through a TLS failure (see `_reader`)."""
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
        while True:
            try:
                return self.reader.ack_in_place(pending, dead, self.stopping, self._ack_refused,
                                                Backoff(BACKOFF_START_S, BACKOFF_MAX_S))
            except BrokerTLSError as exc:
                self._tls_failure(exc, backoff.delay, " (while acknowledging a written batch)")
            if self._sleep(backoff.next()):
                return False

    def _ack_refused(self, exc: BaseException, backoff: float) -> None:
        self.metrics.errors.labels("broker").inc()
        if isinstance(exc, BROKER_ERRORS):
            self._set(broker=False, why=f"broker unreachable while acknowledging ({type(exc).__name__})")
            log.warning("broker unreachable while acknowledging (%s); retrying in %.1fs", type(exc).__name__, backoff)
        else:
            self._set(broker=False)
            log.warning("broker refuses the acknowledgement (%s); retrying in %.1fs", describe(exc), backoff)

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


def _dead_letter(reader: GroupReader, letter: RefusedEntry) -> DeadLetter:
    return reader.dead_letter(StreamEntry(letter.ref.stream, letter.ref.entry_id, {}), letter.reason, letter.detail,
                              letter.fields)


def _one_line(exc: Exception) -> str:
    """A failed thread's error as one bounded line: a database error as `_describe`, a broker error
    as `describe` (never a pipeline's quoted command, which carries entry data), anything else its
    class and the first line of its message."""
    if isinstance(exc, psycopg.Error):
        text = _describe(exc)
    elif type(exc).__module__.startswith("redis"):
        text = describe(exc)
    else:
        first = (str(exc).strip().splitlines() or [""])[0]
        text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT] + "..."


def _describe(exc: BaseException) -> str:
    """Class, SQLSTATE and first line of a database error (libpq messages carry no password)."""
    state = getattr(exc, "sqlstate", None)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}{f' {state}' if state else ''}: {first}"
