"""Periodic work of every worker: reclaim stuck entries, abandon idle runs, trim, gauge lag.

Every action is safe to run on all workers at once: reclaiming goes through the same atomic,
version-checked commit as normal processing, and an abandonment is a commit too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from redis.exceptions import RedisError, ResponseError

from contracts.events import EVENT_TYPES
from services.broker.groups import ensure_groups
from services.broker.keys import shard_of
from services.metrics import Metrics
from services.sequencer import Entry, RunSequencer, plan_abandon
from services.settings import Settings
from services.worker.batch import BatchProcessor, CommitConflict, active_key, state_key
from services.worker.reporting import record_result

log = logging.getLogger("goose_ingest.worker")

RETENTION_EVERY_S = 60.0


class Housekeeper:
    def __init__(
        self,
        settings: Settings,
        client: Any,
        processor: BatchProcessor,
        consumer: str,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.processor = processor
        self.consumer = consumer
        self.metrics = metrics
        self.subscribers_running = False
        self.last_ok = 0.0
        self._last_retention = 0.0
        self._idle_shards: set[int] = set()

    def is_ready(self) -> bool:
        fresh = time.monotonic() - self.last_ok < max(3 * self.settings.sweep_interval_s, 15.0)
        return self.subscribers_running and fresh

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
                self.metrics.set_ready(self.is_ready())
            await asyncio.sleep(self.settings.sweep_interval_s)

    async def tick(self) -> None:
        await self.client.ping()
        await self.gauge_backlog()
        for shard in range(self.settings.shards):
            await self.reclaim(shard)
        await self.abandon_idle_runs()
        if time.monotonic() - self._last_retention > RETENTION_EVERY_S:
            await self.trim()
            self._last_retention = time.monotonic()

    # ------------------------------------------------------------------ lag
    async def gauge_backlog(self) -> None:
        idle: set[int] = set()
        for shard, stream in enumerate(self.settings.raw_streams()):
            try:
                groups = await self.client.xinfo_groups(stream)
            except ResponseError:
                groups = []
            group = next((g for g in groups if g["name"].decode() == self.settings.group), None)
            if group is None:
                # The stream or group vanished (Redis restarted without persistence, or a flush).
                log.warning("consumer group missing on %s: recreating it at 0", stream)
                await ensure_groups(self.client, self.settings)
                continue
            lag = group.get("lag")
            pending = int(group.get("pending") or 0)
            if self.metrics is not None:
                self.metrics.set_backlog(shard, None if lag is None else int(lag), pending)
            if lag is not None and int(lag) == 0 and pending == 0:
                idle.add(shard)
        self._idle_shards = idle

    # -------------------------------------------------------------- reclaim
    async def reclaim(self, shard: int) -> int:
        """Take over entries another consumer read but never committed (e.g. it was killed)."""
        s = self.settings
        stream = s.raw_stream(shard)
        start = "0-0"
        total = 0
        while True:
            reply = await self.client.xautoclaim(
                stream, s.group, self.consumer, min_idle_time=s.claim_idle_ms, start_id=start, count=s.batch_size
            )
            start, entries = reply[0], reply[1]
            entries = [(i, f) for i, f in entries if f is not None]
            if entries:
                ids = [i for i, _ in entries]
                pending = await self.client.xpending_range(
                    stream, s.group, min=ids[0], max=ids[-1], count=len(ids) * 2, consumername=self.consumer
                )
                deliveries = {p["message_id"].decode(): int(p["times_delivered"]) for p in pending}
                started = time.perf_counter()
                result = await self.processor.process(stream, ids, [f for _, f in entries], deliveries=deliveries)

                record_result(self.metrics, result, time.perf_counter() - started, len(ids))
                total += len(ids)
            if start in (b"0-0", "0-0"):
                return total

    # -------------------------------------------------------------- abandon
    async def abandon_idle_runs(self, limit: int = 100) -> int:
        s = self.settings
        now_ms = await self._redis_ms()
        cutoff = now_ms - int(s.run_idle_timeout_s * 1000)
        runs = await self.client.zrangebyscore(active_key(s), "-inf", cutoff, start=0, num=limit)
        done = 0
        for run_b in runs:
            run = run_b.decode()
            shard = shard_of(run, s.shards)
            if shard not in self._idle_shards:
                continue  # entries may still be waiting in the stream: not idle yet
            try:
                if await self.abandon(run, now_ms):
                    done += 1
            except CommitConflict:
                continue
        return done

    async def abandon(self, run: str, now_ms: int) -> bool:
        """Write an abandon marker for `run` into the raw log and apply it, in one commit."""
        s = self.settings
        state = await self.client.hget(state_key(s, run), "s")
        if state is None:
            await self.client.zrem(active_key(s), run)
            return False
        seq = RunSequencer.from_state(orjson.loads(state), self.processor.limits, s.max_buffered_entries)
        if seq.ended:
            await self.client.zrem(active_key(s), run)
            return False
        through, missing = plan_abandon(seq)
        stream = s.raw_stream(shard_of(run, s.shards))
        marker = Entry(run, max(through, 0), now_ms, "abandon", "stdout", "", None, None, None, "0-0",
                       through, tuple(tuple(r) for r in missing))
        fields = (stream, b"run", run, b"seq", str(max(through, 0)), b"ts", str(now_ms), b"kind", b"abandon",
                  b"through", str(through), b"missing", orjson.dumps(missing))
        result = await self.processor.process(stream, [], [], extra_entries=[marker], extra_adds=[fields])

        record_result(self.metrics, result, 0.0, 0)
        log.info("abandoned idle run %s (through seq %d, %d missing ranges)", run, through, len(missing))
        return True

    async def _redis_ms(self) -> int:
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # ------------------------------------------------------------ retention
    async def trim(self) -> None:
        """Trim raw streams only below what the group has committed, and topics by age."""
        s = self.settings
        now_ms = await self._redis_ms()
        raw_cutoff = now_ms - int(s.raw_retention_hours * 3_600_000)
        for stream in s.raw_streams():
            try:
                groups = await self.client.xinfo_groups(stream)
            except ResponseError:
                continue
            group = next((g for g in groups if g["name"].decode() == s.group), None)
            if group is None:
                continue
            frontier = _id_ms(group["last-delivered-id"])
            summary = await self.client.xpending(stream, s.group)
            if summary and summary.get("pending"):
                frontier = min(frontier, _id_ms(summary["min"]))
            # Entries not yet delivered (lag) sit above last-delivered-id, so they are never below it.
            cutoff = min(raw_cutoff, frontier)
            if cutoff > 0:
                await self.client.xtrim(stream, minid=f"{cutoff}-0", approximate=True)
        topic_cutoff = now_ms - int(s.topic_retention_hours * 3_600_000)
        for stream in [s.all_events_topic(), s.runs_stream(), s.deadletters(), *(s.topic_for(t) for t in EVENT_TYPES)]:
            if topic_cutoff > 0:
                await self.client.xtrim(stream, minid=f"{topic_cutoff}-0", approximate=True)


def _id_ms(sid: bytes | str) -> int:
    text = sid.decode() if isinstance(sid, bytes) else sid
    return int(text.split("-", 1)[0])
