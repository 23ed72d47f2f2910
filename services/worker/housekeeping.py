"""Periodic work of every worker: reclaim stuck entries, abandon idle runs, trim, gauge lag.

Every action is safe to run on all workers at once: reclaiming goes through the same atomic,
version-checked commit as normal processing, and an abandonment is a commit too. With shard
leases (services/worker/leases.py) a worker reclaims and abandons only in the shards it holds
(`owns`), and takes over a shard's pending entries as soon as it gets its lease (`take_over`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError

from contracts.events import EVENT_TYPES
from contracts.raw import stream_id_ms
from contracts.stream_ids import StreamId
from services.backoff import Backoff
from services.broker.errors import describe, is_outage
from services.metrics import Metrics
from services.sequencer import Entry, missing_ranges, plan_abandon
from services.settings import Settings
from services.streams.groups import ensure_groups
from services.streams.lag import read_backlog
from services.streams.pending import drive_async, pending_page, reclaim
from services.streams.readiness import READY, Readiness, fresh, not_ready
from services.worker.commit import CommitFailed, LeaseLost
from services.worker.damage import DELETED_UNEXPIRED, ID_AHEAD, REASONS, Seen, shard_damage
from services.worker.processor import BatchProcessor, CommitConflict
from services.worker.reporting import record_result

log = logging.getLogger("goose_ingest.worker")
# A shard's damage stays in the metric this long after a sweep last saw it: a deletion is seen by one
# sweep only (the next one compares with what it saw), and the alert must not miss it between scrapes.
DAMAGE_HOLD_S = 15 * 60.0

RETENTION_EVERY_S = 60.0
# A takeover waiting out a broker outage (a failover takes ~2-5 s here: node timeout + election):
# the first retry soon, then at most this far apart.
OUTAGE_RETRY_S = 0.1
OUTAGE_RETRY_MAX_S = 2.0
T = TypeVar("T")


class Housekeeper:
    def __init__(
        self,
        settings: Settings,
        client: Any,
        processor: BatchProcessor,
        consumer: str,
        metrics: Metrics | None = None,
        subscribers: Callable[[], Readiness] | None = None,
        owns: Callable[[int], bool] | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.processor = processor
        self.consumer = consumer
        self.metrics = metrics
        self.subscribers = subscribers or (lambda: READY)
        self.owns = owns or (lambda shard: True)  # the shards whose pending entries and idle runs are ours
        self.last_ok = 0.0
        self._last_retention = 0.0
        self._idle_shards: set[int] = set()
        self._damage: dict[tuple[int, str], float] = {}  # (shard, reason) -> when this worker last saw it
        self._seen: dict[int, Seen] = {}
        self._current: set[tuple[int, str]] = set()  # each raw stream as the previous sweep saw it (damage.py)

    def readiness(self) -> Readiness:
        health = self.subscribers()
        if not health.ok:
            return health
        if not fresh(self.last_ok, time.monotonic(), self.settings.sweep_interval_s):
            return not_ready("housekeeping has not reached the broker recently")
        blocked = sorted(shard for shard, reason in self._current if reason == ID_AHEAD)
        if blocked:  # the shard refuses every XADD *: ingest into it is down (services/worker/damage.py)
            return not_ready(f"raw shard {blocked[0]}: its last id is far ahead of the clock (an XADD at an "
                             "explicit id): it refuses new entries until recreated (GooseIngestRawShardDamaged)")
        return READY

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
                self.last_ok = time.monotonic()
            except asyncio.CancelledError:
                raise
            except RedisError as exc:
                log.warning("housekeeping: broker unavailable: %s", type(exc).__name__)
            except Exception:  # a bug here must not stop the worker's main job
                log.exception("housekeeping failed")
            if self.metrics is not None:
                self.metrics.set_ready(self.readiness().ok)
            await asyncio.sleep(self.settings.sweep_interval_s)

    async def tick(self) -> None:
        await self.client.ping()
        await self.gauge_backlog()
        for shard in range(self.settings.shards):
            if self.owns(shard):
                await self.reclaim(shard)
        await self.abandon_idle_runs()
        if time.monotonic() - self._last_retention > RETENTION_EVERY_S:
            await self.trim()
            self._last_retention = time.monotonic()

    # ------------------------------------------------------------------ lag
    async def gauge_backlog(self) -> None:
        idle: set[int] = set()
        for shard, stream in enumerate(self.settings.layout.raw_streams()):
            backlog = await read_backlog(self.client, stream, self.settings.group)  # lag always known
            if backlog.missing:
                # The stream or group vanished (Redis restarted without persistence, or a flush).
                log.warning("consumer group missing on %s: recreating it at 0", stream)
                await ensure_groups(self.client, self.settings)
                continue
            lag, pending = backlog.lag, backlog.pending
            if self.metrics is not None:
                oldest_age_s = await self._oldest_pending_age_s(stream) if pending else 0.0
                self.metrics.set_backlog(shard, lag, pending, oldest_age_s)
            if lag == 0 and pending == 0:
                idle.add(shard)
        self._idle_shards = idle
        await self.check_damage()
        if self.metrics is not None:  # `goose-ingest runs` lists them (services/runs/command.py)
            self.metrics.set_active_runs(sum([int(await self.client.zcard(k)) for k in self.settings.layout.active_run_sets()]))

    async def check_damage(self) -> None:
        """Shards damaged by something other than a worker (services/worker/damage.py): one log line when
        first seen, the metric held for DAMAGE_HOLD_S after (a deletion is seen by one sweep only), and
        a readiness reason while a shard's id is ahead of the clock."""
        s = self.settings
        found = await shard_damage(self.client, s.layout.raw_streams(), await self._redis_ms(),
                                   int(s.raw_retention_hours * 3_600_000), self._seen)
        now = time.monotonic()
        self._current = {(shard, reason) for shard, reasons in found.items() for reason in reasons}
        for shard, reason in sorted(self._current):
            if now - self._damage.get((shard, reason), float("-inf")) > DAMAGE_HOLD_S:
                log.error("raw shard %d: %s -- not done by a worker: a credential that may XADD (the gateway's, "
                          "a tap's) sent MAXLEN/MINID/XTRIM/XDEL or an explicit id (docs/operations.md, "
                          "GooseIngestRawShardDamaged)", shard,
                          "entries younger than RAW_RETENTION_HOURS were deleted" if reason == DELETED_UNEXPIRED
                          else "its last id is far ahead of the clock")
            self._damage[(shard, reason)] = now
        self._damage = {k: at for k, at in self._damage.items() if now - at <= DAMAGE_HOLD_S}
        if self.metrics is not None:
            held: dict[int, list[str]] = {}
            for shard, reason in self._damage:
                held.setdefault(shard, []).append(reason)
            self.metrics.set_shard_damage(held, REASONS)

    async def _oldest_pending_age_s(self, stream: str) -> float:
        """Seconds since the shard's oldest unacknowledged entry was published (alert: stuck entries)."""
        summary = await self.client.xpending(stream, self.settings.group)
        oldest = summary.get("min") if isinstance(summary, dict) else None
        if not oldest:
            return 0.0
        return max(0.0, time.time() - stream_id_ms(oldest) / 1000)

    # -------------------------------------------------------------- reclaim
    async def take_over(self, shard: int) -> None:
        """Just got the shard's lease: its pending entries are ours now, however recently another
        worker read them (that worker can no longer commit them: the commit checks the lease).

        A broker outage at that moment (a failover: the cluster client re-reads the slot map, and
        the first commands after a primary died fail) is waited out here, while the shard is ours,
        for up to CLAIM_IDLE_MS: given up at once, the entries the previous owner held waited for the
        periodic reclaim, CLAIM_IDLE_MS after they were read (issue 20 finding 11, the handover
        case of tests/broker/test_cluster_failover_stall.py)."""
        try:
            n = await self.reclaim(shard, min_idle_ms=0, outage_patience_s=self.settings.claim_idle_ms / 1000)
        except LeaseLost:
            return
        except RedisError as exc:  # the periodic reclaim takes them later
            log.warning("taking over shard %d failed (%s): its pending entries are left to the periodic reclaim",
                        shard, describe(exc))
            return
        if n:
            log.info("took over %d pending entries of shard %d", n, shard)

    async def _through_outage(self, shard: int, call: Callable[[], Awaitable[T]], patience_s: float) -> T:
        """`call()`, again while the broker is unavailable (`is_outage`) for at most `patience_s`
        and while the shard is still ours; then the error. Only for commands that claim or read
        (XPENDING, XRANGE, XCLAIM): a refused one took nothing."""
        deadline = time.monotonic() + patience_s
        backoff = Backoff(OUTAGE_RETRY_S, OUTAGE_RETRY_MAX_S)
        while True:
            try:
                return await call()
            except RedisError as exc:
                if not is_outage(exc) or time.monotonic() + backoff.delay > deadline or not self.owns(shard):
                    raise
                if backoff.first:  # one line per takeover, not one per attempt
                    log.info("taking over shard %d: broker unavailable (%s); trying again for up to %.0f s",
                             shard, describe(exc), patience_s)
            await asyncio.sleep(backoff.next())

    async def reclaim(self, shard: int, min_idle_ms: int | None = None, outage_patience_s: float = 0.0) -> int:
        """Take over entries another consumer read but never committed (e.g. it was killed), page by
        page, through the one reclaim (services/streams/pending.py). Poison is not dead-lettered
        here: it goes into the batch's commit with the rest (`deliveries`, commit.lua), so its dead
        letter, the outputs and the acknowledgement stay one step.
        `outage_patience_s`: how long a broker outage is waited out (`_through_outage`) before it is raised."""
        s = self.settings
        stream = s.layout.raw_stream(shard)
        idle = s.claim_idle_ms if min_idle_ms is None else min_idle_ms

        def around(call: Callable[[], Awaitable[T]]) -> Awaitable[T]:
            return self._through_outage(shard, call, outage_patience_s)

        after: str | None = None
        total = 0
        while True:
            rows = await drive_async(self.client, pending_page(stream, s.group, s.batch_size, idle_ms=idle, after=after),
                                     around)
            if not rows:
                return total
            after = rows[-1].entry_id
            # max_deliveries: the same rule as every consumer's (pending.plan_reclaim)
            found = await drive_async(self.client, reclaim(stream, s.group, self.consumer, rows, idle_ms=idle,
                                                           max_deliveries=s.max_deliveries), around)
            entries = sorted([*found.claimed, *(p.entry for p in found.poison)], key=lambda e: StreamId.parse(e.entry_id))
            if entries:
                ids = [e.entry_id for e in entries]
                deliveries = {p.entry.entry_id: p.row.deliveries for p in found.poison}
                started = time.perf_counter()
                result = await self.processor.process(shard, ids, [e.fields for e in entries], deliveries=deliveries)
                record_result(self.metrics, result, time.perf_counter() - started, len(ids))
                total += len(ids)
            if len(rows) < s.batch_size:
                return total

    # -------------------------------------------------------------- abandon
    async def abandon_idle_runs(self, limit: int = 100) -> int:
        s = self.settings
        layout = s.layout
        now_ms = await self._redis_ms()
        cutoff = now_ms - int(s.run_idle_timeout_s * 1000)
        done = 0
        for active in layout.active_run_sets():  # one per shard in cluster mode, one on a single node
            runs = await self.client.zrangebyscore(active, "-inf", cutoff, start=0, num=limit)
            for run_b in runs:
                run = run_b.decode()
                shard = layout.shard_of(run)
                if shard not in self._idle_shards or not self.owns(shard):
                    continue  # entries may still be waiting in the stream: not idle yet; or not ours
                try:
                    if await self.abandon(run, now_ms):
                        done += 1
                except (CommitConflict, CommitFailed, LeaseLost) as exc:
                    log.warning("abandoning run %s failed (%s); trying again next sweep", run, type(exc).__name__)
        return done

    async def abandon(self, run: str, now_ms: int) -> bool:
        """Write an abandon marker for `run` on its shard's control stream and apply it, in one commit."""
        layout = self.settings.layout
        active = layout.active_runs(layout.shard_of(run))
        loaded = (await self.processor.load([run]))[run]
        if isinstance(loaded, Exception):
            log.warning("cannot abandon run %s: its state is unusable (%s)", run, type(loaded).__name__)
            await self.client.zrem(active, run)  # its entries are dead-lettered as they come
            return False
        version, sequencer = loaded
        if version == "0" or sequencer.ended:  # no state (expired, flushed) or already ended
            await self.client.zrem(active, run)
            return False
        through, missing = plan_abandon(sequencer)
        marker = Entry.of_abandon(run, max(through, 0), now_ms, through, missing_ranges(missing), sid="0-0")
        result = await self.processor.abandon(run, marker)

        record_result(self.metrics, result, 0.0, 0)
        log.info("abandoned idle run %s (through seq %d, %d missing ranges)", run, through, len(missing))
        return True

    async def _redis_ms(self) -> int:
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # ------------------------------------------------------------ retention
    async def trim(self) -> None:
        """Trim raw streams only below what the group has committed, and topics by age but not below
        what a registered consumer group has read (up to TOPIC_MAX_UNREAD_HOURS)."""
        s = self.settings
        now_ms = await self._redis_ms()
        raw_cutoff = now_ms - int(s.raw_retention_hours * 3_600_000)
        layout = s.layout
        for shard, stream in enumerate(layout.raw_streams()):
            frontier = await self._committed_ms(stream, s.group)
            if frontier is None:
                continue
            # Entries not yet delivered (lag) sit above last-delivered-id, so they are never below it.
            cutoff = min(raw_cutoff, frontier)
            if s.archive_url:
                # The archive is the log of record beyond Redis (docs/archive.md): nothing it has not
                # written may go, on the raw stream or on the control stream. Its group missing (not
                # started yet, or Redis lost it): keep everything until it is back.
                archived = [await self._committed_ms(k, s.archive_group, now_ms)
                            for k in (stream, layout.control_stream(shard))]
                cutoff = min(cutoff, *(-1 if a is None else a for a in archived))
            if cutoff > 0:
                await self.client.xtrim(stream, minid=f"{cutoff}-0", approximate=True)
                # The shard's control entries (abandon markers) are part of the same log: same cutoff,
                # so replay never meets a run's raw entries without the marker that ended it.
                await self.client.xtrim(layout.control_stream(shard), minid=f"{cutoff}-0", approximate=True)
        topics = [*layout.events_partitions(), *layout.runs_partitions(),
                  *(p for t in EVENT_TYPES for p in layout.type_partitions(t))]
        for stream in topics:
            await self.trim_topic(stream, now_ms)
        # The workers' dead letters: the one retention rule of every consumer's dead letters (by age,
        # DEADLETTER_RETENTION_HOURS; services/streams/deadletter.py), here because commit.lua writes them.
        dead_cut = now_ms - int(s.deadletter_keep_hours * 3_600_000)
        if dead_cut > 0:
            for stream in layout.deadletter_partitions():
                await self.client.xtrim(stream, minid=f"{dead_cut}-0", approximate=True)

    async def _committed_ms(self, stream: str, group: str, now_ms: int | None = None) -> int | None:
        """The ms below which `group` has committed everything on `stream` (its oldest pending
        entry, else its last-delivered id). With `now_ms` (Redis time, taken before): that, when the
        group has read and acknowledged everything, so an idle stream (the archive's position on a
        control stream without news for hours) does not hold back the trim of its raw shard.
        None when the stream or the group does not exist."""
        try:
            groups = await self.client.xinfo_groups(stream)
        except ResponseError:
            return None
        info = next((g for g in groups if _text(g["name"]) == group), None)
        if info is None:
            return None
        if now_ms is not None and info.get("lag") == 0 and not int(info.get("pending") or 0):
            return now_ms  # entries added since have ids of at least now_ms: minid now_ms keeps them
        frontier = stream_id_ms(info["last-delivered-id"])
        if int(info.get("pending") or 0):
            summary = await self.client.xpending(stream, group)
            if summary and summary.get("pending"):
                frontier = min(frontier, stream_id_ms(summary["min"]))
        return frontier

    async def trim_topic(self, stream: str, now_ms: int) -> dict[str, int]:
        """Trim a topic stream by age, but never below what a registered consumer group has not read,
        unless it is older than TOPIC_MAX_UNREAD_HOURS; returns what was trimmed unread, per group.

        Registered = a consumer group on the stream (XINFO GROUPS): the exporters create theirs at
        start, an operator creates or destroys one with XGROUP (docs/operations.md). A group has read
        everything below its oldest pending entry, or, with nothing pending, up to its last-delivered
        id. Entries past the cap that some group has not read are trimmed exactly, in steps between
        the groups' positions, so each step's count is charged to exactly the groups that had not
        read it (`goose_ingest_topic_trimmed_unread_total{group}`)."""
        s = self.settings
        age_cut = (now_ms - int(s.topic_retention_hours * 3_600_000), 0)
        cap_cut = (now_ms - int(s.topic_max_unread_hours * 3_600_000), 0)
        if age_cut[0] <= 0:
            return {}
        try:
            groups = await self.client.xinfo_groups(stream)
        except ResponseError:  # no such stream (nothing published to this partition yet)
            return {}
        read_to: dict[str, tuple[int, int]] = {}  # group -> first id it has not read
        for g in groups:
            name = _text(g["name"])
            frontier = _next_id(_parse_id(g["last-delivered-id"]))
            if int(g.get("pending") or 0):
                summary = await self.client.xpending(stream, name)
                if summary and summary.get("pending"):
                    frontier = min(frontier, _parse_id(summary["min"]))
            read_to[name] = frontier
            if self.metrics is not None:
                self.metrics.seen_topic_group(name)
        if not read_to:
            await self.client.xtrim(stream, minid=_id_text(age_cut), approximate=True)
            return {}
        unread_from = min(read_to.values())
        if age_cut <= unread_from or cap_cut <= unread_from:
            # everything old enough is read by every group (or not past the cap yet): trim that only
            await self.client.xtrim(stream, minid=_id_text(min(age_cut, unread_from)), approximate=True)
            return {}
        # Past the cap some group has not read: exact trims, step by step up to the cut, so that
        # what each step deletes is charged to the groups that had not read it.
        cut = min(age_cut, cap_cut)
        await self.client.xtrim(stream, minid=_id_text(unread_from), approximate=False)
        steps = sorted({f for f in read_to.values() if f < cut} | {cut})
        dropped: dict[str, int] = {}
        for low, high in zip(steps, steps[1:], strict=False):
            n = int(await self.client.xtrim(stream, minid=_id_text(high), approximate=False) or 0)
            if n:
                for name, frontier in read_to.items():
                    if frontier <= low:
                        dropped[name] = dropped.get(name, 0) + n
        for name, n in dropped.items():
            log.warning("trimmed %d entries of %s that group %s had not read (older than TOPIC_MAX_UNREAD_HOURS=%g)",
                        n, stream, name, s.topic_max_unread_hours)
            if self.metrics is not None:
                self.metrics.trimmed_unread(name, n)
        return dropped


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_id(value: Any) -> tuple[int, int]:
    return StreamId.parse(value)


def _next_id(sid: tuple[int, int]) -> tuple[int, int]:
    return sid[0], sid[1] + 1


def _id_text(sid: tuple[int, int]) -> str:
    return f"{sid[0]}-{sid[1]}"
