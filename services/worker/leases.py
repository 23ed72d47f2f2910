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
- **Computation never costs a lease.** A batch's computation (normalizing, redacting) runs on the
  event loop that also runs `run`, and may outlast the ttl (20 lines of ~475 KB cost ~18 s of
  redaction, a minute on a loaded machine). Renewal is therefore cooperative: the computation
  calls `renew_if_due` between its steps (each run, and each ~128 K characters of a run's lines:
  `BatchProcessor.pulse`), and when the loop's last round is more than ttl/3 old that call renews
  every held lease and the announcement at once, synchronously, on a connection of its own (one
  round trip; the loop is blocked by the computation anyway). A step is bounded (one line at most
  MAX_LINE_BYTES), so a renewal is never further apart than the slowest step, far below the ttl.
  A thread (`KeepAlive`) was the first design and stays as a second line (for a loop held by
  something that is not a batch): it cannot be the first one, because a thread only runs when
  the GIL is handed to it, and the compiled core and C regex calls hand it over only when they
  happen to run interpreted code, about once per line here; a renewal round needs the GIL several
  times (wake up, send, read), so under CPU load it went 55 s without one (issue 20 finding 2).
  Cooperative renewal also means a worker whose computation hangs stops renewing: its shards
  move on instead of being held forever.
- **Re-taking a lease nobody took.** If a lease still expires under a batch (a broker outage
  during the renewals, a process paused for longer than the ttl), `commit.lua` takes it back
  when nobody else holds it and every entry the batch acknowledges is still pending to this
  worker: then no other worker can have processed them, and the batch commits instead of being
  redone by the reclaim (each redo one more delivery, a slow batch would reach MAX_DELIVERIES).
  The next round finds the lease in this worker's name again and keeps it (`TAKE_LUA`).

The decisions (share, what to take, what to give back) are the pure `plan`. `ShardLeases` is the
shell that carries them out against Redis.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from redis.exceptions import RedisError

from services.broker.connect import sync_client_with_timeouts
from services.broker.errors import describe, is_outage
from services.metrics import Metrics
from services.settings import Settings

log = logging.getLogger("goose_ingest.worker")

# PEXPIRE the lease only if it still names the caller (a lease that expired and was taken by
# another worker must not be extended by the old owner; the same for giving it back, below).
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# A lease given back names its former owner for one more ttl: `released:<owner>`. Any worker may
# take it (it is free), but the former owner's own late commit may not take it back (commit.lua
# takes back only a lease that expired, i.e. no key at all): a read that was already in flight when
# the shard was given back must not pull the shard back to the worker that gave it away.
RELEASED_PREFIX = "released:"
# Take a free lease (none, or given back), or keep one that already names the caller (taken back by
# its own commit: commit.lua), as one step.
TAKE_LUA = f"""
local holder = redis.call('GET', KEYS[1])
if not holder or string.sub(holder, 1, {len(RELEASED_PREFIX)}) == '{RELEASED_PREFIX}' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]); return 1 end
return 0
"""
RELEASE_LUA = f"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], '{RELEASED_PREFIX}' .. ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# A lease is used for reading until this share of its ttl has passed since the renewal that set it:
# the rest is the margin for the clocks of this process and Redis drifting apart, and for a read
# that is already in flight when the time is up.
READ_SHARE_OF_TTL = 0.8
# How long giving a shard back waits for the batch in flight before giving up for this round.
DRAIN_WAIT_S = 5.0
# A renewal between two steps of a batch (`renew_if_due`) is due once the last round started this
# share of the ttl ago: the loop's own interval, so it happens exactly when the loop would have.
DUE_SHARE_OF_TTL = 1 / 3
# After a renewal between steps failed (the broker is down), the steps do not try again for this
# share of the ttl: each try may block the loop for a connect timeout.
RETRY_SHARE_OF_TTL = 0.1
# The keep-alive thread's announcement: `_announce` in one script, on Redis's clock (one round trip).
ANNOUNCE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


class LeasePlan(NamedTuple):
    share: int  # shards this worker should hold
    release: list[int]  # held shards above the share, given back
    wanted: int  # how many more to take (from the free ones, in any order)


def renewal_client(settings: Settings) -> Any:
    """A synchronous client for renewals outside the loop's own rounds, with timeouts (a hung broker
    must block the loop or the thread for a moment, not for good): a tenth of the ttl, at least 1 s."""
    timeout = max(1.0, settings.lease_ttl_ms / 10_000)
    return sync_client_with_timeouts(settings, socket_timeout=timeout, connect_timeout=timeout)


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
        self._take = client.register_script(TAKE_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self.live_workers = 1
        self._takeovers: set[asyncio.Future[Any]] = set()  # on_acquire calls still running
        # The keep-alive thread updates `_valid_until` too: it changes only shards still held, and
        # the loop removes shards under the same lock (so a given-back shard is never revived).
        self._lock = threading.Lock()
        self.renewed_at = 0.0  # monotonic start of the last successful renewal round (loop or thread)
        self._keepalive: KeepAlive | None = None
        self.thread_renewals = 0  # rounds the keep-alive thread did because the loop was late
        # Renewals between the steps of a batch (`renew_if_due`), on the loop's thread.
        self.step_renewals = 0
        self.renewal_client_factory: Callable[[], Any] = lambda: renewal_client(settings)
        self._step_client: Any = None
        self._step_retry_at = 0.0
        self._step_busy = False  # this stall of the loop was logged

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
    def start_keepalive(self) -> None:
        """Start the keep-alive thread (once). The worker starts it right after its first `tick`, before
        its subscribers read: the first batch can hold the loop before the `run` task ever gets a turn,
        and leases taken at start-up would then expire under it."""
        if self._keepalive is None:
            self._keepalive = KeepAlive(self)
            self._keepalive.start()

    def stop_keepalive(self) -> None:
        """Stop renewing outside the loop's rounds: the keep-alive thread, and the steps' connection."""
        if self._keepalive is not None:
            self._keepalive.stop()
            self._keepalive = None
        client, self._step_client = self._step_client, None
        if client is not None:
            _close_quietly(client)

    def renew_if_due(self) -> None:
        """Between two steps of a batch's computation (`BatchProcessor.pulse`, on the loop's thread):
        when the last renewal round started more than ttl/3 ago, renew every held lease and the
        announcement now, synchronously. Costs a clock read when not due."""
        now = time.monotonic()
        if now - self.renewed_at < self.ttl_ms * DUE_SHARE_OF_TTL / 1000 or now < self._step_retry_at:
            return
        if not self._valid_until:
            return
        try:
            if self._step_client is None:
                self._step_client = self.renewal_client_factory()
            renewed = self.renew_blocking(self._step_client)
        except Exception as exc:  # RedisError, a cluster not discoverable now: the commit may still take it back
            self._step_retry_at = now + self.ttl_ms * RETRY_SHARE_OF_TTL / 1000
            log.warning("shard leases: renewal during a long batch failed: %s", describe(exc))
            return
        self.step_renewals += 1
        if not self._step_busy:
            self._step_busy = True
            log.info("a long batch holds the event loop: %d shard leases renewed between its steps", renewed)

    async def run(self) -> None:
        interval = self.ttl_ms / 3000
        self.start_keepalive()
        try:
            while True:
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if isinstance(exc, RedisError) or is_outage(exc):  # the next tick tries again
                        log.warning("shard leases: broker unavailable: %s", type(exc).__name__)
                    else:  # a bug here must not stop the worker's main job
                        log.exception("shard leases failed")
                self._report()
                await asyncio.sleep(interval)
        finally:
            self.stop_keepalive()

    def _report(self) -> None:
        if self.metrics is not None:
            self.metrics.set_leases(sum(1 for shard in self._valid_until if self.may_read(shard)))

    async def tick(self) -> None:
        """One round: announce, renew the held leases, give back above the share, take free ones.

        A broker error on one step does not end the round (it is raised at its end, for `run` to
        log): in a cluster failover the keys of the failed primary's slots fail for seconds while
        the others answer, and a shard given back by another worker just before must still be
        taken, and its entries taken over, at once (issue 20 finding 11)."""
        started = time.monotonic()  # a renewal counts from before it was sent
        read_until = started + self.ttl_ms / 1000 * READ_SHARE_OF_TTL
        failure: BaseException | None = None
        try:
            self.live_workers = await self._announce()
        except Exception as exc:
            if not is_outage(exc):
                raise
            failure = exc  # the count of the last round stands
        for shard in sorted(self._valid_until):
            if shard in self._draining:
                continue
            try:
                renewed = await self._renew(keys=[self.layout.shard_lease(shard)], args=[self.owner, self.ttl_ms])
            except Exception as exc:
                if not is_outage(exc):
                    raise
                failure = failure or exc  # not known: read on until its read window closes
                continue
            if renewed:
                self._valid_until[shard] = max(self._valid_until.get(shard, 0.0), read_until)
            else:
                log.warning("lost the lease of shard %d (it expired or another worker took it)", shard)
                with self._lock:
                    self._valid_until.pop(shard, None)
        if failure is None:  # a partial round leaves the next renewal due (steps, keep-alive thread)
            self.renewed_at = max(self.renewed_at, started)
            self._step_busy = False
        todo = plan(self.settings.shards, self.held, self.live_workers)
        for shard in todo.release:
            try:
                await self.give_back(shard)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                failure = failure or exc
        if todo.wanted:
            free = [s for s in range(self.settings.shards) if s not in self._valid_until]
            random.shuffle(free)  # workers starting together do not all race for shard 0 first
            taken = 0
            for shard in free:
                if taken == todo.wanted:
                    break
                try:
                    took = await self._take(keys=[self.layout.shard_lease(shard)], args=[self.owner, self.ttl_ms])
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                    failure = failure or exc
                    continue
                if took:
                    with self._lock:
                        self._valid_until[shard] = read_until
                    taken += 1
                    log.info("took the lease of shard %d (%d workers alive)", shard, self.live_workers)
                    if self.on_acquire is not None:
                        # Not awaited here: a takeover may process many entries, and the leases
                        # held meanwhile must still be renewed.
                        self._takeovers.add(asyncio.ensure_future(self.on_acquire(shard)))
                        self._takeovers = {t for t in self._takeovers if not t.done()}
        if failure is not None:
            raise failure

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
            with self._lock:
                self._valid_until.pop(shard, None)
            await self._release(keys=[self.layout.shard_lease(shard)], args=[self.owner, self.ttl_ms])
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
                await self._release(keys=[self.layout.shard_lease(shard)], args=[self.owner, self.ttl_ms])
            await self.client.zrem(self.layout.workers(), self.owner)
        finally:
            with self._lock:
                self._valid_until.clear()
            self._draining.clear()

    def renew_blocking(self, client: Any) -> int:
        """One renewal round from another thread, with a synchronous client: the announcement and
        every held shard's lease in one pipeline. Returns how many leases were renewed. A lease
        found lost is left to the loop's next round (it logs it and lets it go)."""
        started = time.monotonic()
        read_until = started + self.ttl_ms / 1000 * READ_SHARE_OF_TTL
        with self._lock:
            shards = [s for s in self._valid_until if s not in self._draining]
        pipe = client.pipeline(transaction=False)
        # EVAL through execute_command: redis-py's cluster pipeline has no eval(), but routes EVAL by its key
        pipe.execute_command("EVAL", ANNOUNCE_LUA, 1, self.layout.workers(), self.owner, self.ttl_ms)
        for shard in shards:
            pipe.execute_command("EVAL", RENEW_LUA, 1, self.layout.shard_lease(shard), self.owner, self.ttl_ms)
        replies = pipe.execute(raise_on_error=False)
        if isinstance(replies[0], int):
            self.live_workers = max(1, replies[0])
        renewed = 0
        with self._lock:
            for shard, reply in zip(shards, replies[1:], strict=True):
                if reply == 1 and shard in self._valid_until and shard not in self._draining:
                    self._valid_until[shard] = max(self._valid_until[shard], read_until)
                    renewed += 1
        self.renewed_at = max(self.renewed_at, started)
        return renewed


class KeepAlive:
    """Renews a worker's leases from a thread of its own while the event loop is busy.

    The loop renews every ttl/3 (`ShardLeases.run`). This thread looks every ttl/10 and, when the
    loop's last round started more than 0.4 ttl ago (the loop is stuck in a long computation),
    renews in its place with its own synchronous connection. That leaves more than half the ttl
    for the thread to get the GIL a few times (wake up, send, read the reply). While the loop keeps
    time it sends nothing, so it costs Redis nothing in normal operation."""

    def __init__(self, leases: ShardLeases, client_factory: Callable[[], Any] | None = None) -> None:
        self.leases = leases
        self.period_s = leases.ttl_ms / 10_000
        self.late_after_s = leases.ttl_ms * 0.4 / 1000
        self._client_factory = client_factory or (lambda: renewal_client(leases.settings))
        self._client: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-keepalive", daemon=True)
        self._stalled = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.period_s + 1)
        if self._client is not None:
            _close_quietly(self._client)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check()

    def check(self) -> None:
        """One look: renew if the loop is late (called by the thread; tests call it directly)."""
        leases = self.leases
        late_s = time.monotonic() - leases.renewed_at
        if not leases.held or late_s < self.late_after_s:
            if self._stalled:
                self._stalled = False
                log.info("event loop back: shard leases renewed by the loop again")
            return
        try:
            if self._client is None:
                self._client = self._client_factory()
            renewed = leases.renew_blocking(self._client)
        except Exception as exc:  # RedisError, or a cluster not discoverable now: the next look tries again
            log.warning("shard leases: keep-alive renewal failed: %s", describe(exc))
            return
        leases.thread_renewals += 1
        if not self._stalled:
            self._stalled = True
            log.info("event loop busy for %.1f s (a long batch): %d shard leases renewed from the keep-alive "
                     "thread", late_s, renewed)


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing a connection of a broker that is gone: nothing to do
        pass
