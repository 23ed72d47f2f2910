"""The group reader: the one synchronous XREADGROUP / XPENDING / XCLAIM / XACK loop of the plain-loop
consumers (`export postgres`, `archive`; issue 20 item 1, issue 23 item 1). The worker and `export
otlp` read through FastStream subscribers and use the rest of the skeleton directly.

For a list of shards (the streams of one shard share a hash slot on a cluster, so one XREADGROUP
and one MULTI or script per shard work there) and one group/consumer, a `GroupReader` owns:

- its position per stream: its OWN pending entries first after a (re)start (read by id, page after
  page, so a batch still being worked on is not read twice), then new entries (`>`);
- entries trimmed while pending (they come back without fields): acknowledged at once, reported;
- at the first read, when it dead-letters, its own pending entries delivered more than
  MAX_DELIVERIES times (a stable consumer name re-reads them on every restart: an entry that
  crashes the process would stop it for good otherwise);
- the sweep: the one reclaim (`pending.reclaim`: XPENDING, `plan_reclaim`, XCLAIM) of the entries a
  dead consumer left idle for CLAIM_IDLE_MS (or, `whole_consumer`, all the entries of one dead
  consumer at once), never the entries this process holds (read and not yet acknowledged); poison
  dead-lettered (or, when the consumer has no dead-letter stream, claimed and named); the group's
  backlog per stream (`lag.read_backlog_sync`: unknown lag counted);
- acknowledgement: XACK in one MULTI per shard; with dead letters (contracts/deadletters.py, into the
  consumer's OWN dead-letter stream), XADD and XACK in one script per shard (the one dead-letter
  writer, services/streams/deadletter.py), so a dead letter exists iff its entry is acked, even when
  the XADD fails, and the dead-letter stream is trimmed by age in the same step;
- the outage rule that keeps the delivery count honest: an acknowledgement the broker refused for
  its own state (`is_refusal`) is retried in place (`ack_in_place`) with the entries still held, so
  no sweep takes them back and Redis counts no delivery for it (services/streams/pending.py);
- group creation at 0 (`groups.create_group_sync`) and, after NOGROUP or a lost connection,
  `reset()`: positions back to the own pending entries, groups created again before the next read.

What it does not own: the handler and the target (rows, segments), cut and batch policy, metrics,
readiness, backoff of the caller's own loop.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts.deadletters import MAX_DELIVERIES, DeadLetter
from services.backoff import Backoff
from services.broker.errors import TRANSIENT_CODES, reply_code
from services.streams.deadletter import DeadLetterWriter
from services.streams.groups import create_group_sync
from services.streams.lag import GroupBacklog, read_backlog_sync
from services.streams.pending import (
    PendingEntry,
    Poison,
    StreamEntry,
    dead_consumer_rows,
    drive,
    max_deliveries_detail,
    pending_page,
    reclaim,
)

log = logging.getLogger("goose_ingest.streams")

NEW = ">"  # the position of a stream whose own pending entries have all been read
PENDING_START = "0"
ACK_CHUNK = 10_000  # ids per XACK inside one MULTI (a segment can hold far more)
OWN_PENDING_PAGES = 10  # own pending entries checked for poison at start: a few batches at most
# A broker that is away (no reply at all). Its refusals for its own state are ResponseErrors with a
# TRANSIENT code; EXECABORT is the MULTI of XACKs that one of them (LOADING, READONLY) aborted whole.
BROKER_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
REFUSAL_CODES = TRANSIENT_CODES | {"EXECABORT"}


class ReadResult(NamedTuple):
    entries: list[StreamEntry]
    trimmed: list[StreamEntry]  # pending, but deleted before it was handled: already acknowledged (no fields)
    caught_up: list[str]  # streams whose own pending entries were all read by this call
    dead_lettered: list[StreamEntry]  # own pending poison found at the first read, dead-lettered and acked


class SweepResult(NamedTuple):
    claimed: list[StreamEntry]  # a dead consumer's idle entries, now this consumer's to handle
    poison: list[StreamEntry]  # past MAX_DELIVERIES: dead-lettered and acked; without a dead-letter stream, claimed too
    backlog: dict[str, GroupBacklog]


def is_refusal(exc: BaseException) -> bool:
    """The broker did not take the request for its own state or was away: retry the same request
    in place, never count it against the entries."""
    if isinstance(exc, BROKER_ERRORS):
        return True
    return isinstance(exc, ResponseError) and reply_code(exc) in REFUSAL_CODES


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GroupReader:
    """See the module docstring. Thread use: one thread reads and sweeps; acknowledgements may come
    from another (the held set is locked)."""

    def __init__(self, client: Any, shards: Sequence[Sequence[str]], group: str, consumer: str, *,
                 max_deliveries: int = 0, claim_idle_ms: int = 0,
                 deadletter_stream: Callable[[int], str] | None = None, exporter: str | None = None,
                 logger: logging.Logger | None = None, start_id: Callable[[str], str] | None = None,
                 deadletter_retention_hours: float | None = None) -> None:
        self.client = client
        self.shards = [list(streams) for streams in shards]
        self.group = group
        self.consumer = consumer
        self.max_deliveries = max_deliveries
        self.claim_idle_ms = claim_idle_ms
        self.deadletter_stream = deadletter_stream
        self.exporter = exporter
        self.log = logger or log
        self.start_id = start_id  # where a (re)created group starts; None: at 0
        self.shard_of: dict[str, int] = {s: i for i, streams in enumerate(self.shards) for s in streams}
        self.streams: list[str] = list(self.shard_of)
        self.position: dict[str, str] = {s: PENDING_START for s in self.streams}
        self.groups_ok = False
        self._own_poison_checked = deadletter_stream is None  # without a dead-letter stream: nothing to check
        # Entry ids read and not yet acknowledged by this process: the sweep never claims them back
        # from ourselves. A batch held through a target outage longer than CLAIM_IDLE_MS would
        # otherwise be claimed again, each claim a delivery, pushing good entries toward MAX_DELIVERIES.
        self._held: dict[str, set[str]] = {s: set() for s in self.streams}
        self._held_lock = threading.Lock()
        self._letters = DeadLetterWriter(client, group, deadletter_retention_hours)

    # ------------------------------------------------------------------ state
    def ensure_groups(self) -> None:
        for stream in self.streams:
            # at 0 (what the stream retains) unless the consumer knows where it is (the archive)
            create_group_sync(self.client, stream, self.group, self.start_id(stream) if self.start_id else "0")
        self.groups_ok = True

    def reset(self, forget_held: bool = False) -> None:
        """After NOGROUP or a lost connection: read own pending entries again, recreate the groups
        first. `forget_held`: the caller dropped what it held (it will read it again)."""
        self.position = {s: PENDING_START for s in self.streams}
        self.groups_ok = False
        if forget_held:
            with self._held_lock:
                for ids in self._held.values():
                    ids.clear()

    def reread_own(self, stream: str) -> None:
        """Read this consumer's own pending entries of `stream` again from id 0 (the caller dropped
        what it had read of them, e.g. to read claimed entries together with its own, in id order).
        What it holds stays held: those entries are still its own, and the sweep must not take them."""
        self.position[stream] = PENDING_START

    def reading_new(self, stream: str) -> bool:
        """True once the stream's own pending entries have all been read."""
        return self.position[stream] == NEW

    @property
    def catching_up(self) -> bool:
        return any(p != NEW for p in self.position.values())

    def held(self, stream: str) -> set[str]:
        with self._held_lock:
            return set(self._held[stream])

    def _hold(self, entries: Iterable[StreamEntry]) -> None:
        with self._held_lock:
            for e in entries:
                self._held[e.stream].add(e.entry_id)

    def _release(self, pending: Mapping[str, Sequence[str]]) -> None:
        with self._held_lock:
            for stream, ids in pending.items():
                self._held[stream].difference_update(ids)

    # ------------------------------------------------------------------ read
    def read(self, streams: Sequence[str], count: int, block_ms: int | None = None) -> ReadResult:
        """One XREADGROUP of `streams` (all of one shard) at their positions. The entries read are
        held until acknowledged."""
        if not self.groups_ok:
            self.ensure_groups()
        dead: list[StreamEntry] = []
        if not self._own_poison_checked:
            dead = self._drop_own_poison(count)
        ids = {s: self.position[s] for s in streams}
        reply = self.client.xreadgroup(self.group, self.consumer, ids, count=count, block=block_ms)
        got: list[StreamEntry] = []
        trimmed: list[StreamEntry] = []
        seen: set[str] = set()
        for raw_stream, items in reply or []:
            stream = _s(raw_stream)
            for raw_id, fields in items:
                entry_id = _s(raw_id)
                seen.add(stream)
                if ids[stream] != NEW:
                    self.position[stream] = entry_id  # own pending entries are read by id: go on after it
                if not fields:  # pending, but trimmed from the stream before it was handled
                    trimmed.append(StreamEntry(stream, entry_id, {}))
                else:
                    got.append(StreamEntry(stream, entry_id, fields))
        caught_up = [s for s in streams if ids[s] != NEW and s not in seen]
        for stream in caught_up:
            self.position[stream] = NEW
        if trimmed:
            self.ack(by_stream(trimmed))  # nothing to handle
        self._hold(got)
        return ReadResult(got, trimmed, caught_up, dead)

    def _drop_own_poison(self, count: int) -> list[StreamEntry]:
        """Before re-reading this consumer's own pending entries at start (a predecessor of the same
        name read them and died): those delivered more than MAX_DELIVERIES times (each restart's
        re-read is one) are dead-lettered. Only at start: a re-read after a broker outage is not an
        attempt on the entry."""
        dead: list[StreamEntry] = []
        for stream in self.streams:
            rows = drive(self.client, pending_page(stream, self.group, OWN_PENDING_PAGES * count, consumer=self.consumer))
            found = drive(self.client, reclaim(stream, self.group, self.consumer, rows, idle_ms=0,
                                               max_deliveries=self.max_deliveries, claim=False))
            dead += self._dead_letter_poison(found.poison)
        self._own_poison_checked = True
        return dead

    # ------------------------------------------------------------------ sweep
    def sweep(self, count: int, streams: Collection[str] | None = None, whole_consumer: bool = False) -> SweepResult:
        """The one reclaim (services/streams/pending.py `reclaim`) on every stream: claim what a dead
        consumer left idle for CLAIM_IDLE_MS (never what this process holds), dead-letter poison,
        and measure the group's backlog on every stream.

        `streams`: claim on these only (the backlog is measured on all). `whole_consumer`: per
        stream, claim all the pending entries of ONE other consumer, and only once every one of
        them is idle for CLAIM_IDLE_MS (the one whose oldest entry is oldest); never a part of a
        consumer's entries. For a consumer whose batches must keep their boundaries (the archive:
        a segment's object is named after its first id, services/archive/consumer.py)."""
        if not self.groups_ok:
            self.ensure_groups()
        claimed: list[StreamEntry] = []
        poison: list[StreamEntry] = []
        backlog: dict[str, GroupBacklog] = {}
        for stream in self.streams:
            if streams is None or stream in streams:
                if whole_consumer:
                    rows = self.dead_consumer_entries(stream)
                else:
                    rows = drive(self.client, pending_page(stream, self.group, count, idle_ms=self.claim_idle_ms))
                # Without a dead-letter stream nothing is poison: claimed with the rest, and named to the caller.
                cap = self.max_deliveries if self.deadletter_stream is not None else sys.maxsize
                found = drive(self.client, reclaim(stream, self.group, self.consumer, rows, idle_ms=self.claim_idle_ms,
                                                   max_deliveries=cap, in_flight=self.held(stream)))
                self._hold(found.claimed)
                claimed += found.claimed
                if self.deadletter_stream is not None:
                    poison += self._dead_letter_poison(found.poison)
                else:
                    over = {row.entry_id for row in rows if row.deliveries > self.max_deliveries}
                    poison += [e for e in found.claimed if e.entry_id in over]
            backlog[stream] = read_backlog_sync(self.client, stream, self.group)
        if claimed:
            self.log.info("claimed %d entries left pending by another consumer", len(claimed))
        return SweepResult(claimed, poison, backlog)

    def dead_consumer_entries(self, stream: str) -> list[PendingEntry]:
        """The pending entries of the one other consumer whose entries are all idle for
        CLAIM_IDLE_MS (`pending.dead_consumer_rows`); [] if none."""
        return drive(self.client, dead_consumer_rows(stream, self.group, self.consumer, self.claim_idle_ms))

    def _dead_letter_poison(self, poison: Sequence[Poison]) -> list[StreamEntry]:
        """Poison dead-lettered and acknowledged in one step (the consumer has a dead-letter stream)."""
        if not poison:
            return []
        out = [p.entry for p in poison]
        self.ack(by_stream(out), [self.dead_letter(p.entry, MAX_DELIVERIES, max_deliveries_detail(p.row)) for p in poison])
        return out

    # ------------------------------------------------------------------ acknowledge
    def dead_letter(self, entry: StreamEntry, reason: str, detail: str,
                    fields: Mapping[bytes, Any] | Mapping[str, Any] | None = None) -> DeadLetter:
        """The dead-letter record of `entry` as this consumer writes it (`fields`: the entry's own, by default)."""
        return DeadLetter(reason, detail, entry.stream, entry.entry_id, exporter=self.exporter, group=self.group,
                          raw=entry.fields if fields is None else fields)

    def ack(self, pending: Mapping[str, Sequence[str]], dead: Sequence[DeadLetter] = ()) -> None:
        """XACK `pending` ({stream: ids}) and XADD `dead` to this consumer's own dead-letter stream:
        per shard, one MULTI, or with dead letters one script (services/streams/deadletter.py), so a
        dead letter is written iff its entry is acknowledged."""
        by_shard: dict[int, tuple[dict[str, Sequence[str]], list[DeadLetter]]] = {}
        for stream, ids in pending.items():
            if ids:
                by_shard.setdefault(self.shard_of[stream], ({}, []))[0][stream] = ids
        if dead and self.deadletter_stream is None:
            raise ValueError("this consumer has no dead-letter stream")
        for letter in dead:
            by_shard.setdefault(self.shard_of[letter.source], ({}, []))[1].append(letter)
        for shard, (acks, letters) in sorted(by_shard.items()):
            if letters:
                assert self.deadletter_stream is not None
                # one script: nothing acknowledged unless the dead letters are written (deadletter.py)
                self._letters.write(self.deadletter_stream(shard), letters, acks)
                continue
            pipe = self.client.pipeline(transaction=True)
            for stream, ids in acks.items():
                for i in range(0, len(ids), ACK_CHUNK):
                    pipe.xack(stream, self.group, *ids[i: i + ACK_CHUNK])
            pipe.execute()
        self._release(pending)
        for letter in dead:
            self.log.warning("dead-lettered %s %s: %s (%s)", letter.source, letter.source_id, letter.reason,
                             letter.detail)

    def ack_in_place(self, pending: Mapping[str, Sequence[str]], dead: Sequence[DeadLetter],
                     stopping: threading.Event, refused: Callable[[BaseException, float], None],
                     backoff: Backoff) -> bool:
        """`ack`, retried in place while the broker refuses it for its own state (`is_refusal`):
        the entries stay held meanwhile, so the refusal costs no delivery. `refused(exc, backoff)`
        reports each refusal. False when stopping first (nothing acknowledged; nothing was written)."""
        while True:
            try:
                self.ack(pending, dead)
                return True
            except (RedisConnectionError, RedisTimeoutError, OSError, ResponseError) as exc:
                if not is_refusal(exc):
                    raise
                refused(exc, backoff.delay)
            if stopping.wait(backoff.next()):
                return False

    # ------------------------------------------------------------------ lag
    def backlog(self, stream: str) -> GroupBacklog:
        return read_backlog_sync(self.client, stream, self.group)

    def oldest_waiting(self, stream: str, backlog: GroupBacklog) -> str | None:
        """The id of the oldest entry of `stream` the group has not acknowledged (pending first)."""
        if backlog.missing:
            return None
        if backlog.pending:
            summary = self.client.xpending(stream, self.group)
            return _s(summary["min"]) if summary and summary.get("min") else None
        if backlog.lag:
            after = self.client.xrange(stream, min="(" + backlog.last_delivered, count=1)
            return _s(after[0][0]) if after else None
        return None


def by_stream(entries: Iterable[tuple[str, str] | StreamEntry]) -> dict[str, list[str]]:
    """{stream: [ids]} of entries, in their order (what `ack` takes)."""
    out: dict[str, list[str]] = {}
    for e in entries:
        out.setdefault(e[0], []).append(e[1])
    return out

