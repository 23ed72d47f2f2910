"""The one reclaim (services/streams/pending.py, issue 33 item 1): its broker calls are written once,
as steps, and run by a sync driver (the thread consumers' `GroupReader.sweep`) and an async one (the
worker's housekeeping, `export otlp`). Against a real redis-server: both drivers give the same
result on the same pending list; poison comes with its fields and is not claimed; an entry trimmed
while pending is acknowledged; an entry its consumer read again in between stays its own; a
hand-over under a lease counts no delivery. And no consumer claims or lists pending entries in a
second place."""

from __future__ import annotations

import ast
import asyncio

import redis
import redis.asyncio as aioredis

from services.settings import Settings
from services.streams.pending import (
    Reclaimed,
    dead_consumer_rows,
    drive,
    drive_async,
    hand_over,
    pending_page,
    reclaim,
)
from tests.support.pipeline import REPO

GROUP = "g"
MAX = 5


def _stream(settings: Settings, name: str = "s") -> str:
    return f"{settings.namespace}:{name}"


def _deliveries(r: redis.Redis, stream: str) -> dict[str, tuple[str, int]]:
    return {row["message_id"].decode(): (row["consumer"].decode(), row["times_delivered"])
            for row in r.xpending_range(stream, GROUP, min="-", max="+", count=1000)}


def _group_with(settings: Settings, n: int) -> tuple[redis.Redis, str, list[str]]:
    """A client, a stream of `n` entries and the group at 0 on it, nothing read yet."""
    r = redis.Redis.from_url(settings.redis_url or "")
    stream = _stream(settings)
    ids = [r.xadd(stream, {"n": str(i)}).decode() for i in range(n)]
    r.xgroup_create(stream, GROUP, id="0")
    return r, stream, ids


def _setup(r: redis.Redis, stream: str) -> list[str]:
    """Five entries read by `dead`; the second delivered MAX + 1 times (poison), the fourth trimmed away."""
    ids = [r.xadd(stream, {"n": str(i)}).decode() for i in range(5)]
    r.xgroup_create(stream, GROUP, id="0")
    r.xreadgroup(GROUP, "dead", {stream: ">"}, count=10)
    for _ in range(MAX):
        r.xclaim(stream, GROUP, "dead", 0, [ids[1]])
    r.xdel(stream, ids[3])
    return ids


def _summary(found: Reclaimed) -> tuple[list[str], list[tuple[str, bytes, int]], list[str]]:
    return ([e.entry_id for e in found.claimed],
            [(p.entry.entry_id, p.entry.fields[b"n"], p.row.deliveries) for p in found.poison], sorted(found.gone))


def test_the_sync_and_the_async_driver_reclaim_alike(settings: Settings) -> None:
    r = redis.Redis.from_url(settings.redis_url or "")
    one, two = _stream(settings, "one"), _stream(settings, "two")
    ids_one, ids_two = _setup(r, one), _setup(r, two)

    rows = drive(r, pending_page(one, GROUP, 100, idle_ms=0))
    sync = drive(r, reclaim(one, GROUP, "me", rows, idle_ms=0, max_deliveries=MAX))

    async def run_async() -> Reclaimed:
        client = aioredis.Redis.from_url(settings.redis_url or "")
        try:
            calls: list[str] = []

            async def around(call):  # the worker's outage retry sits here
                calls.append("call")
                return await call()

            page = await drive_async(client, pending_page(two, GROUP, 100, idle_ms=0), around)
            found = await drive_async(client, reclaim(two, GROUP, "me", page, idle_ms=0, max_deliveries=MAX), around)
            assert len(calls) == 3  # XPENDING, XRANGE (the poison's fields), XCLAIM: each through `around`
            return found
        finally:
            await client.aclose()

    asyn = asyncio.run(run_async())
    for ids, found in ((ids_one, sync), (ids_two, asyn)):
        claimed, poison, gone = _summary(found)
        # Redis 7 drops a trimmed entry from the pending list when XCLAIM names it: absent, not claimed
        assert claimed == [ids[0], ids[2], ids[4]]
        assert poison == [(ids[1], b"1", MAX + 1)]
        assert ids[3] not in claimed
    assert _summary(sync)[0:2] == ([ids_one[i] for i in (0, 2, 4)], [(ids_one[1], b"1", MAX + 1)])
    for stream, ids in ((one, ids_one), (two, ids_two)):
        left = _deliveries(r, stream)
        assert left[ids[1]] == ("dead", MAX + 1)  # poison is not claimed: the caller dead-letters it
        assert {left[i][0] for i in (ids[0], ids[2], ids[4])} == {"me"}
        assert ids[3] not in left


def test_a_poison_entry_trimmed_while_pending_is_acknowledged_as_gone(settings: Settings) -> None:
    r = redis.Redis.from_url(settings.redis_url or "")
    stream = _stream(settings)
    ids = _setup(r, stream)
    r.xdel(stream, ids[1])  # the poison one
    found = drive(r, reclaim(stream, GROUP, "me", drive(r, pending_page(stream, GROUP, 100)), idle_ms=0,
                             max_deliveries=MAX))
    assert found.poison == [] and ids[1] in found.gone
    assert ids[1] not in _deliveries(r, stream)


def test_an_entry_its_consumer_read_again_in_between_stays_its_own(settings: Settings) -> None:
    """Between XPENDING and XCLAIM the live consumer touched the entry (its idle time reset): the
    reclaim neither takes it nor acknowledges it (an earlier `export otlp` acknowledged it as gone)."""
    r, stream, ids = _group_with(settings, 2)
    r.xreadgroup(GROUP, "slow", {stream: ">"}, count=10)
    r.xclaim(stream, GROUP, "slow", 0, ids, idle=60_000, justid=True)  # read a minute ago
    rows = drive(r, pending_page(stream, GROUP, 100, idle_ms=30_000))
    assert [row.entry_id for row in rows] == ids
    r.xclaim(stream, GROUP, "slow", 0, [ids[0]], justid=True)  # its heartbeat: idle 0 again
    found = drive(r, reclaim(stream, GROUP, "me", rows, idle_ms=30_000, max_deliveries=MAX))
    assert [e.entry_id for e in found.claimed] == [ids[1]] and found.gone == []
    assert _deliveries(r, stream)[ids[0]][0] == "slow"


def test_pages_follow_each_other_and_in_flight_entries_are_never_taken(settings: Settings) -> None:
    r, stream, ids = _group_with(settings, 7)
    r.xreadgroup(GROUP, "dead", {stream: ">"}, count=10)
    first = drive(r, pending_page(stream, GROUP, 3))
    second = drive(r, pending_page(stream, GROUP, 3, after=first[-1].entry_id))
    third = drive(r, pending_page(stream, GROUP, 3, after=second[-1].entry_id))
    assert [row.entry_id for row in first + second + third] == ids
    found = drive(r, reclaim(stream, GROUP, "me", first, idle_ms=0, max_deliveries=MAX, in_flight={ids[1]}))
    assert [e.entry_id for e in found.claimed] == [ids[0], ids[2]]


def test_a_hand_over_takes_all_of_one_consumer_without_counting_a_delivery(settings: Settings) -> None:
    r, stream, ids = _group_with(settings, 4)
    r.xreadgroup(GROUP, "old", {stream: ">"}, count=3)
    r.xreadgroup(GROUP, "other", {stream: ">"}, count=1)
    assert drive(r, dead_consumer_rows(stream, GROUP, "me", 60_000)) == []  # nobody idle that long
    assert [row.entry_id for row in drive(r, dead_consumer_rows(stream, GROUP, "me", 0))] == ids[:3]
    assert drive(r, hand_over(stream, GROUP, "me", "old", 3)) == 3
    assert _deliveries(r, stream) == {**{i: ("me", 1) for i in ids[:3]}, ids[3]: ("other", 1)}


def _calls(source: str, names: set[str]) -> list[tuple[int, str, bool]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
            justid = any(k.arg == "justid" for k in node.keywords)
            out.append((node.lineno, node.func.attr, justid))
    return out


def test_no_consumer_lists_or_claims_pending_entries_outside_the_one_reclaim() -> None:
    """XAUTOCLAIM, XPENDING's range form and XCLAIM of another's entries live in pending.py only. A
    JUSTID XCLAIM of entries a consumer already holds (`export otlp`'s heartbeat, keeping its claim
    fresh while the collector is slow) is not a reclaim and is allowed."""
    offenders = []
    for path in sorted((REPO / "services").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "services/streams/pending.py":
            continue
        for line, name, justid in _calls(path.read_text(), {"xautoclaim", "xpending_range", "xclaim"}):
            if not (name == "xclaim" and justid):
                offenders.append(f"{rel}:{line} {name}")
    assert offenders == []
    # the check sees what it looks for
    assert _calls("x = 1\n\nc.xclaim(s, g, c, 0, ids)\n", {"xclaim"}) == [(3, "xclaim", False)]
