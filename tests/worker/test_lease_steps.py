"""A batch never loses its shard's lease to its own computation (issue 20 finding 2, Deliver 3):
the leases are renewed between the batch's steps (services/worker/leases.py `renew_if_due`,
called through `BatchProcessor.pulse`), and a lease that expired under a batch anyway is taken
back by its commit when nobody else took it and the batch's entries are still this worker's
(services/worker/commit.lua). Real Redis, the real redaction cost, no keep-alive thread.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from services.settings import Settings
from services.worker.commit import LeaseLost
from services.worker.leases import DUE_SHARE_OF_TTL, ShardLeases
from services.worker.processor import STEP_CHARS, BatchProcessor
from tests.support.heavy_lines import line_costing
from tests.worker.test_batch_processor import Harness, eof, expected, line, run_async

TTL_MS = 3_000
STEP_S = 0.3  # what one heavy line costs here (calibrated): ten of them to a ttl


@pytest.fixture
def slow(settings: Settings) -> Settings:
    """Redaction on (it is the cost), a short lease."""
    return settings.model_copy(update={"lease_ttl_ms": TTL_MS, "redaction_enabled": True})


def _heavy_batch(h: Harness, settings: Settings, run: str) -> tuple[int, float]:
    """Enough heavy lines on `run`'s shard that their computation lasts ~3 ttl; returns (shard, cost)."""
    heavy, per_line_s = line_costing(settings, STEP_S)
    assert len(heavy) >= STEP_CHARS  # one line is one step
    n = max(4, int(3 * settings.lease_ttl_ms / 1000 / per_line_s) + 1)
    for seq in range(n):
        h.add({b"run": run.encode(), b"seq": str(seq).encode(), b"ts": b"1", b"line": heavy})
    shard, _ = h.add(eof(run, n))
    return shard, n * per_line_s


def _computes_through(settings: Settings, renew: bool) -> tuple[list[int], object, float]:
    """One heavy batch processed by a worker holding every lease, with or without renewal between
    steps; returns the shard lease's PTTL seen at each step, the result (or LeaseLost), and the time."""
    seen, _, result, took = _steps_of(settings, renew)
    return seen, result, took


def _steps_of(settings: Settings, renew: bool) -> tuple[list[int], list[float], object, float]:
    """`_computes_through`, with the time of each step as well."""
    h = Harness(settings)
    run = "steps/heavy"
    shard, _ = _heavy_batch(h, settings, run)
    lease = settings.layout.shard_lease(shard)
    seen: list[int] = []
    at: list[float] = []

    async def body(client):
        leases = ShardLeases(settings, client, "test")  # "test": the consumer Harness.read reads as
        await leases.tick()
        processor = BatchProcessor(settings, client, lease_owner="test")

        def pulse() -> None:
            if renew:
                leases.renew_if_due()
            seen.append(int(h.sync.pttl(lease)))
            at.append(time.monotonic())

        processor.pulse = pulse
        ids, fields = h.read(shard)
        started = time.monotonic()
        try:
            result: object = await processor.process(shard, ids, fields)
        except LeaseLost as exc:
            result = exc
        took = time.monotonic() - started
        leases.stop_keepalive()
        return result, took, leases.step_renewals

    result, took, renewals = run_async(settings, body)
    if renew:
        assert renewals >= 2
    return seen, at, result, took


def test_a_batch_computing_for_longer_than_the_ttl_keeps_its_leases_by_renewing_between_its_steps(slow):
    seen, at, result, took = _steps_of(slow, renew=True)
    # Longer than one ttl is the premise (a lease taken at the start would have lapsed); the batch is
    # sized for ~3 ttl from a calibration that a change of the machine's load can make 2-3x off.
    assert took > slow.lease_ttl_ms / 1000, f"{took:.1f} s: not longer than the ttl, not a test of it"
    assert len(seen) >= 5, seen
    # Renewed once DUE_SHARE_OF_TTL of the ttl has passed, the lease has at least the rest left at
    # every step, however long the steps are, unless one step alone outlasted what it had left: a
    # machine that stalled the computation (seen once under CI's load), which no renewal between
    # steps can cover. Any other lapse, or a lease running low, is the renewal failing.
    floor = slow.lease_ttl_ms * (1 - DUE_SHARE_OF_TTL) - 250
    for i, pttl in enumerate(seen):
        if pttl > 0:
            assert pttl >= floor, (i, seen)
        elif i == 0 or seen[i - 1] > 0:  # the first step of a lapse
            stalled_ms = (at[i] - at[i - 1]) * 1000 if i else 0.0
            assert i > 0 and stalled_ms >= seen[i - 1], (i, stalled_ms, seen)
    assert sum(p > 0 for p in seen) >= len(seen) // 2, seen  # a stall is the exception, not the run
    assert not isinstance(result, LeaseLost)
    assert result.outcomes["processed"] >= 5  # type: ignore[attr-defined]


def test_without_the_renewal_between_steps_the_same_batch_outlives_its_lease(slow):
    """The control: the same batch, the steps not renewing: the lease lapses under it (-2: gone)."""
    seen, _, took = _computes_through(slow, renew=False)
    assert took > slow.lease_ttl_ms / 1000
    assert -2 in seen, seen


def _read_as_test(h: Harness, shard: int) -> tuple[list[str], list]:
    """The entries of `shard`, read (so pending) as consumer "test", the lease owner below."""
    try:
        h.sync.xgroup_create(h.layout.raw_stream(shard), h.settings.group, id="0", mkstream=True)
    except redis.ResponseError as exc:  # BUSYGROUP: created already
        assert "BUSYGROUP" in str(exc)
    ids, fields = h.read(shard)
    assert ids
    return ids, fields


def test_a_commit_takes_back_an_expired_lease_nobody_took_when_its_entries_are_still_its_own(settings, caplog):
    h = Harness(settings)
    run = "steps/retaken"
    for seq in range(3):
        h.add(line(run, seq))
    shard, _ = h.add(eof(run, 3))
    lease = settings.layout.shard_lease(shard)
    ids, fields = _read_as_test(h, shard)
    assert h.sync.get(lease) is None  # it expired under the batch; no other worker took it

    async def body(client):
        return await BatchProcessor(settings, client, lease_owner="test").process(shard, ids, fields)

    result = run_async(settings, body)
    assert result.outcomes == {"processed": 4}
    assert h.events(run) == expected(run, 3) and h.pending(shard) == 0
    assert h.sync.get(lease) == b"test"
    assert 0 < h.sync.pttl(lease) <= settings.lease_ttl_ms
    assert "took it back" in caplog.text


def test_a_commit_does_not_take_back_a_lease_when_another_worker_claimed_its_entries(settings):
    """The lease expired, another worker took the shard, claimed the entries and gave the shard
    back: the entries are that worker's now, so the late commit writes nothing and takes nothing."""
    h = Harness(settings)
    run = "steps/claimed"
    for seq in range(3):
        h.add(line(run, seq))
    shard, _ = h.add(eof(run, 3))
    stream, lease = settings.layout.raw_stream(shard), settings.layout.shard_lease(shard)
    ids, fields = _read_as_test(h, shard)
    h.sync.xclaim(stream, settings.group, "heir", 0, ids[-1:])  # one of them is enough

    async def body(client):
        with pytest.raises(LeaseLost):
            await BatchProcessor(settings, client, lease_owner="test").process(shard, ids, fields)

    run_async(settings, body)
    assert h.sync.get(lease) is None
    assert h.events(run) == [] and h.records(run) == [] and h.pending(shard) == 4


def test_a_commit_without_acknowledgements_never_takes_a_lease(settings):
    """An abandon marker acknowledges nothing, so nothing proves the shard is still this worker's."""
    from services.worker.commit import Commit, Committer

    layout = settings.layout

    async def body(client):
        commit = Commit(layout.raw_stream(0), settings.group, layout.active_runs(0), 60_000,
                        lease=layout.shard_lease(0), owner="test", lease_ttl_ms=settings.lease_ttl_ms)
        with pytest.raises(LeaseLost):
            await Committer(client).commit(commit)

    run_async(settings, body)
    assert Harness(settings).sync.get(layout.shard_lease(0)) is None


def test_the_next_round_keeps_a_lease_that_its_commit_took_back(settings):
    s = settings.model_copy(update={"shards": 2})
    h = Harness(s)
    h.sync.set(s.layout.shard_lease(1), "test", px=60_000)  # what commit.lua's take-back leaves
    h.sync.set(s.layout.shard_lease(0), "other", px=60_000)

    async def body(client):
        leases = ShardLeases(s, client, "test")
        await leases.tick()
        return leases.held

    assert run_async(s, body) == {1}
    assert 0 < h.sync.pttl(s.layout.shard_lease(1)) <= s.lease_ttl_ms  # renewed to the ttl, not left at 60 s


def test_renew_if_due_costs_nothing_until_a_round_is_due(settings):
    calls: list[int] = []

    class Counting:
        def __init__(self, real):
            self.real = real

        def pipeline(self, **kw):
            calls.append(1)
            return self.real.pipeline(**kw)

    async def body(client):
        leases = ShardLeases(settings, client, "test")
        await leases.tick()
        leases.renewal_client_factory = lambda: Counting(Harness(settings).sync)
        for _ in range(1000):
            leases.renew_if_due()
        assert calls == []  # the tick just renewed: not due
        leases.renewed_at -= settings.lease_ttl_ms / 1000 / 3 + 0.01
        leases.renew_if_due()
        leases.renew_if_due()
        assert calls == [1] and leases.step_renewals == 1  # one round, then not due again
        leases.stop_keepalive()

    run_async(settings, body)


def test_a_failed_renewal_between_steps_is_not_retried_at_every_step(settings):
    tries: list[int] = []

    def unreachable():
        tries.append(1)
        raise ConnectionError("broker down")

    async def body(client):
        leases = ShardLeases(settings, client, "test")
        await leases.tick()
        leases.renewal_client_factory = unreachable
        leases.renewed_at -= settings.lease_ttl_ms / 1000
        for _ in range(100):
            leases.renew_if_due()  # never raises into the batch
        assert tries == [1]
        await asyncio.sleep(settings.lease_ttl_ms / 10_000 + 0.05)
        leases.renew_if_due()
        assert tries == [1, 1]

    run_async(settings, body)


def test_a_late_batch_of_a_shard_given_back_is_refused_and_its_entries_reclaimed_at_the_next_sweep(settings):
    """Issue 20 finding 11: a read already in flight when a worker gives a shard back delivers
    entries to it after the release. Its commit must neither write nor pull the shard back (the
    lease says `released:<owner>`), and the entries must not wait CLAIM_IDLE_MS (30 s) for the new
    owner's reclaim: the refusal makes them idle that long, so the next sweep takes them."""
    from services.worker.housekeeping import Housekeeper

    s = settings.model_copy(update={"shards": 2})
    h = Harness(s)
    run = "steps/late-read"
    for seq in range(3):
        h.add(line(run, seq))
    shard, _ = h.add(eof(run, 3))
    lease = s.layout.shard_lease(shard)
    assert s.claim_idle_ms == 30_000

    async def body(client):
        old = ShardLeases(s, client, "test")  # "test": the consumer Harness.read reads as
        await old.tick()
        ids, fields = _read_as_test(h, shard)  # the read in flight ...
        await old.give_back(shard)  # ... when the shard is given back (nothing was busy yet)
        assert await client.get(lease) == b"released:test"
        with pytest.raises(LeaseLost):
            await BatchProcessor(s, client, lease_owner="test").process(shard, ids, fields)
        assert await client.get(lease) == b"released:test"  # not taken back by the late commit
        pending = h.sync.xpending_range(s.layout.raw_stream(shard), s.group, "-", "+", 10)
        assert {p["consumer"] for p in pending} == {b"test"} and len(pending) == 4
        assert all(p["time_since_delivered"] >= s.claim_idle_ms for p in pending)
        assert all(p["times_delivered"] == 1 for p in pending)  # the refusal is no delivery

        heir = ShardLeases(s, client, "heir")  # takes the given-back shard at its next round
        await heir.tick()
        assert shard in heir.held and await client.get(lease) == b"heir"
        processor = BatchProcessor(s, client, lease_owner="heir")
        started = time.monotonic()
        taken = await Housekeeper(s, client, processor, "heir").reclaim(shard)  # a sweep: default idle
        return taken, time.monotonic() - started

    taken, took = run_async(s, body)
    assert taken == 4 and took < 5
    assert h.events(run) == expected(run, 3) and h.pending(shard) == 0
