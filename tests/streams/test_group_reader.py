"""The consumer skeleton's group reader (services/streams/reader.py) against a real redis-server:
own pending entries first after a restart, the sweep (a dead consumer's idle entries claimed, this
process's own never), poison dead-lettered into the consumer's own stream together with its XACK (one script: nothing
acknowledged when the dead letter cannot be written),
an acknowledgement refused at maxmemory retried in place without costing a delivery, a lost group
recreated, entries trimmed while pending acknowledged. Default MAX_DELIVERIES (Settings) throughout;
the claim idle time is short so that a test does not wait 30 s for what it checks."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.exceptions import ResponseError

from contracts.deadletters import MAX_DELIVERIES, DeadLetter
from services.backoff import Backoff
from services.settings import Settings
from services.streams.reader import GroupReader, StreamEntry, by_stream, is_refusal

GROUP = "g"
IDLE_MS = 100


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url or "")


def _streams(settings: Settings) -> list[list[str]]:
    """Two shards of one stream each, under the test's namespace."""
    return [[f"{settings.namespace}:s0"], [f"{settings.namespace}:s1"]]


def _dead_stream(settings: Settings):
    return lambda shard: f"{settings.namespace}:dead.{shard}"


def _reader(settings: Settings, client: redis.Redis, consumer: str, dead: bool = True) -> GroupReader:
    return GroupReader(client, _streams(settings), GROUP, consumer, max_deliveries=settings.max_deliveries,
                       claim_idle_ms=IDLE_MS, deadletter_stream=_dead_stream(settings) if dead else None,
                       exporter="test")


def _add(r: redis.Redis, stream: str, n: int) -> list[str]:
    return [r.xadd(stream, {"n": str(i), "body": f"entry {i}"}).decode() for i in range(n)]


def _fresh(reader: GroupReader, *streams: str) -> None:
    """A consumer with nothing pending: its first read (own pending entries) finds none and moves on."""
    got = reader.read(list(streams), count=1)
    assert got.entries == [] and got.caught_up == list(streams)


def _pending(r: redis.Redis, stream: str) -> dict[str, tuple[str, int]]:
    """{id: (consumer, times delivered)} of the group's pending entries."""
    return {row["message_id"].decode(): (row["consumer"].decode(), row["times_delivered"])
            for row in r.xpending_range(stream, GROUP, min="-", max="+", count=1000)}


def _deliver(r: redis.Redis, stream: str, consumer: str, entry_id: str, times: int) -> None:
    """Make `entry_id` pending for `consumer`, delivered `times` times (each XCLAIM is one)."""
    r.xreadgroup(GROUP, consumer, {stream: ">"}, count=1)
    for _ in range(times - 1):
        r.xclaim(stream, GROUP, consumer, 0, [entry_id])


def test_own_pending_entries_come_first_after_a_restart_page_by_page(settings):
    r = _client(settings)
    [s0], _ = _streams(settings)
    ids = _add(r, s0, 5)
    first = _reader(settings, r, "stable")
    _fresh(first, s0)
    got = first.read([s0], count=3)
    assert [e.entry_id for e in got.entries] == ids[:3] and got.caught_up == []
    # A restart under the same name: its predecessor's three unacknowledged entries first, two per
    # page, none read twice, then the two new ones.
    again = _reader(settings, r, "stable")
    assert not again.reading_new(s0) and again.catching_up
    page1 = again.read([s0], count=2)
    page2 = again.read([s0], count=2)
    assert [e.entry_id for e in page1.entries] == ids[:2] and [e.entry_id for e in page2.entries] == [ids[2]]
    assert page1.entries[0] == StreamEntry(s0, ids[0], {b"n": b"0", b"body": b"entry 0"})
    end = again.read([s0], count=2)
    assert end.entries == [] and end.caught_up == [s0] and again.reading_new(s0)
    new = again.read([s0], count=10)
    assert [e.entry_id for e in new.entries] == ids[3:] and new.caught_up == []
    again.ack(by_stream(page1.entries + page2.entries + new.entries))
    assert _pending(r, s0) == {}
    assert again.held(s0) == set()


def test_the_sweep_claims_a_dead_consumers_idle_entries_and_never_its_own(settings):
    r = _client(settings)
    [s0], [s1] = _streams(settings)
    live = _reader(settings, r, "live")
    live.ensure_groups()
    dead_ids = _add(r, s0, 2)
    r.xreadgroup(GROUP, "dead", {s0: ">"}, count=2)  # read, then the consumer died
    own = _add(r, s1, 1)
    _fresh(live, s1)
    assert [e.entry_id for e in live.read([s1], count=10).entries] == own  # held: being worked on
    assert live.sweep(count=100).claimed == []  # not idle long enough yet
    time.sleep(IDLE_MS / 1000 * 2)
    swept = live.sweep(count=100)
    assert [(e.stream, e.entry_id) for e in swept.claimed] == [(s0, i) for i in dead_ids]
    assert swept.poison == [] and swept.backlog[s0].pending == 2 and swept.backlog[s1].pending == 1
    assert _pending(r, s0) == {i: ("live", 2) for i in dead_ids}
    time.sleep(IDLE_MS / 1000 * 2)
    assert live.sweep(count=100).claimed == []  # now its own, held: never taken back
    assert _pending(r, s0) == {i: ("live", 2) for i in dead_ids} and _pending(r, s1) == {own[0]: ("live", 1)}
    live.ack(by_stream(swept.claimed))
    assert _pending(r, s0) == {} and live.held(s0) == set()


def test_whole_consumer_sweep_claims_all_of_one_dead_consumer_or_nothing(settings):
    """`whole_consumer` (the archive's sweep): a consumer with one entry read within CLAIM_IDLE_MS
    keeps all of them; of two dead consumers, only the one whose oldest entry is oldest is claimed
    per sweep, all its entries at once; `streams` limits where it claims."""
    r = _client(settings)
    [s0], [s1] = _streams(settings)
    live = _reader(settings, r, "live", dead=False)
    live.ensure_groups()
    older = _add(r, s0, 3)
    r.xreadgroup(GROUP, "older", {s0: ">"}, count=3)
    newer = _add(r, s0, 2)
    r.xreadgroup(GROUP, "newer", {s0: ">"}, count=2)
    time.sleep(IDLE_MS / 1000 * 2)
    r.xclaim(s0, GROUP, "older", 0, [older[2]])  # one entry of `older` just delivered again: not all idle
    assert live.sweep(count=100, streams=[s1], whole_consumer=True).claimed == []  # not on s0
    swept = live.sweep(count=1, whole_consumer=True)
    # `older` is not all idle; `newer` is: all of its entries, whatever the count
    assert [e.entry_id for e in swept.claimed] == newer
    assert {i: c for i, (c, _) in _pending(r, s0).items()} == {**dict.fromkeys(older, "older"), **dict.fromkeys(newer, "live")}
    time.sleep(IDLE_MS / 1000 * 2)
    swept = live.sweep(count=1, whole_consumer=True)
    assert [e.entry_id for e in swept.claimed] == older
    assert {c for c, _ in _pending(r, s0).values()} == {"live"}
    live.reread_own(s0)  # the caller dropped what it had read: its own entries again, in id order
    assert not live.reading_new(s0)
    assert [e.entry_id for e in live.read([s0], count=100).entries] == older + newer
    assert live.read([s0], count=100).caught_up == [s0]


def test_whole_consumer_sweep_picks_the_consumer_with_the_oldest_entry(settings):
    r = _client(settings)
    [s0], _ = _streams(settings)
    live = _reader(settings, r, "live", dead=False)
    live.ensure_groups()
    first = _add(r, s0, 2)
    r.xreadgroup(GROUP, "b-first", {s0: ">"}, count=2)
    second = _add(r, s0, 2)
    r.xreadgroup(GROUP, "a-second", {s0: ">"}, count=2)
    time.sleep(IDLE_MS / 1000 * 2)
    assert [e.entry_id for e in live.sweep(count=100, whole_consumer=True).claimed] == first
    time.sleep(IDLE_MS / 1000 * 2)
    assert [e.entry_id for e in live.sweep(count=100, whole_consumer=True).claimed] == second


def test_a_poison_entry_is_dead_lettered_in_the_consumers_own_stream_with_its_ack(settings):
    r = _client(settings)
    [s0], _ = _streams(settings)
    reader = _reader(settings, r, "live")
    reader.ensure_groups()
    poison, good = _add(r, s0, 2)
    _deliver(r, s0, "dead", poison, settings.max_deliveries + 1)
    time.sleep(IDLE_MS / 1000 * 2)
    swept = reader.sweep(count=100)
    assert [e.entry_id for e in swept.poison] == [poison] and swept.claimed == []
    letters = r.xrange(_dead_stream(settings)(0))
    assert len(letters) == 1 and r.xlen(_dead_stream(settings)(1)) == 0
    letter = DeadLetter.from_fields(letters[0][1])
    assert (letter.reason, letter.source, letter.source_id) == (MAX_DELIVERIES, s0, poison)
    assert letter.detail == f"delivered {settings.max_deliveries + 1} times"
    assert (letter.exporter, letter.group, dict(letter.raw)) == ("test", GROUP, {b"n": b"0", b"body": b"entry 0"})
    assert _pending(r, s0) == {}  # acknowledged with it
    _fresh(reader, s0)
    assert [e.entry_id for e in reader.read([s0], count=10).entries] == [good]  # the rest is delivered


def test_own_pending_poison_is_dead_lettered_at_start(settings):
    """A stable name re-reads its pending entries on every restart: the one that killed each of them
    is dead-lettered at the first read instead of being read again."""
    r = _client(settings)
    [s0], _ = _streams(settings)
    _reader(settings, r, "stable").ensure_groups()
    poison, good = _add(r, s0, 2)
    _deliver(r, s0, "stable", poison, settings.max_deliveries + 1)
    reader = _reader(settings, r, "stable")
    got = reader.read([s0], count=10)
    assert [e.entry_id for e in got.dead_lettered] == [poison] and got.entries == []
    assert DeadLetter.from_fields(r.xrange(_dead_stream(settings)(0))[0][1]).reason == MAX_DELIVERIES
    assert [e.entry_id for e in reader.read([s0], count=10).entries] == [good]


def test_without_a_dead_letter_stream_poison_is_handed_to_the_caller_unacknowledged(settings):
    r = _client(settings)
    [s0], _ = _streams(settings)
    reader = _reader(settings, r, "live", dead=False)
    reader.ensure_groups()
    [poison] = _add(r, s0, 1)
    _deliver(r, s0, "dead", poison, settings.max_deliveries + 1)
    time.sleep(IDLE_MS / 1000 * 2)
    swept = reader.sweep(count=100)
    assert [e.entry_id for e in swept.poison] == [poison] and swept.poison[0].fields[b"n"] == b"0"
    assert poison in _pending(r, s0) and reader.held(s0) == {poison}  # the caller decides; not swept again
    with pytest.raises(ValueError):
        reader.ack(by_stream(swept.poison), [reader.dead_letter(swept.poison[0], MAX_DELIVERIES, "x")])
    assert poison in _pending(r, s0)


def test_an_acknowledgement_refused_at_maxmemory_is_retried_in_place_and_costs_no_delivery(private_redis, tmp_path):
    """Redis at maxmemory (noeviction) refuses the dead letter's XADD, so the script with the XACK
    acknowledges nothing. The reader retries it in place with the entries held: its sweeps meanwhile, far
    past CLAIM_IDLE_MS x MAX_DELIVERIES, never claim them back, the delivery count stays 1, and once
    memory is freed the dead letter is written once and everything acknowledged."""
    settings = Settings(redis_url=private_redis.url, namespace="oom", shards=2, spool_dir=str(tmp_path / "spool"))
    r = _client(settings)
    [s0], _ = _streams(settings)
    reader = _reader(settings, r, "live")
    ids = _add(r, s0, 3)
    _fresh(reader, s0)
    got = reader.read([s0], count=10)
    bad = got.entries[1]
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", "1")
    refusals: list[BaseException] = []
    done: list[bool] = []
    stopping = threading.Event()
    acker = threading.Thread(target=lambda: done.append(reader.ack_in_place(
        by_stream(got.entries), [reader.dead_letter(bad, "postgres-rejected", "refused by the target")], stopping,
        lambda exc, _backoff: refusals.append(exc), Backoff(0.05, 0.2))))
    acker.start()
    try:
        deadline = time.monotonic() + IDLE_MS / 1000 * (settings.max_deliveries + 2) * 3
        while time.monotonic() < deadline:
            assert reader.sweep(count=100).claimed == []
            time.sleep(IDLE_MS / 1000)
        assert refusals and all(is_refusal(exc) for exc in refusals) and not done
        assert _pending(r, s0) == {i: ("live", 1) for i in ids}  # no delivery counted for the outage
        assert r.xlen(_dead_stream(settings)(0)) == 0
    finally:
        r.config_set("maxmemory", "0")
        acker.join(timeout=30)
    assert done == [True]
    assert _pending(r, s0) == {} and reader.held(s0) == set()
    [(_, fields)] = r.xrange(_dead_stream(settings)(0))
    assert DeadLetter.from_fields(fields).source_id == bad.entry_id


def test_ack_in_place_gives_up_when_stopping_and_raises_what_is_not_a_refusal(private_redis, tmp_path):
    settings = Settings(redis_url=private_redis.url, namespace="stop", shards=2, spool_dir=str(tmp_path / "spool"))
    r = _client(settings)
    [s0], _ = _streams(settings)
    reader = _reader(settings, r, "live")
    _add(r, s0, 1)
    _fresh(reader, s0)
    [entry] = reader.read([s0], count=10).entries
    letter = reader.dead_letter(entry, "postgres-rejected", "refused")
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", "1")
    stopping = threading.Event()
    stopping.set()
    try:
        assert reader.ack_in_place(by_stream([entry]), [letter], stopping, lambda *_: None, Backoff(0.05, 0.1)) is False
        assert _pending(r, s0) == {entry.entry_id: ("live", 1)} and reader.held(s0) == {entry.entry_id}
    finally:
        r.config_set("maxmemory", "0")
    r.set(_dead_stream(settings)(0), "not a stream")  # WRONGTYPE: the request itself is wrong
    with pytest.raises(ResponseError) as exc:
        reader.ack_in_place(by_stream([entry]), [letter], threading.Event(), lambda *_: None, Backoff(0.05, 0.1))
    assert not is_refusal(exc.value)  # raised to the caller at once, not retried
    # ... and nothing acknowledged: a MULTI would have run the XACK after its XADD failed, leaving
    # the entry acknowledged without its dead letter
    assert "WRONGTYPE" in str(exc.value) and _dead_stream(settings)(0) in str(exc.value)
    assert _pending(r, s0) == {entry.entry_id: ("live", 1)}
    r.delete(_dead_stream(settings)(0))
    reader.ack_in_place(by_stream([entry]), [letter], threading.Event(), lambda *_: None, Backoff(0.05, 0.1))
    assert _pending(r, s0) == {} and r.xlen(_dead_stream(settings)(0)) == 1


def test_a_lost_group_is_recreated_at_0_after_reset(settings):
    r = _client(settings)
    [s0], _ = _streams(settings)
    reader = _reader(settings, r, "live")
    ids = _add(r, s0, 2)
    _fresh(reader, s0)
    assert len(reader.read([s0], count=10).entries) == 2
    r.xgroup_destroy(s0, GROUP)  # as a Redis restarted without persistence
    with pytest.raises(ResponseError, match="NOGROUP"):
        reader.read([s0], count=10)
    reader.reset(forget_held=True)
    assert reader.held(s0) == set()
    got = []
    for _ in range(3):  # own pending (none, in a new group), then everything again from 0
        got += reader.read([s0], count=10).entries
    assert [e.entry_id for e in got] == ids


def test_entries_trimmed_while_pending_are_acknowledged_and_reported(settings):
    r = _client(settings)
    [s0], _ = _streams(settings)
    ids = _add(r, s0, 3)
    first = _reader(settings, r, "stable")
    _fresh(first, s0)
    assert len(first.read([s0], count=10).entries) == 3
    r.xdel(s0, ids[1])
    again = _reader(settings, r, "stable")
    got = again.read([s0], count=10)
    assert [e.entry_id for e in got.entries] == [ids[0], ids[2]]
    assert got.trimmed == [StreamEntry(s0, ids[1], {})]
    assert set(_pending(r, s0)) == {ids[0], ids[2]}


def test_what_counts_as_a_refusal():
    from redis.exceptions import ConnectionError as RedisConnectionError

    assert is_refusal(RedisConnectionError("gone")) and is_refusal(ResponseError("OOM command not allowed"))
    assert is_refusal(ResponseError("EXECABORT Transaction discarded")) and is_refusal(ResponseError("LOADING"))
    assert not is_refusal(ResponseError("WRONGTYPE Operation against a key")) and not is_refusal(ValueError("x"))


def test_dead_letters_and_their_acks_on_a_cluster_stay_in_the_shards_slot(redis_cluster, cluster_settings):
    """The export postgres layout on a real cluster: a shard's events and runs partitions and its
    dead-letter partition share a hash slot, so the one script that writes a dead letter and
    acknowledges its entries runs there (a cross-slot call would be refused by the cluster)."""
    from services.broker.connect import sync_client

    layout = cluster_settings.layout
    client = sync_client(cluster_settings)
    shards = [[e, r] for e, r in zip(layout.events_partitions(), layout.runs_partitions(), strict=True)]
    reader = GroupReader(client, shards, GROUP, "live", max_deliveries=cluster_settings.max_deliveries,
                         claim_idle_ms=IDLE_MS, deadletter_stream=lambda shard: layout.export_deadletter_partition("postgres", shard),
                         exporter="postgres")
    reader.ensure_groups()
    for shard in (0, len(shards) - 1):
        events, runs = shards[shard]
        _fresh(reader, events, runs)
        e_id = client.xadd(events, {"data": "e"}).decode()
        r_id = client.xadd(runs, {"data": "r"}).decode()
        got = reader.read([events, runs], count=10)
        assert {e.entry_id for e in got.entries} == {e_id, r_id}
        letter = reader.dead_letter(got.entries[0], "postgres-rejected", "refused by the target")
        reader.ack(by_stream(got.entries), [letter])
        assert client.xpending(events, GROUP)["pending"] == 0 and client.xpending(runs, GROUP)["pending"] == 0
        [(_, fields)] = client.xrange(layout.export_deadletter_partition("postgres", shard))
        assert DeadLetter.from_fields(fields).source_id == got.entries[0].entry_id


def test_the_reader_trims_its_dead_letters_by_age_in_the_step_that_writes_them(settings):
    """DEADLETTER_RETENTION_HOURS (the one retention rule, services/streams/deadletter.py): the sink's
    dead-letter stream no longer grows until an operator trims it."""
    r = _client(settings)
    [s0], _ = _streams(settings)
    dead = _dead_stream(settings)(0)
    old_ms = int((time.time() - 3 * 3600) * 1000)
    for i in range(250):  # three hours old, past a retention of one (whole stream nodes: 100 entries each)
        r.xadd(dead, {"reason": "old"}, id=f"{old_ms}-{i}")
    reader = GroupReader(r, _streams(settings), GROUP, "live", max_deliveries=settings.max_deliveries,
                         claim_idle_ms=IDLE_MS, deadletter_stream=_dead_stream(settings), exporter="test",
                         deadletter_retention_hours=1.0)
    _add(r, s0, 1)
    _fresh(reader, s0)
    [entry] = reader.read([s0], count=10).entries
    reader.ack(by_stream([entry]), [reader.dead_letter(entry, "postgres-rejected", "refused")])
    left = r.xrange(dead)
    assert len(left) < 250 and left[-1][1][b"reason"] == b"postgres-rejected"  # old nodes gone, the new letter kept
    assert left[-1][1][b"raw.body"] == b"entry 0" and _pending(r, s0) == {}
