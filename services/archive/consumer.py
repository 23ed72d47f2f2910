"""The archive's consumer loop (the imperative shell around segments.py): read, cut, write, ack.

One thread, a synchronous Redis client and a plain loop, like the PostgreSQL sink (a batch is a
segment of up to ARCHIVE_SEGMENT_MAX_ENTRIES entries, not FastStream's one message per call). The
group reading (positions, own pending entries first, trimmed entries, the one-MULTI
acknowledgement, group creation, the sweep) is the consumer skeleton's `GroupReader`
(services/streams/reader.py); this module keeps the segments (cut, write, ack) and the store. It
writes no dead letters: an entry is archived whatever it holds (see `_sweep` for poison).

Per stream it reads (every raw shard, every control stream, every partition of the events and runs
topics), in stream-id order, with its own consumer group (ARCHIVE_GROUP):

0. At start (services/archive/fence.py, issue 32): the group's lease (one archive per group: a
   second live one is refused, exit 2), the store's deployment id (another deployment's store is
   refused, exit 2), then what the store holds per stream (`load_positions`: the last id archived),
   then the entries other consumer names left pending (names are per process; with the lease held
   they are dead) become this one's (`adopt`). A group that is missing is created AFTER what the
   store holds, not at 0 (`_start_id`): a lost group resumes, nothing is archived twice.
1. First its own pending entries (XREADGROUP from id 0): what a killed predecessor had read and
   maybe written but not acknowledged. ALL of them become one segment, whatever the cut settings.
   Entries at or below the store's position are acknowledged without being written again.
2. Then new entries (`>`), into a segment that is cut at ARCHIVE_SEGMENT_MAX_ENTRIES entries,
   ARCHIVE_SEGMENT_MAX_BYTES bytes of fields, or ARCHIVE_SEGMENT_MAX_AGE_S after its first entry
   was read, whichever comes first.
3. A cut segment is written whole (every object of it, each CREATED, never replacing one: names
   carry the first and last id, segments.py), the positions record follows, then its entries are
   acknowledged in ONE MULTI/EXEC (unless the lease was lost meanwhile: then nothing more is).
4. While the store fails, the segment is retried with backoff (the same bytes) and nothing is
   acknowledged or read further on that stream: Redis keeps the entries (the workers' raw trim waits
   for this group's position, services/worker/housekeeping.py), readiness says why.
5. Every SWEEP_INTERVAL_S: the broker check (`_check_broker`: a restart, failover or rollback seen
   by its run_id, a lease found gone, a group recreated: what Redis lost that the archive holds is
   counted and logged, what became pending again is re-read and acknowledged), and the sweep: the
   entries another consumer name left pending and idle for CLAIM_IDLE_MS are taken over (`_sweep`).
6. Memory: raw and control entries of an open segment become compressed row groups every
   ROW_GROUP_ENTRIES or when ARCHIVE_BUFFER_MAX_BYTES is exceeded (the segment stays open); the
   event lake, split by date and type only at the cut, is cut early instead.

Order across replicas: one reader per group, fenced by the lease (docs/archive.md "Guarantees").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import ResponseError

from services.archive import segments as sg
from services.archive.fence import Lease, restore_deployment
from services.archive.metrics import ArchiveMetrics
from services.archive.store import ArchiveStore, StoreError
from services.backoff import Backoff
from services.broker.errors import describe
from services.settings import Settings
from services.streams.groups import is_nogroup
from services.streams.pending import drive, hand_over, pending_page
from services.streams.reader import BROKER_ERRORS, GroupReader, by_stream
from services.streams.readiness import READY, Readiness, not_ready


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

log = logging.getLogger("goose_ingest.archive")

POSITIONS_PREFIX = "_goose-ingest/positions/"  # + the group: what the archive holds per stream (docs/archive.md)
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
IDLE_SLEEP_S = 0.2  # nothing read in a whole round: the next round after this (segments are minutes long anyway)
# Raw and control entries become a compressed row group every this many, so an open segment holds
# its bytes compressed, not as Python objects (docs/archive.md "Memory").
ROW_GROUP_ENTRIES = 10_000
_ENCODED: dict[bytes, bytes] = {}  # the fields of an entry already in a row group (dropped)
# Tests only (GOOSE_INGEST_TEST_* is never a setting): hold this long between writing a segment and
# acknowledging it, so a test can SIGKILL the process exactly there (tests/archive/test_archive.py).
_HOLD_BEFORE_ACK = "GOOSE_INGEST_TEST_ARCHIVE_HOLD_BEFORE_ACK_S"


@dataclass
class Source:
    """One stream the archive reads, and the segment it is building from it."""

    stream: str
    dataset: str  # "raw", "control", "events", "runs" (metrics.DATASETS)
    shard: int
    entries: list[tuple[str, dict[bytes, bytes]]] = field(default_factory=list)
    size: int = 0  # field bytes held as Python objects (what the memory budget counts)
    total: int = 0  # field bytes of the open segment, encoded or not (what the size cut counts)
    opened_at: float = 0.0  # monotonic time its first entry was read
    sealed: int = 0  # > 0: the first `sealed` entries are a cut segment waiting to be written
    # Raw and control: the first `encoded` entries are already row groups in `writer` (their fields
    # dropped from memory); `objects` caches a cut segment's bytes so a retried write puts the same.
    encoded: int = 0
    writer: sg.RawSegmentWriter | None = None
    objects: list[tuple[str, bytes]] | None = None
    rejected: int = 0
    # A dead consumer's entries wait to be taken over here: its own segment was cut for them and
    # nothing more is read until they are (Archiver._sweep).
    takeover: bool = False

    def reset(self) -> None:
        self.entries = []
        self.takeover = False
        self.size = self.total = self.sealed = self.encoded = self.rejected = 0
        self.writer = None
        self.objects = None


def sources(settings: Settings) -> list[list[Source]]:
    """The streams, grouped by shard: the streams of one shard share a hash slot on a cluster, so
    one XREADGROUP reads them all. On a single node the one partition of each topic goes with shard 0."""
    layout = settings.layout
    groups = [[Source(layout.raw_stream(i), "raw", i), Source(layout.control_stream(i), "control", i)]
              for i in range(settings.shards)]
    for dataset, partitions in (("events", layout.events_partitions()), ("runs", layout.runs_partitions())):
        for i, stream in enumerate(partitions):
            groups[i].append(Source(stream, dataset, i))
    return groups


def encode_lake(src: Source, entries: Sequence[tuple[str, dict[bytes, bytes]]]) -> sg.LakeSegment:
    topic = [sg.TopicEntry(src.shard, entry_id, fields) for entry_id, fields in entries]
    return sg.encode_event_rows(topic, []) if src.dataset == "events" else sg.encode_event_rows([], topic)


class Fenced(Exception):
    """Another archive took the group's lease: this one stops before acknowledging anything more."""


def _after(entry_id: str, position: tuple[int, int] | None) -> bool:
    return position is None or sg.id_parts(entry_id) > position


class Archiver:
    def __init__(self, settings: Settings, client: Any, store: ArchiveStore, metrics: ArchiveMetrics,
                 consumer: str = "archive") -> None:
        self.settings = settings
        self.client = client
        self.store = store
        self.metrics = metrics
        self.group = settings.archive_group
        self.consumer = consumer
        self.shards = sources(settings)
        self.all = [src for group in self.shards for src in group]
        # Its own pending entries first, then new ones; acknowledgements in one MULTI (step 3).
        self.by_stream = {src.stream: src for src in self.all}
        # What the store holds per stream: the last id archived (segments are written in id order).
        # Entries at or below it that come again (a rollback, a lost group, a takeover) are
        # acknowledged without being written again; a lost group is created again after it.
        self.positions: dict[str, tuple[int, int]] = {}
        self.reader = GroupReader(client, [[src.stream for src in group] for group in self.shards], self.group,
                                  consumer, max_deliveries=settings.max_deliveries,
                                  claim_idle_ms=settings.claim_idle_ms, logger=log, start_id=self._start_id)
        self.lease: Lease | None = None
        self.deployment: str | None = None
        self.fenced = False
        self._run_ids: frozenset[str] | None = None
        self._last_broker_check = 0.0
        self._check_reason: str | None = None  # a reason to compare the streams with the store now
        self._lost_reported: dict[str, tuple[int, int]] = {}  # per stream: a loss reported up to this id
        self._last_sweep = 0.0
        self.stopping = threading.Event()
        self._broker_why: str | None = "connecting to the broker"
        self._store_why: str | None = None
        self._behind_why: str | None = None
        self._last_gauge = 0.0
        self._last_store_log = ""
        self._broker_failed_once = False
        self._hold_before_ack = float(os.environ.get(_HOLD_BEFORE_ACK) or 0)

    # ------------------------------------------------------------------ state
    def readiness(self) -> Readiness:
        """Ready, or not with the reason /readyz shows (never a credential)."""
        if self.stopping.is_set():
            return not_ready("stopping")
        for why in (self._broker_why, self._store_why, self._behind_why):
            if why:
                return not_ready(why)
        return READY

    def _update_ready(self) -> None:
        self.metrics.ready.set(1 if self.readiness() else 0)

    def stop(self) -> None:
        self.stopping.set()

    def fault(self) -> str | None:
        """Why `run` ended on its own: fenced, another archive took the lease over (exit 1)."""
        return "fenced: another archive took over its lease" if self.fenced else None

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
        while not self.stopping.is_set():
            try:
                busy = self.step()
                if self._broker_why and self._broker_failed_once:
                    log.info("broker reachable again")
                self._broker_why = None
                self._gauge()
                self._update_ready()
                backoff.reset()
                if not busy:
                    self.stopping.wait(IDLE_SLEEP_S)
                continue
            except Fenced:
                self.fenced = True
                self.stopping.set()
                break
            except StoreError as exc:
                self._store_failed(exc, backoff.delay)
            except BROKER_ERRORS as exc:
                self._broker_failed(f"broker unreachable ({describe(exc)})", backoff.delay)
            except ResponseError as exc:
                if is_nogroup(exc):
                    # The broker lost a stream or the group (restart without persistence): recreate
                    # at 0 and start over from this consumer's pending entries.
                    self._broker_failed("consumer group missing on a stream (Redis restarted empty?): recreating it "
                                        "after what the archive holds", backoff.delay)
                    self._check_reason = "a consumer group was missing (Redis restarted empty, flushed, or DESTROY)"
                else:
                    self._broker_failed(f"broker refused a command ({describe(exc)})", backoff.delay)
            self._gauge_while_failing()
            self._update_ready()
            if self.stopping.wait(backoff.next()):
                break
        if not self.fenced:
            self.flush_on_stop()
        if self.lease is not None:
            self.lease.release()

    def store_unavailable(self, exc: StoreError) -> None:
        """The start-up check could not reach the store: not ready until a write or a probe succeeds."""
        self._store_why = f"archive store failing: {exc}"
        self._last_store_log = str(exc)

    def _broker_failed(self, why: str, backoff: float) -> None:
        self._broker_failed_once = True
        self.metrics.failures.labels("broker").inc()
        if why != self._broker_why:
            log.warning("%s; retrying every %.1fs at most %.0fs", why, backoff, BACKOFF_MAX_S)
        self._broker_why = why
        self.reader.reset(forget_held=True)  # what we hold but did not acknowledge is read again as our pending entries
        for src in self.all:
            src.reset()

    def _store_failed(self, exc: StoreError, backoff: float) -> None:
        self.metrics.failures.labels("store").inc()
        why = f"archive store failing: {exc}"
        if str(exc) != self._last_store_log:  # one line per distinct failure, not one per retry
            log.warning("%s; nothing acknowledged, retrying (backoff up to %.0fs)", why, BACKOFF_MAX_S)
            self._last_store_log = str(exc)
        self._store_why = why

    def ensure_groups(self) -> None:
        self.reader.ensure_groups()  # after what the store holds, else at id 0 (not `$`): Redis's entries are archived
        self._report_gaps()

    def _report_gaps(self) -> None:
        """At start: a group that delivered past what the store holds, with nothing pending in
        between, had entries acknowledged that this archive never wrote (the runbook's last resort,
        docs/archive.md "When the archive is down or behind", or a group moved by hand): one line
        per stream and a metric. They are not in the archive; Redis may still hold some."""
        for src in self.all:
            pos = self.positions.get(src.stream)
            if pos is None:
                continue
            backlog = self.reader.backlog(src.stream)
            if backlog.missing or sg.id_parts(backlog.last_delivered) <= pos:
                continue
            if drive(self.client, pending_page(src.stream, self.group, 1, after=f"{pos[0]}-{pos[1]}")):
                continue  # read and not acknowledged: this archive re-reads them
            self.metrics.gaps.labels(src.dataset).inc()
            log.warning("the group on %s is past what the archive holds (archived up to %d-%d, delivered up to %s): "
                        "entries in between were acknowledged without being archived and are not in the archive",
                        src.stream, pos[0], pos[1], backlog.last_delivered)

    def _start_id(self, stream: str) -> str:
        pos = self.positions.get(stream)
        return "0" if pos is None else f"{pos[0]}-{pos[1]}"

    # ------------------------------------------------------------------ start: fence, positions, adoption
    def start(self, lease: Lease | None, deployment: str | None) -> None:
        """After the lease is held and the deployment checked: what the store holds, then the
        entries other (dead: we hold the lease) consumers of the group left pending become ours."""
        self.lease, self.deployment = lease, deployment
        if lease is not None:
            lease.start()
        self.load_positions()
        self.adopt()
        self._check_reason = "at start"  # the broker may have gone back while no archive ran

    def load_positions(self) -> None:
        """Per stream, the last id the store holds: the positions record (written after every
        segment), then the raw and control objects written after it (their names carry their last
        id: a crash between a segment's object and the record loses nothing)."""
        record: dict[str, str] = {}
        key = POSITIONS_PREFIX + self.group + ".json"
        if self.store.exists(key):
            try:
                record = dict(orjson.loads(self.store.get(key))["streams"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                log.warning("positions record %s unreadable (%s): recovering from the object names", key, exc)
        for stream, entry_id in record.items():
            if stream in self.by_stream:
                self.positions[stream] = sg.id_parts(entry_id)
        kinds = [src for src in self.all if src.dataset in sg.STREAM_KINDS]
        since: str | None = None  # no record (a first start, an archive from before issue 32): list all once
        if record:
            # A stream in the record: objects after it are in its date or later. A stream not in it:
            # nothing of it was acknowledged (the record is written before every acknowledgement),
            # so nothing archived of it is trimmed yet: its objects start at Redis's first entry.
            dates = []
            for src in kinds:
                pos = self.positions.get(src.stream)
                if pos is None:
                    head = self.client.xrange(src.stream, count=1)
                    pos = sg.id_parts(_text(head[0][0])) if head else None
                if pos is not None:
                    dates.append(sg.date_of_ms(pos[0]))
            since = min(dates, default="9999-12-31")
        by_kind = {(src.dataset, src.shard): src.stream for src in kinds}
        old: dict[str, tuple[tuple[int, int], str]] = {}
        for key_ in self.store.list_after(sg.RAW_PREFIX + "/", since):
            try:
                ref = sg.parse_raw_segment_key(key_)
            except ValueError:
                continue
            owner = by_kind.get((ref.stream, ref.shard))
            if owner is None:
                continue
            if ref.last_id is None:  # a name from before issue 32: its last id is inside
                first = sg.id_parts(ref.first_id)
                if owner not in old or old[owner][0] < first:
                    old[owner] = (first, key_)
                continue
            last = sg.id_parts(ref.last_id)
            if last > self.positions.get(owner, (0, 0)):
                self.positions[owner] = last
        for owner, (first, key_) in old.items():
            if first > self.positions.get(owner, (0, 0)):
                ids = [sg.id_parts(e.id) for e in sg.decode_raw_segment(self.store.get(key_))]
                self.positions[owner] = max(ids, default=first)
        if self.positions:
            top = max(self.positions.values())
            log.info("the store holds entries of %d streams (up to %d-%d)", len(self.positions), *top)

    def _save_positions(self) -> None:
        doc = {"streams": {s: f"{p[0]}-{p[1]}" for s, p in sorted(self.positions.items())},
               "consumer": self.consumer, "at": time.time()}
        self.store.put(POSITIONS_PREFIX + self.group + ".json", orjson.dumps(doc))

    def adopt(self) -> None:
        """With the lease held no other archive of the group is alive: the entries other consumer
        names left pending (a killed predecessor: names are per process) become this one's now (no
        idle wait), read again as its own; the names are removed from the group."""
        taken = 0
        for stream in self.reader.streams:
            try:
                consumers = self.client.xinfo_consumers(stream, self.group)
            except ResponseError:
                continue  # no stream or no group yet
            for row in consumers:
                name = row["name"].decode() if isinstance(row["name"], bytes) else str(row["name"])
                if name == self.consumer:
                    continue
                count = int(row.get("pending") or 0)
                if count:
                    taken += drive(self.client, hand_over(stream, self.group, self.consumer, name, count))
                self.client.xgroup_delconsumer(stream, self.group, name)
        if taken:
            log.info("took over %d entries left pending by earlier archive processes", taken)
        self.reader.reset(forget_held=True)
        for src in self.all:
            src.reset()

    # ------------------------------------------------------------------ the broker went back in time
    def _check_broker(self) -> None:
        """Every sweep interval: the server's run_id (INFO). A restart (or a failover, a rollback),
        the lease found gone, or a group recreated after NOGROUP: compare each stream with what the
        store holds; report what Redis lost that the archive has (a metric and one line); take over
        and re-read what became pending again (entries already archived are acknowledged only)."""
        now = time.monotonic()
        if self._check_reason is None and now - self._last_broker_check < self.settings.sweep_interval_s:
            return
        self._last_broker_check = now
        ids = self._server_ids()
        restarted = self._run_ids is not None and ids != self._run_ids
        self._run_ids = ids
        retaken = self.lease is not None and self.lease.retaken.is_set()
        if not (restarted or retaken or self._check_reason):
            return
        why = ("the server restarted or failed over (run_id changed)" if restarted
               else "the archive lease was gone from the broker" if retaken else self._check_reason or "")
        self._check_reason = None
        if self.lease is not None:
            self.lease.retaken.clear()
        if self.deployment is not None:
            restore_deployment(self.client, self.settings.layout.archive_identity(self.group), self.deployment)
        lost: list[str] = []
        for src in self.all:
            pos = self.positions.get(src.stream)
            if pos is None:
                continue
            if src.dataset in sg.STREAM_KINDS:
                missing = self._missing_from_redis(src, pos)
                if missing:
                    self.metrics.broker_lost.labels(src.dataset).inc(len(missing))
                    lost.append(f"{src.stream} from {missing[0][0]}-{missing[0][1]} to {missing[-1][0]}-{missing[-1][1]} "
                                f"({len(missing)} entries)")
                continue
            # The event lake's rows carry no stream id: the line names the range.
            last = max(self._held_through(src.stream, pos), self._lost_reported.get(src.stream, (0, 0)))
            if last < pos:
                self._lost_reported[src.stream] = pos
                lost.append(f"{src.stream} after {last[0]}-{last[1]} up to {pos[0]}-{pos[1]}")
        if lost:
            log.warning("broker went back in time (%s): Redis lost what the archive holds: %s (kept in the archive; "
                        "what became pending again is acknowledged without being written twice)", why, "; ".join(lost))
        elif why != "at start":
            log.warning("broker check (%s): Redis holds everything the archive has written%s", why,
                        " but what was reported lost before" if self._lost_reported else "")
        if why == "at start":
            return  # adopt() ran already
        self.metrics.broker_rollbacks.inc()
        self.adopt()

    def _missing_from_redis(self, src: Source, pos: tuple[int, int]) -> list[tuple[int, int]]:
        """The ids the archive wrote up to `pos` that Redis lost, not reported before: archived, not
        in Redis, and above its first entry or its last-generated id. A trim removes only a stream's
        head (and leaves no `max-deleted-entry-id`): what it took lies below the first entry, and a
        restart that lost nothing keeps the last-generated id at or above `pos`. Compared id by id,
        not by a tail position: the writes after a rollback, and the archive's own reading of them,
        move any tail past the loss before a check runs."""
        try:
            info = self.client.xinfo_stream(src.stream)
        except ResponseError:
            info = {}  # the stream is gone: whatever the archive holds above nothing is lost
        floor = self._lost_reported.get(src.stream, (0, 0))
        archived = [i for i in self._archived_ids(src, floor) if i <= pos]
        if not archived:
            return []
        first = info.get("first-entry")
        first_id = sg.id_parts(_text(first[0])) if first else None
        generated = sg.id_parts(_text(info.get("last-generated-id") or "0-0"))
        held: set[tuple[int, int]] = set()
        cursor = f"{archived[0][0]}-{archived[0][1]}"
        while first_id is not None:
            page = self.client.xrange(src.stream, min=cursor, max=f"{pos[0]}-{pos[1]}", count=10_000)
            held.update(sg.id_parts(_text(entry_id)) for entry_id, _ in page)
            if len(page) < 10_000:
                break
            cursor = "(" + _text(page[-1][0])
        missing = sorted(i for i in set(archived) - held
                         if i > generated or (first_id is not None and i > first_id))
        if missing:
            self._lost_reported[src.stream] = missing[-1]
        return missing

    def _archived_ids(self, src: Source, after: tuple[int, int]) -> list[tuple[int, int]]:
        """The stream ids the store holds for `src` above `after` (objects wholly at or below it are not read)."""
        ids: list[tuple[int, int]] = []
        for key in self.store.list_after(sg.RAW_PREFIX + "/", sg.date_of_ms(after[0])):
            try:
                ref = sg.parse_raw_segment_key(key)
            except ValueError:
                continue
            if ref.stream != src.dataset or ref.shard != src.shard:
                continue
            if ref.last_id is not None and sg.id_parts(ref.last_id) <= after:
                continue
            ids.extend(i for i in sg.segment_ids(self.store.get(key)) if i > after)
        return sorted(ids)

    def _held_through(self, stream: str, pos: tuple[int, int]) -> tuple[int, int]:
        """The id through which Redis still accounts for what the archive wrote up to `pos`: the
        greatest entry at or below `pos` it holds, or its largest deleted id when a trim removed the
        rest (the workers trim only what the archive has). Not the stream's last-generated id: the
        writes after a rollback move that past `pos` before a check runs and hide the loss."""
        try:
            info = self.client.xinfo_stream(stream)
            below = self.client.xrevrange(stream, max=f"{pos[0]}-{pos[1]}", count=1)
        except ResponseError:
            return (0, 0)  # the stream is gone
        held = sg.id_parts(_text(below[0][0])) if below else (0, 0)
        deleted = sg.id_parts(_text(info.get("max-deleted-entry-id") or "0-0"))
        return max(held, deleted)

    def _server_ids(self) -> frozenset[str]:
        """The run_ids of the broker's servers: every primary's on a cluster (redis-py would ask one
        node only: a failover of another primary would go unseen)."""
        from redis.cluster import RedisCluster

        if isinstance(self.client, RedisCluster):
            info = self.client.info("server", target_nodes=RedisCluster.PRIMARIES)
        else:
            info = self.client.info("server")
        found: set[str] = set()
        stack = [info]
        while stack:  # a cluster client answers per node
            item = stack.pop()
            if isinstance(item, dict):
                if "run_id" in item:
                    found.add(str(item["run_id"]))
                else:
                    stack.extend(item.values())
        return frozenset(found)

    def _new(self, src: Source) -> bool:
        """Its own pending entries all read (they make one segment): new entries now."""
        return self.reader.reading_new(src.stream)

    def step(self) -> bool:
        """One round over every shard: write what is cut, read more. True if anything happened."""
        self._check_broker()
        busy = self._sweep()
        for group in self.shards:
            for src in group:
                if not src.sealed and src.entries and self._due(src):
                    src.sealed = len(src.entries)
                if src.sealed:
                    self.write(src)
                    busy = True
            readable = [src.stream for src in group if not src.sealed and not src.takeover]
            if readable:
                busy |= self._read(group, readable)
            self._bound_memory()
        return busy

    def _sweep(self) -> bool:
        """Every SWEEP_INTERVAL_S: take over what a dead consumer of the group left pending, so it is
        archived and stops holding back the raw trim. True if anything changed.

        How (per stream, only one whose own pending entries were all read and whose segment is not
        sealed): when ONE other consumer's pending entries are ALL idle for CLAIM_IDLE_MS
        (`GroupReader.dead_consumer_entries`), (1) this consumer's open segment is cut now (written
        and acknowledged like any, a shorter segment) and nothing more is read on the stream; (2) at
        the next sweep, its own segment being empty, the sweep claims ALL those entries
        (`GroupReader.sweep(whole_consumer=True)`) and they are read again from id 0 as ONE segment
        whatever the cut settings, as a restart reads its own; then reading goes on.

        Why no entry is lost or archived twice. The dead consumer D kept the archive's rules: its
        pending entries on the stream are its last segment S (maybe written, not acknowledged: the
        object is written whole before the one-MULTI ack) and what it read after S, so the only
        object of D's that may exist unacknowledged is named after the OLDEST of them, n. The
        rewrite holds exactly D's entries (all of them: never a part, whatever was read recently or
        the count) and starts at n: the same name, so it replaces D's object, as a restart's
        rewrite does. Nothing of this consumer's own is in it (its segment was acknowledged before
        the claim), so no object of its own is left behind under another name, even when the
        broker fails in between (a reset re-reads either its own written segment alone, or D's
        entries alone). One consumer per stream at a time, each rewritten before the next is
        claimed (the stream is swept only once that segment is no longer sealed): two consumers'
        entries in one segment would leave the second one's object behind. Nothing is acknowledged
        before its object exists (no gap). Each segment holds one consumer's entries, so segments
        of a stream never overlap in id range (a reader of a time window relies on it:
        services/archive/reader.py select_segments). Two archives running at once: refused by the
        lease (services/archive/fence.py).

        Poison: the archive has no dead-letter stream, and no entry is poison for it (any entry is
        stored byte-exact; what the event lake cannot hold is counted, its raw source archived).
        The reader claims the entries delivered more than MAX_DELIVERIES times (only restarts and
        take-overs deliver an entry to the archive again) with the rest of their consumer's entries
        and names them; they are archived with one warning line: leaving them would leave a
        gap in the log of record and hold back the raw trim for good."""
        now = time.monotonic()
        if now - self._last_sweep < self.settings.sweep_interval_s:
            return False
        self._last_sweep = now
        ready: list[str] = []
        changed = False
        for src in self.all:
            if not self._new(src) or src.sealed:
                continue
            if not self.reader.dead_consumer_entries(src.stream):
                src.takeover = False  # none (any more): read on
            elif src.entries:
                src.sealed = len(src.entries)  # (1): own segment first, written in this step
                src.takeover = changed = True
            else:
                ready.append(src.stream)
        if not ready:
            return changed
        swept = self.reader.sweep(self.settings.batch_size, streams=ready, whole_consumer=True)
        taken = by_stream(swept.claimed)  # the poison among them too: the reader has no dead-letter stream
        for stream, ids in by_stream(swept.poison).items():
            log.warning("%d entries of %s were delivered more than %d times (to archives that died): archiving them",
                        len(ids), stream, self.settings.max_deliveries)
        for stream in ready:
            self.by_stream[stream].takeover = False
            if taken.get(stream):
                log.info("took over %d entries of %s left pending by a dead consumer", len(taken[stream]), stream)
                self.reader.reread_own(stream)  # (2): they alone, from id 0, as one segment
                changed = True
        return changed

    def _bound_memory(self) -> None:
        """Past ARCHIVE_BUFFER_MAX_BYTES held in open segments, cut the largest now: the archive's
        memory is bounded whatever the rate x cut interval (at a fleet's rate, 5 minutes of every
        shard would be gigabytes); such segments are smaller, never wrong."""
        held = sum(src.size for src in self.all)
        while held > self.settings.archive_buffer_max_bytes:
            open_ = [src for src in self.all if not src.sealed and src.size and self._new(src)]
            if not open_:
                return
            largest = max(open_, key=lambda src: src.size)
            if largest.dataset in sg.STREAM_KINDS:
                held -= largest.size
                self._encode(largest)  # a row group now: the segment stays open, its memory goes
            else:
                largest.sealed = len(largest.entries)
                held -= largest.size

    def _due(self, src: Source) -> bool:
        s = self.settings
        if not self._new(src):
            return False  # still reading our own pending entries: they all go into one segment
        return (len(src.entries) >= s.archive_segment_max_entries or src.total >= s.archive_segment_max_bytes
                or time.monotonic() - src.opened_at >= s.archive_segment_max_age_s)

    def _read(self, group: list[Source], streams: list[str]) -> bool:
        count = min(self.settings.batch_size, self.settings.archive_segment_max_entries)
        got = self.reader.read(streams, count)
        busy = False
        for src in group:
            if src.stream in got.caught_up:
                if src.entries:  # own pending entries all read: they are one segment, cut now
                    src.sealed = len(src.entries)
                continue
            if src.stream not in streams:
                continue
            pos = self.positions.get(src.stream)
            again: list[str] = []
            for entry in got.entries:
                if entry.stream != src.stream:
                    continue
                if not _after(entry.entry_id, pos):
                    again.append(entry.entry_id)  # in the store already: acknowledged, not written twice
                    continue
                if not src.entries:
                    src.opened_at = time.monotonic()
                src.entries.append((entry.entry_id, entry.fields))
                size = sum(map(len, entry.fields.values()))  # the values: names are a few bytes each
                src.size += size
                src.total += size
                busy = True
            if again:
                self.reader.ack({src.stream: again})
                self.metrics.already_archived.labels(src.dataset).inc(len(again))
                busy = True
            gone = sum(1 for entry in got.trimmed if entry.stream == src.stream)
            if gone:  # the reader acknowledged them: nothing left to archive
                log.warning("%d pending entries of %s were deleted before they were archived", gone, src.stream)
                self.metrics.lost.labels(src.dataset).inc(gone)
            if self._new(src) and len(src.entries) >= self.settings.archive_segment_max_entries:
                src.sealed = self.settings.archive_segment_max_entries
            elif not src.sealed and len(src.entries) - src.encoded >= ROW_GROUP_ENTRIES:
                self._encode(src)
        return busy

    def _encode(self, src: Source) -> None:
        """Raw and control: the entries read since the last row group become one (compressed, in
        memory), and their fields are dropped; the ids stay, for the acknowledgement."""
        if src.dataset not in sg.STREAM_KINDS or src.sealed or src.encoded >= len(src.entries):
            return
        if src.writer is None:
            src.writer = sg.RawSegmentWriter()
        chunk = src.entries[src.encoded:]
        src.writer.add([sg.ArchivedEntry(src.shard, src.dataset, entry_id, fields) for entry_id, fields in chunk])
        src.entries[src.encoded:] = [(entry_id, _ENCODED) for entry_id, _ in chunk]
        src.encoded = len(src.entries)
        src.size = 0

    def write(self, src: Source) -> None:
        """Write the sealed segment of `src` whole, then acknowledge it. StoreError leaves it sealed
        (retried), with nothing acknowledged."""
        entries = src.entries[: src.sealed]
        started = time.perf_counter()
        if src.objects is None:  # a retry puts the bytes of the first attempt
            if src.dataset in sg.STREAM_KINDS:
                writer = src.writer or sg.RawSegmentWriter()
                writer.add([sg.ArchivedEntry(src.shard, src.dataset, entry_id, fields)
                            for entry_id, fields in entries[src.encoded:]])
                src.objects = [(sg.raw_segment_key(src.dataset, src.shard, entries[0][0], entries[-1][0]), writer.finish())]
                src.writer = None
            else:
                lake = encode_lake(src, entries)
                src.objects = [(o.key, o.data) for o in lake.objects]
                src.rejected = len(lake.rejected)
        objects, rejected = src.objects, src.rejected
        for key, data in objects:
            if not self.store.create(key, data):  # never replaced: the same ids, i.e. the same entries
                log.info("%s exists already (the same entries, written before a restart): kept", key)
        last = sg.id_parts(entries[-1][0])
        if last > self.positions.get(src.stream, (0, 0)):
            self.positions[src.stream] = last
        self._save_positions()
        self.metrics.write_seconds.labels(src.dataset).observe(time.perf_counter() - started)
        if self._store_why:
            log.info("archive store writing again")
        self._store_why = None
        self._last_store_log = ""
        if self._hold_before_ack:
            log.info("segment of %s written (%d objects); holding %.1fs before acknowledging", src.stream,
                     len(objects), self._hold_before_ack)
            time.sleep(self._hold_before_ack)
        if self.lease is not None and self.lease.fenced.is_set():
            raise Fenced
        self.reader.ack({src.stream: [entry_id for entry_id, _ in entries]})  # one MULTI: see step 3
        if rejected:
            self.metrics.lake_rejected.inc(rejected)
        size = sum(len(data) for _, data in objects)
        self.metrics.entries.labels(src.dataset).inc(len(entries))
        self.metrics.bytes.labels(src.dataset).inc(size)
        self.metrics.segments.labels(src.dataset).inc()
        self.metrics.last_success.set(time.time())
        rest = src.entries[src.sealed:]  # never encoded: encoding happens only while not sealed
        src.entries = rest
        src.size = src.total = sum(sum(map(len, fields.values())) for _, fields in rest)
        src.opened_at = time.monotonic()
        src.sealed = src.encoded = src.rejected = 0
        src.objects = None
        log.debug("archived %d entries of %s as %d objects (%d bytes)", len(entries), src.stream, len(objects), size)

    def flush_on_stop(self) -> None:
        """On SIGTERM: write what has been read (shorter segments), once, if store and broker answer.
        Whatever fails stays pending and is rewritten by the next start."""
        for src in self.all:
            if not src.entries or (not self._new(src) and not src.sealed):
                continue
            src.sealed = src.sealed or len(src.entries)
            try:
                self.write(src)
            except (StoreError, Fenced, *BROKER_ERRORS, ResponseError) as exc:
                log.warning("stopping with %d entries of %s not archived (they stay pending): %s",
                            len(src.entries), src.stream, exc)
                return

    # ------------------------------------------------------------------ lag
    def _gauge_while_failing(self) -> None:
        """The lag keeps being measured while writes fail (that is when it matters); a failure of
        the measurement itself is the one being reported already."""
        try:
            self._gauge()
        except (StoreError, ResponseError, *BROKER_ERRORS):
            pass

    def _gauge(self, force: bool = False) -> None:
        """Every sweep interval: how far behind the archive is, per dataset; readiness says so when
        the oldest unarchived entry is older than 3 cut intervals plus a minute."""
        now = time.monotonic()
        if not force and now - self._last_gauge < self.settings.sweep_interval_s:
            return
        self._last_gauge = now
        wall_ms = time.time() * 1000
        oldest: dict[str, float] = {}
        behind: dict[str, int] = {}
        for src in self.all:
            backlog = self.reader.backlog(src.stream)  # unknown lag: counted (services/streams/lag.py)
            if backlog.missing:
                continue
            behind[src.dataset] = behind.get(src.dataset, 0) + backlog.pending + (backlog.lag or 0)
            first = self.reader.oldest_waiting(src.stream, backlog)
            if first is not None:
                age = max(0.0, (wall_ms - sg.id_parts(first)[0]) / 1000)
                oldest[src.dataset] = max(oldest.get(src.dataset, 0.0), age)
        for dataset in ("raw", "control", "events", "runs"):
            self.metrics.lag_seconds.labels(dataset).set(oldest.get(dataset, 0.0))
            self.metrics.lag_entries.labels(dataset).set(behind.get(dataset, 0))
        limit = 3 * self.settings.archive_segment_max_age_s + 60
        worst = max(oldest.values(), default=0.0)
        self._behind_why = (f"archive behind: the oldest entry not archived is {worst:.0f}s old (limit {limit:.0f}s)"
                            if worst > limit else None)
        if self._store_why:
            self.store.probe()  # StoreError: still failing (the loop reports it), after the lag was measured; else writable again, maybe
            if not any(src.sealed for src in self.all):  # a pending write will say so itself
                log.info("archive store answering again")
                self._store_why = None
                self._last_store_log = ""

