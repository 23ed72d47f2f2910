"""Shard leases (services/worker/leases.py): workers split the shards, a commit without the lease
writes nothing, and a dead worker's shards and pending entries move to a live one after the ttl."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from services.broker.connect import async_client, sync_client
from services.metrics import Metrics
from services.settings import Settings
from services.streams.groups import ensure_groups
from services.worker.commit import LeaseLost
from services.worker.housekeeping import Housekeeper
from services.worker.leases import KeepAlive, ShardLeases, fair_share, plan
from services.worker.processor import BatchProcessor
from tests.support.pipeline import ended_runs, start_worker, stop, wait_until
from tests.worker.test_batch_processor import Harness, eof, expected, line


@given(st.integers(1, 64), st.integers(1, 12), st.sets(st.integers(0, 63)))
def test_the_plan_gives_every_worker_a_fair_share_and_gives_back_the_highest_shards(shards, live, held):
    held = {s for s in held if s < shards}
    todo = plan(shards, held, live)
    assert todo.share == fair_share(shards, live) and todo.share * live >= shards
    assert (todo.share - 1) * live < shards  # no bigger than needed
    kept = held - set(todo.release)
    assert len(kept) == min(len(held), todo.share)
    assert all(r > k for r in todo.release for k in kept)  # the highest go back
    assert todo.wanted == max(0, todo.share - len(held))


def _run(settings: Settings, body: Any) -> Any:
    async def go() -> Any:
        client = async_client(settings)
        try:
            await ensure_groups(client, settings)
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.fixture
def leased(settings: Settings) -> Settings:
    return settings.model_copy(update={"redaction_enabled": False, "lease_ttl_ms": 1_000})


def test_two_workers_split_the_shards_and_each_reads_only_its_own(leased):
    metrics = Metrics()

    async def body(client):
        a, b = ShardLeases(leased, client, "a", metrics=metrics), ShardLeases(leased, client, "b")
        await a.tick()
        a._report()
        assert metrics.registry.get_sample_value("goose_ingest_shard_leases_held") == leased.shards
        assert a.held == set(range(leased.shards))  # alone: every shard
        await b.tick()
        assert b.held == set()  # all taken; a gives back its share above 2 on its next round
        await a.tick()
        await b.tick()
        assert len(a.held) == len(b.held) == leased.shards // 2 and not a.held & b.held
        owners = {s: (await client.get(leased.layout.shard_lease(s))).decode() for s in range(leased.shards)}
        assert owners == {**{s: "a" for s in a.held}, **{s: "b" for s in b.held}}
        assert all(a.may_read(s) != b.may_read(s) for s in range(leased.shards))
        a._report()
        assert metrics.registry.get_sample_value("goose_ingest_shard_leases_held") == leased.shards // 2
        await b.release_all()  # b stops: a takes everything back on its next round
        await a.tick()
        assert a.held == set(range(leased.shards))

    _run(leased, body)


def test_a_former_owner_cannot_renew_a_lease_another_worker_took(leased):
    async def body(client):
        a, b = ShardLeases(leased, client, "a"), ShardLeases(leased, client, "b")
        await a.tick()
        # a stalls past its ttl: its leases and its announcement expire
        await client.delete(*(leased.layout.shard_lease(s) for s in range(leased.shards)))
        await client.zrem(leased.layout.workers(), "a")
        await b.tick()
        assert b.held == set(range(leased.shards))
        await a.tick()
        assert a.held == set() and not any(a.may_read(s) for s in range(leased.shards))
        assert b.held == set(range(leased.shards))

    _run(leased, body)


def test_a_lease_is_read_only_until_most_of_its_ttl_has_passed_without_a_renewal(leased):
    async def body(client):
        a = ShardLeases(leased, client, "a")
        await a.tick()
        assert a.may_read(0)
        await asyncio.sleep(leased.lease_ttl_ms / 1000 * 0.85)  # no renewal: past 80% of the ttl
        assert not a.may_read(0)

    _run(leased, body)


def test_a_commit_for_a_shard_whose_lease_names_another_worker_writes_nothing(leased):
    h = Harness(leased)
    run = "lease/fenced"
    for seq in range(3):
        h.add(line(run, seq))
    shard, _ = h.add(eof(run, 3))
    h.sync.set(leased.layout.shard_lease(shard), "someone-else", px=60_000)

    async def body(client):
        ids, fields = h.read(shard)
        with pytest.raises(LeaseLost):
            await BatchProcessor(leased, client, lease_owner="me").process(shard, ids, fields)
        assert h.pending(shard) == 4 and h.events(run) == [] and h.records(run) == []
        h.sync.set(leased.layout.shard_lease(shard), "me", px=60_000)
        return await BatchProcessor(leased, client, lease_owner="me").process(shard, ids, fields)

    result = _run(leased, body)
    assert result.outcomes == {"processed": 4}
    assert h.events(run) == expected(run, 3)  # once: the refused commit wrote no event
    assert h.pending(shard) == 0


def test_a_new_owner_takes_a_dead_workers_pending_entries_at_once_not_after_the_claim_idle_time(leased):
    """A worker read entries and died holding the lease: once the lease expires, the next owner
    claims them at once (the default CLAIM_IDLE_MS of 30 s does not apply: the dead worker's commit
    would be refused by the lease anyway)."""
    settings = leased
    assert settings.claim_idle_ms == 30_000
    h = Harness(settings)
    for stream in settings.layout.raw_streams():
        h.sync.xgroup_create(stream, settings.group, id="0", mkstream=True)
    runs = [f"lease/taken-{i}" for i in range(8)]
    for run in runs:
        for seq in range(3):
            h.add(line(run, seq))
        h.add(eof(run, 3))
    shards = sorted({settings.layout.shard_of(r) for r in runs})
    for shard in shards:  # the dead worker's reads: every entry pending on it
        h.sync.set(settings.layout.shard_lease(shard), "dead", px=settings.lease_ttl_ms)
        h.sync.xreadgroup(settings.group, "dead", {settings.layout.raw_stream(shard): ">"}, count=10_000)
    assert sum(h.pending(s) for s in shards) == 4 * len(runs)

    async def body(client):
        processor = BatchProcessor(settings, client, lease_owner="heir")
        keeper = Housekeeper(settings, client, processor, "heir")
        heir = ShardLeases(settings, client, "heir", on_acquire=keeper.take_over)
        await heir.tick()
        assert heir.held.isdisjoint(shards)  # the dead worker's leases have not expired yet
        await asyncio.sleep(settings.lease_ttl_ms / 1000 + 0.1)
        started = time.monotonic()
        await heir.tick()
        assert heir.held == set(range(settings.shards))
        await asyncio.gather(*heir._takeovers)
        return time.monotonic() - started

    took = _run(settings, body)
    assert took < settings.claim_idle_ms / 1000
    assert sum(h.pending(s) for s in shards) == 0
    for run in runs:
        assert h.events(run) == expected(run, 3)


class _FailoverMoment:
    """The worker's async client, whose claim calls fail in the order of `failing` (method names of
    the one reclaim, services/streams/pending.py: XPENDING, XCLAIM) the way the cluster client's do
    in the seconds after a primary died (connection closed; the slot map is being read again).
    Everything else, and every later call, goes to the real Redis."""

    def __init__(self, client: Any, failing: list[str]) -> None:
        self._client, self.failing, self.failed = client, list(failing), 0
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._client, name)
        if name not in ("xpending_range", "xclaim"):
            return real

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.failing and self.failing[0] == name:
                self.failing.pop(0)
                self.failed += 1
                raise redis.exceptions.ConnectionError("Connection closed by server.")
            return await real(*args, **kwargs)

        return call


def test_a_takeover_waits_out_a_failover_instead_of_leaving_the_entries_to_the_claim_idle_time(leased):
    """Issue 20 finding 11 (the handover case of tests/broker/test_cluster_failover_stall.py): the
    broker fails the takeover's first XPENDING and XCLAIMs (a failover right after the lease moved). The new
    owner tries again while the shard is its own and processes the previous owner's entries within
    seconds; given up at the first error, they waited for the periodic reclaim (CLAIM_IDLE_MS, 30 s
    at defaults, after they were read)."""
    settings = leased
    assert settings.claim_idle_ms == 30_000
    h = Harness(settings)
    run = "lease/failover"
    for seq in range(3):
        h.add(line(run, seq))
    h.add(eof(run, 3))
    shard = settings.layout.shard_of(run)
    h.sync.xgroup_create(settings.layout.raw_stream(shard), settings.group, id="0", mkstream=True)
    h.sync.xreadgroup(settings.group, "previous", {settings.layout.raw_stream(shard): ">"}, count=100)
    assert h.pending(shard) == 4

    async def body(client):
        flaky = _FailoverMoment(client, ["xpending_range", "xclaim", "xclaim"])  # mid-reclaim too
        keeper = Housekeeper(settings, flaky, BatchProcessor(settings, client, lease_owner="heir"), "heir")
        await client.set(settings.layout.shard_lease(shard), "heir", px=60_000)
        started = time.monotonic()
        await keeper.take_over(shard)
        return time.monotonic() - started, flaky.failed

    took, failed = _run(settings, body)
    assert failed == 3  # the failures happened, and were waited out
    assert took < settings.claim_idle_ms / 1000 / 3
    assert h.pending(shard) == 0 and h.events(run) == expected(run, 3)


def test_a_takeover_does_not_wait_out_what_is_not_an_outage(leased, caplog):
    """An error that is not an outage (WRONGTYPE: the raw stream's key overwritten) is a refusal of
    the request itself: tried once, one warning, left to the periodic reclaim."""
    settings = leased
    shard = 0
    Harness(settings).sync.set(settings.layout.raw_stream(shard), "not a stream")

    async def body() -> int:
        client = async_client(settings)
        try:
            counting = _FailoverMoment(client, [])
            keeper = Housekeeper(settings, counting, BatchProcessor(settings, client, lease_owner="heir"), "heir")
            await keeper.take_over(shard)
            return counting.calls.get("xpending_range", 0)
        finally:
            await client.aclose()

    with caplog.at_level("WARNING", logger="goose_ingest.worker"):
        assert asyncio.run(body()) == 1
    assert any(f"taking over shard {shard} failed (ResponseError: WRONGTYPE" in r.getMessage() for r in caplog.records), caplog.text


def test_two_worker_processes_split_the_shards_and_a_killed_ones_shards_move_after_the_ttl(settings, tmp_path):
    """Default lease and claim settings: the survivor finishes the killed worker's runs about one
    lease ttl (10 s) after the kill, well before the 30 s reclaim of idle entries would have."""
    r = redis.Redis.from_url(settings.redis_url)
    log = tmp_path / "workers.log"
    env = {"GOOSE_INGEST_CLAIM_IDLE_MS": "30000", "GOOSE_INGEST_SWEEP_INTERVAL_S": "5"}
    workers = [start_worker(settings, log, **env) for _ in range(2)]
    try:
        def owners() -> dict[int, str]:
            values = [r.get(settings.layout.shard_lease(s)) for s in range(settings.shards)]
            # a shard given back says `released:<former owner>` until another worker takes it
            return {s: v.decode() for s, v in enumerate(values) if v is not None and not v.startswith(b"released:")}

        half = settings.shards // 2

        def split_evenly() -> dict[int, str] | None:
            o = owners()
            counts = sorted(list(o.values()).count(w) for w in set(o.values()))
            return o if len(o) == settings.shards and counts == [half, settings.shards - half] else None

        split = wait_until(split_evenly, timeout=60)
        h = Harness(settings)
        victim_owner = split[0]
        victim_shards = {s for s, o in split.items() if o == victim_owner}
        # The victim is killed holding its leases; then runs arrive on its shards.
        runs = [f"lease/e2e-{i}" for i in range(40)]
        runs = [run for run in runs if settings.layout.shard_of(run) in victim_shards][:6]
        assert runs
        victim = next(w for w in workers if f"-{w.pid}-" in victim_owner)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed = time.monotonic()
        for run in runs:
            for seq in range(3):
                h.add(line(run, seq))
            h.add(eof(run, 3))
        wait_until(lambda: ended_runs(settings) >= set(runs), timeout=60)
        took = time.monotonic() - killed
        assert took < 25, f"the killed worker's shards took {took:.1f} s to move"
        assert set(owners().values()) == {next(o for o in split.values() if o != victim_owner)}
    finally:
        for w in workers:
            stop(w)
    for run in runs:
        assert h.events(run) == expected(run, 3)


def test_leases_outlive_a_computation_longer_than_the_ttl_through_the_keep_alive_thread(leased):
    """The event loop is blocked (a batch computing) for 2.5 ttl: the keep-alive thread renews the
    leases meanwhile, so the batch's commit afterwards is not fenced off."""
    h = Harness(leased)
    run = "lease/long-compute"
    for seq in range(3):
        h.add(line(run, seq))
    shard, _ = h.add(eof(run, 3))

    async def body(client):
        leases = ShardLeases(leased, client, "me")
        await leases.tick()
        keepalive = KeepAlive(leases)
        keepalive.start()
        try:
            ids, fields = h.read(shard)
            time.sleep(2.5 * leased.lease_ttl_ms / 1000)  # the loop computes: no tick can run
            assert h.sync.get(leased.layout.shard_lease(shard)) == b"me"
            assert leases.may_read(shard) and leases.thread_renewals >= 2
            result = await BatchProcessor(leased, client, lease_owner="me").process(shard, ids, fields)
        finally:
            keepalive.stop()
        assert not keepalive._thread.is_alive()
        return result

    assert _run(leased, body).outcomes == {"processed": 4}
    assert h.events(run) == expected(run, 3)


def test_the_keep_alive_thread_sends_nothing_while_the_loop_renews_in_time(leased):
    async def body(client):
        leases = ShardLeases(leased, client, "me")
        task = asyncio.create_task(leases.run())
        await asyncio.sleep(2.5 * leased.lease_ttl_ms / 1000)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return leases

    leases = _run(leased, body)
    assert leases.held == set(range(leased.shards)) and leases.thread_renewals == 0


def test_a_keep_alive_renewal_never_revives_a_lease_given_back_or_taken_by_another_worker(leased):
    async def body(client):
        leases = ShardLeases(leased, client, "me")
        await leases.tick()
        await leases.give_back(0)
        h = Harness(leased)
        h.sync.set(leased.layout.shard_lease(1), "other", px=60_000)
        assert leases.renew_blocking(h.sync) == leased.shards - 2
        assert 0 not in leases.held and not leases.may_read(0)
        assert h.sync.get(leased.layout.shard_lease(0)) == b"released:me"  # given back: free for the others
        assert h.sync.get(leased.layout.shard_lease(1)) == b"other"
        assert h.sync.zscore(leased.layout.workers(), "me") is not None

    _run(leased.model_copy(update={"shards": 4}), body)


def test_a_keep_alive_renewal_works_on_a_redis_cluster(cluster_settings):
    """One pipeline over the nodes: each EVAL is routed by its key (the lease of its shard's slot)."""
    settings = cluster_settings.model_copy(update={"lease_ttl_ms": 1_000})

    async def body(client):
        leases = ShardLeases(settings, client, "me")
        await leases.tick()
        sync = sync_client(settings)
        try:
            for shard in range(settings.shards):
                sync.pexpire(settings.layout.shard_lease(shard), 300)
            assert leases.renew_blocking(sync) == settings.shards
            assert all(sync.pttl(settings.layout.shard_lease(s)) > 500 for s in range(settings.shards))
            assert sync.zscore(settings.layout.workers(), "me") is not None
        finally:
            sync.close()

    async def go():
        client = async_client(settings)
        try:
            return await body(client)
        finally:
            await client.aclose()

    asyncio.run(go())
