"""Publisher: assigns seqs, spools, and sends raw entries in pipelined batches (docs/raw-entries.md).

Callers (``add_line``/``add_lines``/``add_eof``) never wait for the broker: entries are appended to the
run's spool log (one write per call) and a background sender thread XADDs them in one pipeline per batch.

Batching is Nagle-like, with no timer: an idle sender sends what is spooled at once (a lone line goes out
within a round trip), and whatever accumulates meanwhile forms the next batch (up to
``settings.publish_batch``), started at most once per ``MIN_BATCH_INTERVAL_S``. Low rates thus add no
latency and high rates get large batches.

Durability: every batch is read back from the spool (so exactly what is spooled is sent) and fsync'ed
once before it is sent -- one fsync per batch, not per line. When the broker is unreachable the sender
retries the same batch with backoff (capped at ~2 s) while callers keep appending to the spool.
Delivery is at-least-once; a re-sent entry has the same run and seq, and workers drop such duplicates.

How a batch reaches the broker is its transport's (``services/tap/transports.py``: a single node's
hand-built RESP pipeline, a cluster's ``xadd_batch``, an ingest gateway's HTTP), each behind one
``send(batch)``; the publisher keeps seqs, the spool, pacing and retries, the same for all three.
"""

from __future__ import annotations

import base64
import logging
import random
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from contracts.raw import EOF, LINE, MAX_LABEL_CHARS
from services.backoff import Backoff
from services.broker.errors import TOPOLOGY_CODES, describe, reply_code
from services.broker.url import redact_url
from services.settings import Settings
from services.tap.resp import bulk, xadd_records
from services.tap.runkey import validate_run
from services.tap.spool import SRC_TAG, Spool, spool_path
from services.tap.transports import Transport, open_transport

if TYPE_CHECKING:
    import redis

    from services.sequencer.entries import Entry

log = logging.getLogger("goose_ingest.tap")

RESERVED_FIELDS = frozenset({"run", "seq", "ts", "kind", "stream", "line", "exit", "line_b64", "_src", "through",
                             "missing"})
ENTRY_LABELS = ("host", "agent", "format", "parent", "continues")  # labels the Entry type carries
STREAMS = ("stdout", "stderr")
BACKOFF_START_S = 0.05
BACKOFF_CAP_S = 2.0
# A gateway that refuses the token or run key (401/403/404) is asked again this rarely: only a fix helps.
REFUSED_RETRY_S = 30.0
STILL_FAILING_REPORT_S = 30.0  # while retrying, one warning per this long (the first failure is logged at once)
# A busy sender starts at most one batch per this interval; an idle one sends at once. Each batch costs a
# fixed fsync, round trip and thread wake-up: at 1,000 lines/s without this every line would be its own
# batch. It bounds the added latency at 20 ms, and only while the sender is busy.
MIN_BATCH_INTERVAL_S = 0.02
# Encoded commands of spooled entries kept in memory for the sender (so it need not read back and re-parse
# the spool); beyond this (the broker is slow or down) it reads them from the spool instead.
MEM_CAP_BYTES = 1 << 20  # ~1,700 goose lines: several full batches


class RunFinished(RuntimeError):
    """The run already has its eof entry; nothing more can be added."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_fields(fields: Mapping[str, str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (fields or {}).items():
        if not isinstance(k, str) or not k or k in RESERVED_FIELDS:
            raise ValueError(f"{what} field name {k!r} is empty or reserved")
        if not isinstance(v, str):
            raise TypeError(f"{what} field {k!r} must be a string, not {type(v).__name__}")
        out[k] = v
    return out


class LineEncoder:
    """A run's line entries as spool records and as XADD commands, from constant parts built once.

    ``record`` is the general form (a dict through orjson, any ``extra``/``source``); ``records`` and
    ``commands`` are the hot path for plain lines. Property tests in tests/tap/test_tap.py hold them equal to
    the reference encoders: ``spool.encode_record(Publisher._fields(Entry...))`` for records, and
    ``resp.xadd_records`` of the record (itself byte-equal to redis-py's XADD) for commands."""

    _REC_TS = b'","ts":"'
    _RESP_TS = bulk(b"ts")

    def __init__(self, run: str, stream_key: bytes, labels: Mapping[str, str]) -> None:
        self.run = run
        self.labels = dict(labels)  # in record order: Entry.to_fields' labels, then the others
        labels_json = orjson.dumps(self.labels)[1:-1]
        self._rec_run = b'{"run":' + orjson.dumps(run) + b',"seq":"'
        self._rec_head = {s: b'","kind":"line","stream":' + orjson.dumps(s) + b',"line":' for s in STREAMS}
        self._rec_tail = (b"," + labels_json if labels_json else b"") + b"}\n"
        label_fields = [(k.encode(), v.encode()) for k, v in self.labels.items()]
        n_fields = 6 + len(label_fields)  # run seq ts kind stream line, then the labels
        self._cmd_head = (b"*%d\r\n" % (3 + 2 * n_fields) + bulk(b"XADD") + bulk(stream_key) + bulk(b"*")
                          + bulk(b"run") + bulk(run.encode()) + bulk(b"seq"))
        self._cmd_kind = {s: bulk(b"kind") + bulk(LINE.encode()) + bulk(b"stream") + bulk(s.encode()) + bulk(b"line")
                          for s in STREAMS}
        self._cmd_tail = b"".join(bulk(k) + bulk(v) for k, v in label_fields)

    def record(self, seq: int, ts: int, line: bytes, stream: str, extra: Mapping[str, str] | None = None,
               source: str | None = None) -> bytes:
        """The spool record of a line entry (valid UTF-8 as ``line``, other bytes as ``line_b64``)."""
        try:
            rec = {"run": self.run, "seq": str(seq), "ts": str(ts), "kind": LINE, "stream": stream,
                   "line": line.decode("utf-8")}
        except UnicodeDecodeError:
            rec = {"run": self.run, "seq": str(seq), "ts": str(ts), "kind": LINE, "stream": stream,
                   "line_b64": base64.b64encode(line).decode("ascii")}
        rec.update(self.labels)
        if extra:
            rec.update(extra)
        if source is not None:
            rec[SRC_TAG] = source
        return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)

    def eof_record(self, seq: int, ts: int, exit_code: int | None, extra: Mapping[str, str] | None = None) -> bytes:
        """The spool record of the run's eof entry (``Entry.to_fields`` order: run seq ts kind [exit], labels)."""
        rec = {"run": self.run, "seq": str(seq), "ts": str(ts), "kind": EOF}
        if exit_code is not None:
            rec["exit"] = str(exit_code)
        rec.update(self.labels)
        if extra:
            rec.update(extra)
        return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)

    def records(self, first: int, ts: int, lines: Sequence[bytes], stream: str) -> list[bytes]:
        """Spool records of consecutive lines from seq ``first``, all stamped ``ts``."""
        head, tail, run_part, ts_part = self._rec_head[stream], self._rec_tail, self._rec_run, self._REC_TS
        dumps = orjson.dumps
        out = []
        for i, line in enumerate(lines):
            try:
                text = dumps(line.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(self.record(first + i, ts, line, stream))
                continue
            out.append(b"%b%d%b%d%b%b%b" % (run_part, first + i, ts_part, ts, head, text, tail))
        return out

    def commands(self, first: int, ts: int, lines: Sequence[bytes], stream: str) -> list[bytes]:
        """The XADD command of each line (the line's exact bytes, whatever their encoding)."""
        head, kind, tail = self._cmd_head, self._cmd_kind[stream], self._cmd_tail
        ts_b = b"%d" % ts
        ts_part = self._RESP_TS + bulk(ts_b)
        out = []
        for i, line in enumerate(lines):
            seq_b = b"%d" % (first + i)
            out.append(b"%b$%d\r\n%b\r\n%b%b$%d\r\n%b\r\n%b" % (
                head, len(seq_b), seq_b, ts_part, kind, len(line), line, tail))
        return out


class Publisher:
    """Publishes the raw entries of one run. Thread-safe; seqs follow the order of ``add_*`` calls.

    ``labels`` (e.g. ``{"host": ..., "agent": ...}``) go on every entry; ``extra`` fields on one entry.
    Resumes the run's spool when one exists (next seq = entries already spooled; unsent ones go first).
    """

    def __init__(
        self,
        settings: Settings,
        run: str,
        labels: Mapping[str, str] | None = None,
        *,
        client: redis.Redis | Any | None = None,
        min_interval_s: float | None = None,
        spool_dir: str | Path | None = None,
        format: str | None = None,
    ) -> None:
        self.settings = settings
        self.run = validate_run(run)
        labels = {k: v for k, v in _check_fields(labels, "label").items() if v}
        if format is not None:
            if not format or len(format) > MAX_LABEL_CHARS or not format.isprintable():
                raise ValueError(f"format must be a short printable label (1-{MAX_LABEL_CHARS} chars), not {format!r}")
            labels["format"] = format
        # Labels the entry type knows are encoded by Entry.to_fields; any others follow them.
        self._entry_labels = {k: labels[k] for k in ENTRY_LABELS if k in labels}
        self._other_labels = {k: v for k, v in labels.items() if k not in ENTRY_LABELS}
        # The labels of every spool record, in Entry.to_fields order then the others (see LineEncoder).
        self._record_labels = {**self._entry_labels, **self._other_labels}
        self.labels = labels
        self.stream_key = settings.layout.raw_stream(settings.layout.shard_of(run))
        self.batch = settings.publish_batch
        self.min_interval_s = MIN_BATCH_INTERVAL_S if min_interval_s is None else min_interval_s
        self._last_send = float("-inf")  # monotonic start of the latest batch
        self._stream_key_b = self.stream_key.encode()
        self._encoder = LineEncoder(self.run, self._stream_key_b, self._record_labels)
        # the transport first: a bad URL must not leave a spool behind (creating it does not connect).
        self._transport: Transport = open_transport(settings, self.stream_key, client)
        self._packed = self._transport.packed
        try:
            self._spool = Spool(Path(spool_dir) if spool_dir is not None else spool_path(settings, run))
        except BaseException:
            self._close_client()
            raise
        self._cv = threading.Condition()
        self._next = self._spool.count  # next seq to assign
        self._sent = self._spool.sent  # entries confirmed by the broker
        self._taken = self._sent  # entries handed to the sender: confirmed + the batch in flight
        self._taken_offset = self._spool.unsent_offset  # spool byte offset of entry `_taken` (sender only)
        # Encoded XADDs of exactly the entries [_taken, _next) while `_mem_on`, with their record sizes.
        self._mem: list[bytes] = []
        self._mem_lens: list[int] = []
        self._mem_bytes = 0
        self._mem_on = self._packed and self._next == self._sent
        self._eof = self._spool.finished
        self._flush_req = 0
        self._sender_idle = False  # the sender waits for entries (set and read under the lock)
        self._closing = False
        self._abort = False
        self._abort_evt = threading.Event()
        self._closed = False
        self.broker_up: bool | None = None  # None until the first send
        self.last_answer: str | None = None  # the broker's error reply (OOM...) while failing; None: no answer
        self.refusal: str | None = None  # while a gateway refuses the token or run key: what it said
        self.resumed = self._spool.resumed
        self._thread = threading.Thread(target=self._sender, name=f"publisher[{run}]", daemon=True)
        self._thread.start()

    # --- info -------------------------------------------------------------------------
    @property
    def spool_dir(self) -> Path:
        return self._spool.path

    @property
    def next_seq(self) -> int:
        return self._next

    @property
    def sent_count(self) -> int:
        return self._sent

    @property
    def pending(self) -> int:
        return self._next - self._sent

    @property
    def sender_busy(self) -> bool:
        """True while a batch is in flight or the sender paces the next one (False: it waits for entries)."""
        return not self._sender_idle

    @property
    def target(self) -> tuple[str, str]:
        """What the lines about delivery call where the entries go, and it while it takes none: ("broker",
        "unreachable") or ("gateway", "out of service")."""
        return self._transport.noun, self._transport.down

    @property
    def sender_alive(self) -> bool:
        """False once the sender thread stopped (closed, or failed: the reason is logged)."""
        return self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """True once the run has its eof entry (added now, or found in the spool)."""
        return self._eof

    def lines_from(self, source: str) -> int:
        """How many spooled entries were added with ``source=source`` (to skip them when resuming)."""
        with self._cv:
            return self._spool.by_source.get(source, 0)

    # --- adding ---------------------------------------------------------------------------
    def add_line(
        self,
        line: bytes | str,
        stream: str = "stdout",
        ts_ms: int | None = None,
        extra: Mapping[str, str] | None = None,
        *,
        source: str | None = None,
    ) -> int:
        """Add one line (without its newline; bytes are published exactly). Returns its seq.

        ``source`` is a local resume tag kept in the spool only (see :meth:`lines_from`).
        """
        if isinstance(line, str):
            line = line.encode("utf-8")
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, not {stream!r}")
        fields_extra = _check_fields(extra, "extra") if extra else None
        ts = now_ms() if ts_ms is None else int(ts_ms)
        with self._cv:
            self._check_open()
            seq = self._next
            rec = self._encoder.record(seq, ts, bytes(line), stream, fields_extra, source)
            self._spool.append(rec, source)
            self._next = seq + 1
            self._remember([rec], None)
            self._wake_sender()
            return seq

    def add_lines(self, lines: Sequence[bytes], stream: str = "stdout", ts_ms: int | None = None) -> int:
        """Add several lines (without their newlines) at once: one lock, one spool write. Returns the
        seq of the first (the next seq when ``lines`` is empty)."""
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, not {stream!r}")
        ts = now_ms() if ts_ms is None else int(ts_ms)
        with self._cv:
            self._check_open()
            first = self._next
            if not lines:
                return first
            recs = self._encoder.records(first, ts, lines, stream)
            self._spool.append_many(b"".join(recs), len(recs))
            self._next = first + len(lines)
            if self._mem_on:
                self._remember(recs, self._encoder.commands(first, ts, lines, stream))
            self._wake_sender()
            return first

    def _remember(self, recs: list[bytes], resps: list[bytes] | None) -> None:
        """Keep the encoded XADDs of records just spooled for the sender (lock held), within MEM_CAP_BYTES."""
        if not self._mem_on:
            return
        if resps is None:
            resps = [xadd_records(self._stream_key_b, [r]) for r in recs]
        self._mem.extend(resps)
        self._mem_lens.extend(len(r) for r in recs)
        self._mem_bytes += sum(len(r) for r in resps)
        if self._mem_bytes > MEM_CAP_BYTES:  # the sender reads the spool from entry `_taken` on
            self._mem_on = False
            self._mem, self._mem_lens, self._mem_bytes = [], [], 0

    def _wake_sender(self) -> None:
        """After adding (lock held): wake the sender only when that changes what it does -- it waits for
        work, or a batch is full. A notify per line would wake a pacing sender for nothing."""
        if self._sender_idle or self._next - self._sent >= self.batch:
            self._cv.notify_all()

    def add_eof(self, exit_code: int | None = None, ts_ms: int | None = None,
                extra: Mapping[str, str] | None = None) -> int:
        """Add the run's final entry (``kind=eof``, ``exit`` when known). Returns its seq."""
        fields_extra = _check_fields(extra, "extra") if extra else None
        ts = now_ms() if ts_ms is None else int(ts_ms)
        with self._cv:
            self._check_open()
            seq = self._next
            rec = self._encoder.eof_record(seq, ts, None if exit_code is None else int(exit_code), fields_extra)
            self._spool.append(rec)
            self._next = seq + 1
            self._remember([rec], None)
            self._eof = True
            self._flush_req += 1
            self._cv.notify_all()
            return seq

    # The reference encoders (Entry.to_fields, the one encoder of entries): property tests hold the fast
    # encoders above equal to them. Entry is imported here only: the sequencer's package pulls the
    # normalizer, which a tap has no use for.
    def _entry(self, seq: int, ts: int, kind: str, stream: str, exit_code: int | None = None) -> Entry:
        from services.sequencer.entries import Entry

        labels: dict[str, str | None] = dict.fromkeys(ENTRY_LABELS)
        labels.update(self._entry_labels)
        return Entry(run=self.run, seq=seq, ts=ts, kind=kind, stream=stream, line="", exit=exit_code, sid="",
                     **labels)  # type: ignore[arg-type]

    def _fields(self, entry: Entry, line: bytes | None = None) -> dict[str, str | bytes]:
        """The spool record of an entry: Entry.to_fields (the one encoder), then the other labels."""
        fields: dict[str, str | bytes] = {k.decode(): v.decode("utf-8", "surrogateescape")
                                          for k, v in entry.to_fields().items()}
        if line is not None:
            fields["line"] = line
        fields.update(self._other_labels)
        return fields

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise RuntimeError("publisher is closed")
        if self._eof:
            raise RunFinished(f"run {self.run!r} already ended (eof spooled or sent)")

    # --- waiting ----------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Send everything added so far now and wait until the broker confirmed it.

        Waits while the broker is down (forever when ``timeout`` is None). True when all was delivered.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            target = self._next
            if self._sent >= target:
                return True
            self._flush_req += 1
            self._cv.notify_all()
            try:
                while self._sent < target:
                    if not self._thread.is_alive():
                        return False
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cv.wait(0.5 if remaining is None else min(remaining, 0.5))
                return True
            finally:
                self._flush_req -= 1

    def close(self, timeout: float | None = None) -> bool:
        """Flush (up to ``timeout``), stop the sender and release the spool.

        The spool is removed when the run is complete (eof delivered) or never got an entry; otherwise it
        stays, and a later Publisher for the same run continues from it. Returns True when all was delivered.
        """
        if self._closed:
            return self._sent >= self._next
        ok = self.flush(timeout)
        with self._cv:
            self._closing = True
            self._abort = not ok
            if self._abort:
                self._abort_evt.set()
            self._cv.notify_all()
        self._thread.join(timeout=None if ok else 5.0)
        with self._cv:
            self._closed = True
            ok = self._sent >= self._next
            remove = (ok and self._eof) or self._next == 0
            self._spool.close(remove=remove)
        self._close_client()
        return ok

    def _close_client(self) -> None:
        self._transport.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(timeout=None if exc_type is None else 2.0)

    # --- sender thread -------------------------------------------------------------------------
    def _sender(self) -> None:
        try:
            self._send_loop()
        except Exception:  # never silently: flush() sees the dead thread and reports failure
            log.exception("publisher for run %s stopped; unsent entries stay in %s", self.run, self._spool.path)
            with self._cv:
                self._cv.notify_all()

    def _send_loop(self) -> None:
        transport = self._transport
        batch: Any = None  # the batch in flight, as the transport sends it
        n = 0
        backoff = Backoff(BACKOFF_START_S, BACKOFF_CAP_S)
        failing_since = last_report = 0.0  # while the broker fails: since when, last "still failing" line
        attempts = 0
        while True:
            new_batch = from_spool = False
            with self._cv:
                if batch is None:
                    while self._next == self._taken and not self._closing:
                        self._sender_idle = True
                        try:
                            self._cv.wait()
                        finally:
                            self._sender_idle = False
                    if self._next == self._taken:  # closing and nothing left
                        return
                    if self._abort:
                        return
                    # pacing (see MIN_BATCH_INTERVAL_S): no wait at all when the last batch is long gone
                    deadline = self._last_send + self.min_interval_s
                    while (self._next - self._taken < self.batch and not self._flush_req and not self._closing
                           and (left := deadline - time.monotonic()) > 0):
                        self._cv.wait(left)
                    n = min(self._next - self._taken, self.batch)
                    if self._mem_on:  # the memory holds exactly the entries [_taken, _next)
                        batch = self._mem[:n]
                        del self._mem[:n]
                        self._mem_bytes -= sum(map(len, batch))
                        self._taken_offset += sum(self._mem_lens[:n])
                        del self._mem_lens[:n]
                    else:
                        from_spool = True
                    self._taken += n
                    new_batch = True
                    if not self._mem_on and self._packed and self._taken == self._next:
                        # caught up with the spool: keep the next entries' commands in memory again (the
                        # offset of entry `_taken` is set below, by the read of this batch)
                        self._mem_on = True
                elif self._abort:
                    return
            if from_spool:
                # Outside the lock: only this thread reads the spool, and these n records are written.
                raws, self._taken_offset = self._spool.read_at(self._taken_offset, n)
                batch = transport.batch_of(raws)
            if new_batch:
                self._last_send = time.monotonic()
                try:
                    self._spool.sync()  # one fsync per batch: spooled durably before anything is sent
                except OSError:
                    pass
            try:
                # One pipeline; with REDIS_WAIT_REPLICAS it also WAITs for replicas (services/broker/cluster.py).
                transport.send(batch)
            except transport.retryable as exc:
                now = time.monotonic()
                # an error reply (OOM at maxmemory, ...) is the broker's answer, not an unreachable broker;
                # a cluster's redirect (MOVED...) only means the client's slot map was stale
                answered = (any(c.__name__ in ("ReplyError", "ResponseError") for c in type(exc).__mro__)
                            and reply_code(exc) not in TOPOLOGY_CODES)
                # a gateway's refusal of the token or run key (401/403/404) is no outage: said as what it is
                refused = getattr(exc, "what", None)
                self.last_answer = describe(exc) if answered else None
                # a refusal after an outage (the gateway back, the token revoked meanwhile) is said too:
                # the outage's line would otherwise be the last word while it is retried every 30 s
                newly_refused = bool(refused) and self.refusal != str(exc)
                self.refusal = str(exc) if refused else None
                if self.broker_up is not False or newly_refused:
                    if refused:
                        log.error("%s; spooling run %s in %s and retrying every %.0f s", exc,
                                  self.run, self._spool.path, REFUSED_RETRY_S)
                    else:
                        log.warning("%s %s at %s (%s); spooling run %s in %s and retrying", transport.noun,
                                    "refused the entries" if answered else transport.down,
                                    redact_url(transport.url),
                                    describe(exc), self.run, self._spool.path)
                    failing_since = last_report = now
                    attempts = 0
                attempts += 1
                if now - last_report >= STILL_FAILING_REPORT_S:
                    # a tap that keeps failing says so, with the latest reason (it may differ from the first)
                    log.warning("run %s: still not delivered after %.0f s and %d attempts (latest: %s); retrying",
                                self.run, now - failing_since, attempts, describe(exc))
                    last_report = now
                self.broker_up = False
                # a refusal waits until someone fixes the token or run key; a 429/503 the gateway's Retry-After.
                # The doubling runs on a refusal too, so a fixed token resumes at the capped pace as before.
                wait = backoff.next()
                pause = REFUSED_RETRY_S if refused else max(wait, getattr(exc, "retry_after", None) or 0.0)
                # +-25 % around the pause (not Backoff's full jitter): taps of one host spread out, and
                # none retries an outage much sooner than the doubling says
                if self._abort_evt.wait(pause * (0.75 + random.random() / 2)):
                    return
                continue
            if self.broker_up is False:
                log.warning("%s reachable again; delivering the spooled entries of run %s", transport.noun, self.run)
            self.broker_up = True
            self.refusal = None
            backoff.reset()
            with self._cv:
                self._sent += n
                try:
                    self._spool.mark_sent(self._sent)
                except OSError:
                    pass
                self._cv.notify_all()
            batch = None
