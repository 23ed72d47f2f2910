"""Shard leases: one worker reads a shard at a time.

Why: a consumer group hands each read to whichever consumer asks first. Without leases every
worker reads every shard, consecutive entries of one run reach different workers, and their
commits conflict. Each conflict recomputes and rewrites the batch's runs, so in bench/scale.py
two workers together ran at 0.37 of one. With leases a shard has one reader, and its runs' states
stay in that worker's cache. The commit's version check stays as the safety net.

The protocol keeps everything in Redis, and every step can be repeated safely:

- **Fair share.** A worker announces itself in the `workers` sorted set. The score says until when
  it counts as alive, and it is renewed with the leases. Each worker holds `ceil(shards / live
  workers)` shards. It takes free ones with `SET lease owner NX PX ttl`. It renews the ones it
  holds every ttl/3, with PEXPIRE, and only while it is still the owner. It gives back any shard
  above its share so that a newcomer gets work: it stops reading that shard, waits for the batch
  in flight, then deletes the lease if it is still the owner.
- **Reading.** A worker reads a shard only while the lease is certainly its own. On its own
  monotonic clock, that is until the last successful renewal (timed from before it was sent) plus
  the ttl, minus a margin.
- **Fencing.** `commit.lua` writes nothing unless the shard's lease still names the committing
  worker. A worker that stalled past its lease (a long pause, a partition) therefore cannot commit
  entries that the new owner processes too.
- **Takeover.** On taking a shard, the new owner claims the shard's pending entries at once,
  without the usual idle wait, because the previous owner can no longer commit them. So a killed
  worker's entries wait for its lease to expire (`LEASE_TTL_MS`), not for `CLAIM_IDLE_MS`.

The decisions (share, what to take, what to give back) are the pure `plan`. `ShardLeases` is the
shell that carries them out against Redis.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from redis.exceptions import RedisError

from services.metrics import Metrics
from services.settings import Settings

log = logging.getLogger("goose_ingest.worker")

# PEXPIRE / DEL the lease only if it still names the caller (a lease that expired and was taken
# by another worker must not be extended or deleted by the old owner).
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# A lease is used for reading until this share of its ttl has passed since the renewal that set it:
# the rest is the margin for the clocks of this process and Redis drifting apart, and for a read
# that is already in flight when the time is up.
READ_SHARE_OF_TTL = 0.8
# How long giving a shard back waits for the batch in flight before giving up for this round.
DRAIN_WAIT_S = 5.0


class LeasePlan(NamedTuple):
    share: int  # shards this worker should hold
    release: list[int]  # held shards above the share, given back
    wanted: int  # how many more to take (from the free ones, in any order)


def fair_share(shards: int, live_workers: int) -> int:
    return -(-shards // max(live_workers, 1))


def plan(shards: int, held: set[int], live_workers: int) -> LeasePlan:
    """What a worker holding `held` does when `live_workers` workers (itself included) share
    `shards` shards. It gives back its highest shards first, so that workers converge on
    disjoint sets without talking to each other."""
    share = fair_share(shards, live_workers)
    ordered = sorted(held)
    release = ordered[share:] if len(ordered) > share else []
    return LeasePlan(share, release, max(0, share - len(held)))


class ShardLeases:
    """The leases this worker holds, renewed in the background (`run`). The subscribers ask
    `may_read`; the handler marks each batch with `batch(shard)`. `on_acquire(shard)` runs
    after a shard is taken (the worker claims its pending entries)."""

    def __init__(self, settings: Settings, client: Any, owner: str,
                 on_acquire: Callable[[int], Awaitable[Any]] | None = None, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.client = client
        self.owner = owner
        self.ttl_ms = settings.lease_ttl_ms
        self.on_acquire = on_acquire
        self.metrics = metrics
        self._valid_until: dict[int, float] = {}  # shard -> monotonic time until which it may be read
        self._draining: set[int] = set()
        self._busy: dict[int, int] = {}  # shard -> batches in flight
        self._renew = client.register_script(RENEW_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self.live_workers = 1
        self._takeovers: set[asyncio.Future[Any]] = set()  # on_acquire calls still running

    # ------------------------------------------------------------------ what the subscribers ask
    @property
    def held(self) -> set[int]:
        return set(self._valid_until)

    def may_read(self, shard: int) -> bool:
        return shard not in self._draining and self._valid_until.get(shard, 0.0) > time.monotonic()

    @contextmanager
    def batch(self, shard: int) -> Iterator[None]:
        self._busy[shard] = self._busy.get(shard, 0) + 1
        try:
            yield
        finally:
            self._busy[shard] -= 1

    # ------------------------------------------------------------------ the background loop
    async def run(self) -> None:
        interval = self.ttl_ms / 3000
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except RedisError as exc:  # the leases run out on their own; the next tick tries again
                log.warning("shard leases: broker unavailable: %s", type(exc).__name__)
            except Exception:  # a bug here must not stop the worker's main job
                log.exception("shard leases failed")
            self._report()
            await asyncio.sleep(interval)

    def _report(self) -> None:
        if self.metrics is not None:
            self.metrics.set_leases(sum(1 for shard in self._valid_until if self.may_read(shard)))

    async def tick(self) -> None:
        started = time.monotonic()  # a renewal counts from before it was sent
        read_until = started + self.ttl_ms / 1000 * READ_SHARE_OF_TTL
        self.live_workers = await self._announce()
        for shard in sorted(self._valid_until):
            if shard in self._draining:
                continue
            if await self._renew(keys=[self.layout.shard_lease(shard)], args=[self.owner, self.ttl_ms]):
                self._valid_until[shard] = read_until
            else:
                log.warning("lost the lease of shard %d (it expired or another worker took it)", shard)
                self._valid_until.pop(shard, None)
        todo = plan(self.settings.shards, self.held, self.live_workers)
        for shard in todo.release:
            await self.give_back(shard)
        if todo.wanted:
            free = [s for s in range(self.settings.shards) if s not in self._valid_until]
            random.shuffle(free)  # workers starting together do not all race for shard 0 first
            taken = 0
            for shard in free:
                if taken == todo.wanted:
                    break
                if await self.client.set(self.layout.shard_lease(shard), self.owner, nx=True, px=self.ttl_ms):
                    self._valid_until[shard] = read_until
                    taken += 1
                    log.info("took the lease of shard %d (%d workers alive)", shard, self.live_workers)
                    if self.on_acquire is not None:
                        # Not awaited here: a takeover may process many entries, and the leases
                        # held meanwhile must still be renewed.
                        self._takeovers.add(asyncio.ensure_future(self.on_acquire(shard)))
                        self._takeovers = {t for t in self._takeovers if not t.done()}

    async def _announce(self) -> int:
        """Say this worker is alive (until now + ttl, on Redis's clock) and count the live ones."""
        seconds, micros = await self.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        key = self.layout.workers()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(key, {self.owner: now_ms + self.ttl_ms})
        pipe.zremrangebyscore(key, "-inf", now_ms)
        pipe.zcard(key)
        return max(1, int((await pipe.execute())[-1]))

    async def give_back(self, shard: int) -> None:
        """Stop reading `shard`, wait for its batch in flight, then delete the lease if it is ours."""
        self._draining.add(shard)
        try:
            deadline = time.monotonic() + DRAIN_WAIT_S
            while self._busy.get(shard, 0) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if self._busy.get(shard, 0):
                return  # still busy: keep it (and renew it) until the next round
            self._valid_until.pop(shard, None)
            await self._release(keys=[self.layout.shard_lease(shard)], args=[self.owner])
            log.info("gave back the lease of shard %d (%d workers alive)", shard, self.live_workers)
        finally:
            self._draining.discard(shard)

    async def release_all(self) -> None:
        """At shutdown: give every shard back at once, so the other workers need not wait for the ttl."""
        for shard in sorted(self._valid_until):
            self._draining.add(shard)
        try:
            for shard in sorted(self._valid_until):
                deadline = time.monotonic() + DRAIN_WAIT_S
                while self._busy.get(shard, 0) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await self._release(keys=[self.layout.shard_lease(shard)], args=[self.owner])
            await self.client.zrem(self.layout.workers(), self.owner)
        finally:
            self._valid_until.clear()
            self._draining.clear()


def gate_reads(sub: Any, may_read: Callable[[], bool], idle_s: float) -> None:
    """Wrap a FastStream stream subscriber's XREADGROUP so it reads only while `may_read()`;
    otherwise it waits as long as an idle read would and returns nothing (like
    services/broker/groups.guard_missing_group, the wrapped method is FastStream's read call)."""
    read: Callable[..., Awaitable[Any]] = sub._xreadgroup

    async def gated(**kwargs: Any) -> Any:
        if not may_read():
            await asyncio.sleep(idle_s)
            return ()
        return await read(**kwargs)

    sub._xreadgroup = gated
