"""The batch processor in process, against the test Redis: commits, conflicts, dead letters, held
entries, abandonment and the control stream. Milliseconds each; kill -9 stays in test_worker_e2e."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
import redis

from contracts.raw import stream_id_ms
from contracts.topics import TopicEntry
from services.broker.connect import async_client
from services.normalizer import RunNormalizer
from services.sequencer import Entry
from services.settings import Settings
from services.streams.groups import ensure_groups
from services.worker.commit import HELD_PREFIX
from services.worker.processor import BatchProcessor, BatchResult
from tests.support.fakes import RaisingRedactor

TEXT = '{"type":"message","message":{"id":"m%d","role":"assistant","content":[{"type":"text","text":"%s"}]}}'
TS = 1_790_000_000_000


def line(run: str, seq: int, text: str | None = None) -> dict[bytes, bytes]:
    entry = Entry.of_line(run, seq, TS + seq, TEXT % (seq, text if text is not None else f"part {seq}"), host="h")
    return entry.to_fields()


def eof(run: str, seq: int, exit_code: int | None = 0) -> dict[bytes, bytes]:
    return Entry.of_eof(run, seq, TS + seq, exit_code, host="h").to_fields()


class Harness:
    """Raw entries XADDed to the test Redis, read back with their ids and fed to processors."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.sync = redis.Redis.from_url(settings.redis_url)

    def add(self, fields: dict[bytes, bytes], run: str | None = None) -> tuple[int, str]:
        target = run or fields[b"run"].decode()
        shard = self.layout.shard_of(target)
        sid = self.sync.xadd(self.layout.raw_stream(shard), fields).decode()
        return shard, sid

    def read(self, shard: int) -> tuple[list[str], list[dict[bytes, bytes]]]:
        """What XREADGROUP hands a worker: every undelivered entry of the shard."""
        reply = self.sync.xreadgroup(self.settings.group, "test", {self.layout.raw_stream(shard): ">"}, count=10_000)
        if not reply:
            return [], []
        items = reply[0][1]
        return [sid.decode() for sid, _ in items], [f for _, f in items]

    def topic(self, stream: str) -> list[dict[bytes, bytes]]:
        return [f for _, f in self.sync.xrange(stream)]

    def events(self, run: str) -> list[dict[str, Any]]:
        out = []
        for stream in self.layout.events_partitions():
            out += [e.document() for e in map(TopicEntry.from_fields, self.topic(stream)) if e.run == run]
        return out

    def records(self, run: str) -> list[dict[str, Any]]:
        out = []
        for stream in self.layout.runs_partitions():
            out += [e.document() for e in map(TopicEntry.from_fields, self.topic(stream)) if e.run == run]
        return out

    def dead(self) -> list[dict[str, bytes]]:
        return [{k.decode(): v for k, v in f.items()}
                for stream in self.layout.deadletter_partitions() for f in self.topic(stream)]

    def pending(self, shard: int) -> int:
        return int(self.sync.xpending(self.layout.raw_stream(shard), self.settings.group)["pending"])


def run_async(settings: Settings, body: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        client = async_client(settings)
        try:
            await ensure_groups(client, settings)
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


async def process_shard(h: Harness, processor: BatchProcessor, shard: int) -> BatchResult:
    ids, fields = h.read(shard)
    return await processor.process(shard, ids, fields)


def expected(run: str, n: int, exit_code: int = 0) -> list[dict[str, Any]]:
    norm = RunNormalizer(run)
    out: list[dict[str, Any]] = []
    for seq in range(n):
        out += norm.line(seq, TS + seq, TEXT % (seq, f"part {seq}"), "stdout")
    return out + norm.end(n, TS + n, exit_code)


@pytest.fixture
def plain(settings: Settings) -> Settings:
    return settings.model_copy(update={"redaction_enabled": False})


def test_a_batch_commits_events_records_and_acks(plain):
    h = Harness(plain)
    run = "bp/simple"
    for seq in range(3):
        h.add(line(run, seq))
    shard, _ = h.add(eof(run, 3))

    async def body(client):
        return await process_shard(h, BatchProcessor(plain, client), shard)

    result = run_async(plain, body)
    assert result.outcomes == {"processed": 4}
    assert h.events(run) == expected(run, 3)
    assert [r["state"] for r in h.records(run)] == ["started", "ended"]
    assert h.pending(shard) == 0
    assert h.sync.zscore(h.layout.active_runs(shard), run) is None  # ended: no longer active
    assert h.sync.pttl(h.layout.run_state(run)) > 0  # kept for late duplicates, then expires


def test_open_runs_are_indexed_once_per_batch_and_keep_no_ttl_and_latency_is_sampled_per_entry(plain):
    """commit.lua writes the active-runs index with one ZADD (and one ZREM) per batch: every open
    run of the batch is in it with its last activity, an ended one is not, and an open run's state
    has no TTL. The batch's latency samples are one per processed entry, dated by the Redis clock."""
    h = Harness(plain)
    runs = [f"bp/index-{i}" for i in range(40)]
    shards = {h.layout.shard_of(r) for r in runs}
    sids: dict[str, str] = {}
    for seq in range(2):
        for r in runs:
            _, sids[r] = h.add(line(r, seq))
    h.add(eof(runs[0], 2))

    async def body(client):
        processor = BatchProcessor(plain, client)
        return [await process_shard(h, processor, shard) for shard in sorted(shards)]

    results = run_async(plain, body)
    for r in runs[1:]:
        shard = h.layout.shard_of(r)
        assert h.sync.zscore(h.layout.active_runs(shard), r) == stream_id_ms(sids[r])
        assert h.sync.pttl(h.layout.run_state(r)) == -1
    assert h.sync.zscore(h.layout.active_runs(h.layout.shard_of(runs[0])), runs[0]) is None
    assert h.sync.pttl(h.layout.run_state(runs[0])) > 0
    latencies = [ms for result in results for ms in result.latencies_ms()]
    assert len(latencies) == 2 * len(runs) + 1
    assert all(0 <= ms < 60_000 for ms in latencies)
    every_other = [ms for result in results for ms in result.latencies_ms(step=2)]
    assert len(every_other) == sum((len(result.processed_ids) + 1) // 2 for result in results)


def test_two_processors_with_a_stale_cache_retry_on_conflict_and_lose_nothing(plain):
    h = Harness(plain)
    run = "bp/conflict"

    async def body(client):
        a, b = BatchProcessor(plain, client), BatchProcessor(plain, client)
        shard, _ = h.add(line(run, 0))
        await process_shard(h, a, shard)  # a caches the run at version 1
        h.add(line(run, 1))
        await process_shard(h, b, shard)  # b moves it to version 2: a's cache is stale now
        h.add(line(run, 2))
        h.add(eof(run, 3))
        result = await process_shard(h, a, shard)  # a's commit conflicts, it reloads and retries
        return shard, result

    shard, result = run_async(plain, body)
    assert result.outcomes == {"processed": 2}
    assert h.events(run) == expected(run, 3)
    assert h.sync.hget(h.layout.run_state(run), "v") == b"3"
    assert h.pending(shard) == 0


def test_a_retried_commit_still_writes_the_held_entries_of_runs_that_did_not_conflict(plain):
    h = Harness(plain)
    shard = 0
    stale, holder = (next(r for r in (f"bp/{name}-{i}" for i in range(60)) if h.layout.shard_of(r) == shard)
                     for name in ("stale", "holder"))

    async def body(client):
        a, b = BatchProcessor(plain, client), BatchProcessor(plain, client)
        h.add(line(stale, 0))
        await process_shard(h, a, shard)  # a caches `stale` at version 1
        h.add(line(stale, 1))
        await process_shard(h, b, shard)  # b moves it on: a's cache is stale
        h.add(line(stale, 2))
        h.add(line(holder, 1))  # held: seq 0 has not arrived
        await process_shard(h, a, shard)  # conflict on `stale` only; the retry must write holder's held entry
        held = h.sync.hkeys(h.layout.run_state(holder))
        h.add(line(holder, 0))
        h.add(eof(holder, 2))
        await process_shard(h, BatchProcessor(plain, client), shard)  # no cache: the held entry comes from Redis
        return held

    held = run_async(plain, body)
    assert b"h:1" in held
    assert [e["message"] for e in h.events(holder)] == ["part 0", "part 1"]


def test_a_state_written_with_its_held_entries_inline_is_taken_over(plain):
    """States of an older worker kept held entries inside `s`: they move to their own fields."""
    from services.sequencer import RunSequencer

    h = Harness(plain)
    run = "bp/upgrade"
    shard = h.layout.shard_of(run)
    old = RunSequencer(run)
    old.accept(Entry.from_fields(line(run, 2), "1-0"))
    state = old.to_state()
    assert state["buffer"]  # inline, as before
    h.sync.hset(h.layout.run_state(run), mapping={"v": "1", "s": orjson.dumps(state)})

    async def body(client):
        h.add(line(run, 1))
        await process_shard(h, BatchProcessor(plain, client), shard)
        fields = h.sync.hkeys(h.layout.run_state(run))
        h.add(line(run, 0))
        h.add(eof(run, 3))
        await process_shard(h, BatchProcessor(plain, client), shard)
        return fields

    fields = run_async(plain, body)
    assert {b"h:1", b"h:2"} <= set(fields)
    assert [e["message"] for e in h.events(run)] == ["part 0", "part 1", "part 2"]


def test_dead_letters_carry_reason_detail_source_and_the_original_fields(plain):
    h = Harness(plain)
    run = "bp/dead"
    shard, bad_sid = h.add({b"run": run.encode(), b"seq": b"--5", b"line": b"x"}, run)
    h.add({b"run": b"not a run key", b"seq": b"0", b"line": b"x"}, run)

    async def body(client):
        return await process_shard(h, BatchProcessor(plain, client), shard)

    result = run_async(plain, body)
    assert result.dead == {"invalid-entry": 2}
    first, second = h.dead()
    assert first["reason"] == b"invalid-entry" and b"'seq' is not an integer" in first["detail"]
    assert first["source"] == h.layout.raw_stream(shard).encode() and first["sourceId"] == bad_sid.encode()
    assert first["raw.seq"] == b"--5" and first["raw.line"] == b"x"
    assert b"not a run key" in second["detail"] and second["raw.run"] == b"not a run key"
    assert h.pending(shard) == 0


def test_held_entries_are_stored_one_by_one_beside_the_state_and_removed_when_taken(plain):
    h = Harness(plain)
    run = "bp/held"
    key = h.layout.run_state(run)

    async def body(client):
        p = BatchProcessor(plain, client)
        shard = h.layout.shard_of(run)
        for seq in (2, 3, 4):
            h.add(line(run, seq))
        await process_shard(h, p, shard)
        held_after_first = sorted(k for k in h.sync.hkeys(key) if k.startswith(HELD_PREFIX))
        state = orjson.loads(h.sync.hget(key, "s"))
        # A fresh processor (no cache) loads the held entries from the hash.
        h.add(line(run, 1))
        await process_shard(h, BatchProcessor(plain, client), shard)
        held_after_second = sorted(k for k in h.sync.hkeys(key) if k.startswith(HELD_PREFIX))
        h.add(line(run, 0))
        h.add(eof(run, 5))
        await process_shard(h, BatchProcessor(plain, client), shard)
        return held_after_first, state, held_after_second

    first, state, second = run_async(plain, body)
    assert first == [b"h:2", b"h:3", b"h:4"]
    assert state["buffer"] is None  # not inside the state: the state stays small however much is held
    assert second == [b"h:1", b"h:2", b"h:3", b"h:4"]  # one field added, none rewritten
    assert not [k for k in h.sync.hkeys(key) if k.startswith(HELD_PREFIX)]
    assert h.events(run) == expected(run, 5)


def test_beyond_the_held_bytes_cap_an_entry_is_dead_lettered_and_reported_missing(settings):
    s = settings.model_copy(update={"redaction_enabled": False, "max_held_bytes": 2000})
    h = Harness(s)
    run = "bp/cap"
    big = "x" * 900  # ~1,050 bytes held with its JSON and overhead: a second one exceeds 2,000

    async def body(client):
        p = BatchProcessor(s, client)
        shard = h.layout.shard_of(run)
        h.add(line(run, 1, big))
        h.add(line(run, 2, big))  # dead-lettered hold-limit
        h.add(line(run, 3))
        h.add(line(run, 0))
        h.add(eof(run, 4))
        return await process_shard(h, p, shard)

    result = run_async(s, body)
    assert result.dead == {"hold-limit": 1}
    (dead,) = h.dead()
    assert dead["reason"] == b"hold-limit" and dead["raw.seq"] == b"2"
    events = h.events(run)
    warnings = [e for e in events if e["type"] == "warning"]
    assert [(w["code"], w["lines"]) for w in warnings] == [("missing-entries", [2, 2])]
    ended = h.records(run)[-1]
    assert ended["state"] == "ended" and ended["missing"] == [[2, 2]]


def test_a_dead_lettered_seq_is_skipped_and_reported_instead_of_stalling_the_run(plain):
    h = Harness(plain)
    run = "bp/lost"

    async def body(client):
        shard = h.layout.shard_of(run)
        h.add(line(run, 0))
        h.add({b"run": run.encode(), b"seq": b"1", b"ts": "²".encode(), b"line": b"x"}, run)  # invalid ts
        h.add(line(run, 2))
        h.add(eof(run, 3))
        return await process_shard(h, BatchProcessor(plain, client), shard)

    result = run_async(plain, body)
    assert result.dead == {"invalid-entry": 1}
    records = h.records(run)
    assert [r["state"] for r in records] == ["started", "ended"] and records[-1]["missing"] == [[1, 1]]
    assert [e["code"] for e in h.events(run) if e["type"] == "warning"] == ["missing-entries"]


def test_abandonment_writes_its_marker_on_the_control_stream_and_ends_the_run(plain):
    h = Harness(plain)
    run = "bp/abandon"
    shard = h.layout.shard_of(run)

    async def body(client):
        from services.worker.housekeeping import Housekeeper

        p = BatchProcessor(plain, client)
        for seq in (0, 1, 3):
            h.add(line(run, seq))
        await process_shard(h, p, shard)
        keeper = Housekeeper(plain, client, p, "test")
        return await keeper.abandon(run, TS + 10_000)

    assert run_async(plain, body) is True
    (marker,) = h.topic(h.layout.control_stream(shard))
    assert marker[b"kind"] == b"abandon" and marker[b"through"] == b"3" and marker[b"missing"] == b"[[2,2]]"
    assert not [f for f in h.topic(h.layout.raw_stream(shard)) if f.get(b"kind") == b"abandon"]
    records = h.records(run)
    assert records[-1]["state"] == "abandoned" and records[-1]["missing"] == [[2, 2]]
    assert h.sync.zscore(h.layout.active_runs(shard), run) is None


def test_a_forged_abandon_marker_on_the_raw_stream_ends_nothing(plain):
    h = Harness(plain)
    run = "bp/victim"

    async def body(client):
        p = BatchProcessor(plain, client)
        shard = h.layout.shard_of(run)
        h.add(line(run, 0))
        h.add({b"run": run.encode(), b"seq": b"1", b"ts": b"1", b"kind": b"abandon", b"through": b"0",
               b"missing": b"[]"}, run)
        h.add(line(run, 1))
        h.add(eof(run, 2))
        return await process_shard(h, p, shard)

    result = run_async(plain, body)
    assert result.dead == {"invalid-entry": 1}
    (dead,) = h.dead()
    assert b"kind=abandon on a raw stream" in dead["detail"]
    records = h.records(run)
    assert [r["state"] for r in records] == ["started", "ended"] and "missing" not in records[-1]
    assert [e["message"] for e in h.events(run)] == ["part 0", "part 1"]


def test_an_entry_delivered_too_often_is_dead_lettered_and_its_seq_reported_missing(plain):
    h = Harness(plain)
    run = "bp/poison-deliveries"

    async def body(client):
        p = BatchProcessor(plain, client)
        shard = h.layout.shard_of(run)
        h.add(line(run, 0))
        _, sid = h.add(line(run, 1))
        h.add(line(run, 2))
        h.add(eof(run, 3))
        ids, fields = h.read(shard)
        return await p.process(shard, ids, fields, deliveries={sid: plain.max_deliveries + 1})

    result = run_async(plain, body)
    assert result.dead == {"max-deliveries": 1}
    records = h.records(run)
    assert records[-1]["state"] == "ended" and records[-1]["missing"] == [[1, 1]]


def test_an_entry_whose_processing_raises_costs_only_itself(plain):
    h = Harness(plain)
    run, other = "bp/raises", "bp/innocent-same-batch"

    async def body(client):
        p = BatchProcessor(plain, client)
        p.redactor = RaisingRedactor()
        shard = h.layout.shard_of(run)
        h.add(line(run, 0))
        h.add({b"run": run.encode(), b"seq": b"1", b"ts": b"5", b"stream": b"stderr", b"line": b"POISON"}, run)
        h.add(line(run, 2))
        h.add(eof(run, 3))
        h.add(line(other, 0), other)
        h.add(eof(other, 1), other)
        results = [await process_shard(h, p, shard)]
        if h.layout.shard_of(other) != shard:
            results.append(await process_shard(h, p, h.layout.shard_of(other)))
        return results

    results = run_async(plain, body)
    assert sum(r.dead.get("processing-error", 0) for r in results) == 1
    (dead,) = h.dead()
    assert dead["reason"] == b"processing-error" and dead["detail"] == b"RecursionError" and dead["raw.seq"] == b"1"
    records = h.records(run)
    assert records[-1]["state"] == "ended" and records[-1]["missing"] == [[1, 1]]
    events = h.events(run)
    assert [e.get("code") for e in events if e["type"] == "warning"] == ["missing-entries"]
    assert [e["message"] for e in events if e["type"] == "agent"] == ["part 0", "part 2"]
    assert [r["state"] for r in h.records(other)] == ["started", "ended"]


def test_a_commit_redis_refuses_is_bisected_so_innocent_runs_commit(plain):
    h = Harness(plain)
    victim = "bp/refused"
    shard = h.layout.shard_of(victim)
    innocents = [r for r in (f"bp/innocent-{i}" for i in range(40)) if h.layout.shard_of(r) == shard][:5]
    # The victim's state has a version the script cannot count from: its commit raises a Lua error.
    h.sync.hset(h.layout.run_state(victim), "v", "not a number")

    async def body(client):
        for run in innocents[:2]:
            h.add(line(run, 0))
        h.add(line(victim, 0))
        for run in innocents[2:]:
            h.add(line(run, 0))
        for run in innocents:
            h.add(eof(run, 1))
        return await process_shard(h, BatchProcessor(plain, client), shard)

    result = run_async(plain, body)
    assert result.dead == {"processing-error": 1}
    (dead,) = h.dead()
    assert dead["raw.run"] == victim.encode() and dead["detail"].startswith(b"commit failed")
    for run in innocents:
        assert [r["state"] for r in h.records(run)] == ["started", "ended"], (run, h.records(run), h.dead(), innocents)
    assert h.pending(shard) == 0


def test_a_run_whose_stored_state_is_unusable_costs_only_its_own_entries(plain):
    h = Harness(plain)
    victim = "bp/foreign-key"
    shard = h.layout.shard_of(victim)
    innocent = next(r for r in (f"bp/neighbour-{i}" for i in range(40)) if h.layout.shard_of(r) == shard)
    h.sync.set(h.layout.run_state(victim), "a string, not a hash")  # WRONGTYPE for HGETALL

    async def body(client):
        h.add(line(victim, 0))
        h.add(line(innocent, 0))
        h.add(eof(innocent, 1))
        return await process_shard(h, BatchProcessor(plain, client), shard)

    result = run_async(plain, body)
    assert result.dead == {"processing-error": 1}
    (dead,) = h.dead()
    assert dead["raw.run"] == victim.encode() and dead["detail"] == b"run state unusable (ResponseError)"
    assert [r["state"] for r in h.records(innocent)] == ["started", "ended"]
    assert h.pending(shard) == 0


def test_stream_id_time_is_parsed_in_one_place():
    assert stream_id_ms("1790000000000-3") == 1_790_000_000_000
    assert stream_id_ms(b"12-0") == 12
    assert stream_id_ms("garbage") == 0


@pytest.mark.parametrize("cache_size", [0, 3])
def test_the_run_cache_is_bounded_by_its_setting_and_a_small_one_loses_nothing(plain, cache_size):
    """`run_cache_size` bounds the sequencers kept in process (the worker's RSS), whatever the
    number of active runs; runs evicted from it (or never kept) are loaded from Redis again and
    give the same output."""
    settings = plain.model_copy(update={"run_cache_size": cache_size})
    h = Harness(settings)
    shard = 0
    runs = [r for r in (f"bp/cache{cache_size}-{i}" for i in range(200)) if h.layout.shard_of(r) == shard][:10]
    sizes = []

    async def body(client):
        p = BatchProcessor(settings, client)
        for seq in range(4):  # every batch touches every run: more runs than the cache holds
            for run in runs:
                h.add(line(run, seq))
            await process_shard(h, p, shard)
            sizes.append(len(p._cache))
        for run in runs:
            h.add(eof(run, 4))
        await process_shard(h, p, shard)
        sizes.append(len(p._cache))

    run_async(settings, body)
    assert max(sizes) <= cache_size
    assert sizes[0] == cache_size  # it does keep what it may
    for run in runs:
        assert h.events(run) == expected(run, 4)
        assert [r["state"] for r in h.records(run)] == ["started", "ended"]
    assert h.pending(shard) == 0


def test_after_a_conflict_cached_runs_are_checked_so_workers_sharing_runs_stop_conflicting(plain):
    """Two workers taking turns on the same runs: the first stale cache costs a conflict (and a
    recomputation); from then on each checks its cached runs' versions in its state read, so the
    alternation costs no more conflicts, and the output is the one-pass output."""
    h = Harness(plain)
    shard = 0
    runs = [r for r in (f"bp/shared-{i}" for i in range(100)) if h.layout.shard_of(r) == shard][:5]
    conflicts = []

    async def body(client):
        a, b = BatchProcessor(plain, client), BatchProcessor(plain, client)
        for seq in range(6):
            for run in runs:
                h.add(line(run, seq))
            await process_shard(h, a if seq % 2 == 0 else b, shard)
            conflicts.append(a.conflicts + b.conflicts)
        for run in runs:
            h.add(eof(run, 6))
        await process_shard(h, a, shard)
        conflicts.append(a.conflicts + b.conflicts)

    run_async(plain, body)
    # a's cache goes stale once (seq 2), then b's (seq 3): every run conflicts once per worker...
    assert conflicts[:4] == [0, 0, len(runs), 2 * len(runs)]
    assert conflicts[-1] == conflicts[3]  # ...and from then on both check their caches: no more
    for run in runs:
        assert h.events(run) == expected(run, 6)
        assert [r["state"] for r in h.records(run)] == ["started", "ended"]
    assert h.pending(shard) == 0


def test_workers_committing_the_same_runs_at_once_all_commit_and_lose_nothing(plain):
    """Three processors given interleaved thirds of the same runs' entries at the same time (as
    three workers reading one shard): they conflict, back off and retry until each has committed;
    the runs come out as if one worker had processed them, with nothing left pending."""
    h = Harness(plain)
    shard = 0
    runs = [r for r in (f"bp/contended-{i}" for i in range(400)) if h.layout.shard_of(r) == shard][:40]
    n = 9

    async def body(client):
        procs = [BatchProcessor(plain, client) for _ in range(3)]
        for seq in range(n):
            for run in runs:
                h.add(line(run, seq))
        for run in runs:
            h.add(eof(run, n))
        ids, fields = h.read(shard)
        parts = [(ids[i::3], fields[i::3]) for i in range(3)]
        got = await asyncio.gather(*(p.process(shard, i, f) for p, (i, f) in zip(procs, parts, strict=True)))
        return got, sum(p.conflicts for p in procs)

    results, conflicts = run_async(plain, body)
    assert conflicts > 0  # they did get in each other's way
    assert sum(sum(r.outcomes.values()) for r in results) >= len(runs) * (n + 1)
    for run in runs:
        assert h.events(run) == expected(run, n)
        assert [r["state"] for r in h.records(run)] == ["started", "ended"]
    assert h.pending(shard) == 0
    assert not h.dead()


def test_a_broker_outage_during_a_batch_is_sent_again_at_once_and_commits_once(plain):
    """A topology change or lost connection (the read of the states, the commit before it reached
    Redis, the commit whose reply was lost) is retried on the spot, not left for CLAIM_IDLE_MS;
    resending a commit Redis did execute writes nothing twice (its version check refuses it)."""
    h = Harness(plain)
    shard = 0
    runs = [r for r in (f"bp/outage-{i}" for i in range(40)) if h.layout.shard_of(r) == shard][:2]
    for run in runs:
        for seq in range(3):
            h.add(line(run, seq))
        h.add(eof(run, 3))
    injected = [redis.exceptions.ClusterDownError("The cluster is down"),  # reading the states
                redis.ConnectionError("Error 111 connecting to 127.0.0.1:1."),  # commit never sent
                redis.ResponseError("TRYAGAIN Multiple keys request during rehashing of slot"),
                "reply lost"]  # the commit ran, its reply never came

    async def body(client):
        processor = BatchProcessor(plain, client)
        read, commit = processor._read_states, processor.committer.commit

        async def flaky_read(names):
            if injected and isinstance(injected[0], redis.exceptions.ClusterDownError):
                raise injected.pop(0)
            return await read(names)

        async def flaky_commit(c):
            what = injected.pop(0) if injected else None
            if what == "reply lost":
                await commit(c)
                raise redis.ConnectionError("Connection closed by server.")
            if what is not None:
                raise what
            return await commit(c)

        processor._read_states = flaky_read
        processor.committer.commit = flaky_commit
        started = time.monotonic()
        result = await process_shard(h, processor, shard)
        return result, processor.outage_retries, time.monotonic() - started

    result, retries, took = run_async(plain, body)
    assert injected == [] and retries == 4
    assert took < 5  # at once and with a short backoff, not CLAIM_IDLE_MS
    for run in runs:
        assert h.events(run) == expected(run, 3)  # once, though the last commit was sent twice
        assert [r["state"] for r in h.records(run)] == ["started", "ended"]
    assert h.pending(shard) == 0 and h.dead() == []
    assert result.dead == {}


def test_an_outage_that_outlasts_claim_idle_leaves_the_entries_pending(plain):
    settings = plain.model_copy(update={"claim_idle_ms": 300})
    h = Harness(settings)
    run = "bp/outage-long"
    h.add(line(run, 0))
    shard, _ = h.add(eof(run, 1))

    async def body(client):
        processor = BatchProcessor(settings, client)

        async def down(c):
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1.")

        processor.committer.commit = down
        with pytest.raises(redis.ConnectionError):
            await process_shard(h, processor, shard)
        return processor.outage_retries

    assert run_async(settings, body) >= 2
    assert h.pending(shard) == 2 and h.events(run) == [] and h.dead() == []
