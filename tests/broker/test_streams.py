"""The consumer skeleton (services/streams) and the dead-letter record (contracts/deadletters.py):
the pure parts exhaustively, the broker parts on a real Redis (an OOM broker, a trim of unread
entries that makes Redis forget the lag)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis as AsyncRedis

from contracts.deadletters import (
    DEAD_LETTER_REASONS,
    MAX_DETAIL_CHARS,
    REASONS_BY_CONSUMER,
    DeadLetter,
)
from services.export.postgres import rows as pg_rows
from services.streams.groups import create_groups
from services.streams.lag import MISSING, counted_lag, group_backlog, read_backlog, read_backlog_sync
from services.streams.names import stable_consumer, unique_consumer
from services.streams.pending import PendingEntry, pending_entries, plan_reclaim
from services.streams.readiness import READY, Readiness, fresh, not_ready

# ------------------------------------------------------------------------------- pending


def test_reclaim_plan_splits_poison_from_entries_to_claim_and_never_takes_back_in_flight_ones() -> None:
    rows = [PendingEntry("1-0", "a", 5000, 1), PendingEntry("2-0", "a", 5000, 5), PendingEntry("3-0", "b", 9000, 6),
            PendingEntry("4-0", "me", 9000, 9)]
    plan = plan_reclaim(rows, max_deliveries=5, in_flight={"4-0"})
    assert [r.entry_id for r in plan.poison] == ["3-0"]  # more than MAX_DELIVERIES, not equal
    assert [r.entry_id for r in plan.claim] == ["1-0", "2-0"]


def test_pending_rows_become_typed_records() -> None:
    raw = [{"message_id": b"7-1", "consumer": b"c", "time_since_delivered": 12, "times_delivered": 3}]
    assert pending_entries(raw) == [PendingEntry("7-1", "c", 12, 3)]
    assert pending_entries(None) == []


# ------------------------------------------------------------------------------ readiness


def test_one_readiness_type_is_falsy_when_not_ready_and_says_why() -> None:
    assert READY and READY == Readiness(True, "")
    down = not_ready("the collector is unavailable")
    assert not down and down.reason == "the collector is unavailable"
    assert fresh(100.0, 110.0, 1.0) and not fresh(100.0, 116.0, 1.0)  # at least 15 s
    assert fresh(100.0, 125.0, 10.0) and not fresh(100.0, 131.0, 10.0)  # else three sweeps


def test_consumer_names_unique_per_process_or_stable_per_host() -> None:
    assert unique_consumer() != unique_consumer()
    assert unique_consumer("otlp").startswith("otlp-")
    assert stable_consumer("postgres") == stable_consumer("postgres")


# ------------------------------------------------------------------------------------ lag


def test_backlog_of_a_missing_group_is_missing_and_a_known_lag_is_redis_s() -> None:
    assert group_backlog([{"name": b"other", "lag": 3, "pending": 1}], "mine") is MISSING
    b = group_backlog([{"name": b"mine", "lag": 3, "pending": 1, "last-delivered-id": b"5-0"}], "mine")
    assert (b.lag, b.pending, b.last_delivered, b.missing) == (3, 1, "5-0", False)
    assert counted_lag(b, 99) == 3
    assert counted_lag(b._replace(lag=None), 7) == 7


def test_an_unknown_lag_is_counted_never_read_as_0_while_entries_wait(redis_url: str) -> None:
    """Entries deleted inside the group's window (XDEL; a group created at an arbitrary id) make
    Redis answer lag nil; the skeleton counts the entries still waiting (before: the sink read 0)."""
    r = redis.Redis.from_url(redis_url)
    stream, group = "test:streams:lag", "g"
    r.delete(stream)
    ids = [r.xadd(stream, {"n": str(i)}) for i in range(10)]
    r.xgroup_create(stream, group, id="0")
    r.xreadgroup(group, "c", {stream: ">"}, count=2)
    r.xack(stream, group, *ids[:2])
    r.xdel(stream, *ids[2:5])  # entries 2..4 deleted unread
    [info] = r.xinfo_groups(stream)
    assert info["lag"] is None  # Redis cannot say
    backlog = read_backlog_sync(r, stream, group)
    assert (backlog.lag, backlog.pending) == (5, 0)  # entries 5..9 still wait
    assert asyncio.run(_read_async(redis_url, stream, group)).lag == 5
    r.xdel(stream, *ids[5:])  # everything unread gone: nothing left to read
    assert r.xinfo_groups(stream)[0]["lag"] is None and read_backlog_sync(r, stream, group).lag == 0
    assert read_backlog_sync(r, "test:streams:no-such-stream", group) is MISSING
    r.delete(stream)


async def _read_async(url: str, stream: str, group: str):
    client = AsyncRedis.from_url(url)
    try:
        return await read_backlog(client, stream, group)
    finally:
        await client.aclose()


# --------------------------------------------------------------------------------- groups


def test_groups_are_created_at_0_after_the_broker_refuses_them_for_oom(private_redis) -> None:
    """A consumer started while Redis is at maxmemory waits (one warning) instead of crashing, and
    its group starts at 0: what was published before is exported."""
    admin = redis.Redis.from_url(private_redis.url)
    admin.xadd("test:streams:a", {"n": "0"})
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    released = threading.Timer(1.5, lambda: admin.config_set("maxmemory", "0"))
    released.start()

    async def create() -> float:
        client = AsyncRedis.from_url(private_redis.url)
        started = time.monotonic()
        try:
            await create_groups(client, ["test:streams:a", "test:streams:b"], "g", retry_max_s=0.2)
        finally:
            await client.aclose()
        return time.monotonic() - started

    try:
        waited = asyncio.run(create())
    finally:
        released.cancel()
        admin.config_set("maxmemory", "0")
    assert waited >= 1.0
    groups = {s: admin.xinfo_groups(s) for s in ("test:streams:a", "test:streams:b")}
    assert [g["last-delivered-id"] for g in groups["test:streams:a"]] == [b"0-0"]
    assert admin.xreadgroup("g", "c", {"test:streams:a": ">"})[0][1][0][1] == {b"n": b"0"}
    assert len(groups["test:streams:b"]) == 1


def test_create_groups_stops_when_asked_while_the_broker_refuses(private_redis) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")

    class Stop(Exception):
        pass

    async def create() -> None:
        client = AsyncRedis.from_url(private_redis.url)
        stopping = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stopping.set)
        try:
            await create_groups(client, ["test:streams:c"], "g", retry_max_s=0.1, stopping=stopping, on_stop=Stop)
        finally:
            await client.aclose()

    try:
        with pytest.raises(Stop):
            asyncio.run(create())
    finally:
        admin.config_set("maxmemory", "0")


# ---------------------------------------------------------------------------- dead letters

NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DEAD_LETTER_REASONS), st.text(max_size=1500), NAMES, NAMES,
       st.one_of(st.none(), NAMES), st.one_of(st.none(), NAMES), st.one_of(st.none(), NAMES),
       st.dictionaries(NAMES.map(str.encode), st.binary(max_size=20), max_size=4), st.one_of(st.none(), st.binary(max_size=40)))
def test_a_dead_letter_round_trips(reason, detail, source, source_id, exporter, group, run, raw, payload) -> None:
    letter = DeadLetter(reason, detail, source, source_id, exporter, group, run, raw, payload,
                        "application/x-protobuf" if payload is not None else None)
    fields = {k: v.encode() if isinstance(v, str) else v for k, v in letter.to_fields().items()}  # as Redis returns
    back = DeadLetter.from_fields(fields)
    assert back == DeadLetter(reason, detail[:MAX_DETAIL_CHARS].encode().decode(), source, source_id, exporter, group,
                              run, raw, payload, letter.content_type)
    assert dict(zip(letter.flat()[::2], letter.flat()[1::2], strict=True)) == letter.to_fields()


def test_every_consumer_s_reasons_are_in_the_one_vocabulary() -> None:
    assert pg_rows.INVALID_ENTRY in REASONS_BY_CONSUMER["postgres"]
    assert pg_rows.REJECTED in REASONS_BY_CONSUMER["postgres"]
    assert set(DEAD_LETTER_REASONS) == {r for rs in REASONS_BY_CONSUMER.values() for r in rs}
    assert len(DEAD_LETTER_REASONS) <= 16  # a metric label: bounded


def test_a_dead_letter_written_to_redis_reads_back(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    stream = "test:streams:deadletter"
    r.delete(stream)
    letter = DeadLetter("max-deliveries", "delivered 6 times", "harness.events", "1-0", exporter="postgres",
                        group="goose-ingest-postgres", raw={"eventId": b"r:0", "data": b"{}"})
    r.xadd(stream, letter.to_fields())
    [(_, fields)] = r.xrange(stream)
    assert DeadLetter.from_fields(fields) == DeadLetter(
        "max-deliveries", "delivered 6 times", "harness.events", "1-0", "postgres", "goose-ingest-postgres",
        None, {b"eventId": b"r:0", b"data": b"{}"})
    r.delete(stream)
