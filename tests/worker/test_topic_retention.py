"""Topic retention never trims what a registered consumer group has not read (issue 20, finding 7),
except past TOPIC_MAX_UNREAD_HOURS, and then it counts what each group lost.

Real redis-server; stream ids set in the past stand for old entries; the worker's Housekeeper
trims as it does every minute, also under the worker's ACL user (XINFO GROUPS, XPENDING, XTRIM).
"""

from __future__ import annotations

import asyncio
import time

import redis
from pydantic import SecretStr

from services.broker.connect import async_client
from services.metrics import Metrics
from services.settings import Settings
from services.worker.housekeeping import Housekeeper
from tests.broker.test_acl import AclBroker, acl_broker  # noqa: F401 (fixture)

HOUR_MS = 3_600_000


def _trim(settings: Settings, stream: str, now_ms: int, metrics: Metrics | None = None) -> dict[str, int]:
    async def go() -> dict[str, int]:
        client = async_client(settings)
        try:
            keeper = Housekeeper(settings, client, processor=None, consumer="t", metrics=metrics)  # type: ignore[arg-type]
            return await keeper.trim_topic(stream, now_ms)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _fill(r: redis.Redis, stream: str, now_ms: int) -> list[str]:
    """3 entries 20 h old, 3 entries 5 h old, 2 entries 30 min old."""
    ids = []
    for age_h, n in ((20, 3), (5, 3), (0.5, 2)):
        for i in range(n):
            ids.append(r.xadd(stream, {"data": "{}"}, id=f"{now_ms - int(age_h * HOUR_MS)}-{i}").decode())
    return ids


def _groups(r: redis.Redis, stream: str) -> None:
    """`fast` read and acknowledged everything, `mid` acknowledged the 20 h ones and still works on
    the first 5 h one, `slow` (a sink that is down) read nothing."""
    for g in ("fast", "mid", "slow"):
        r.xgroup_create(stream, g, id="0")
    fast = r.xreadgroup("fast", "c", {stream: ">"}, count=100)[0][1]
    r.xack(stream, "fast", *[sid for sid, _ in fast])
    mid = r.xreadgroup("mid", "c", {stream: ">"}, count=4)[0][1]
    r.xack(stream, "mid", *[sid for sid, _ in mid[:3]])


def test_unread_entries_are_kept_past_the_retention_and_trimmed_and_counted_past_the_cap(settings):
    settings = settings.model_copy(update={"topic_retention_hours": 1.0, "topic_max_unread_hours": 10.0})
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.events_partition(0)
    now_ms = int(time.time() * 1000)
    ids = _fill(r, stream, now_ms)
    _groups(r, stream)
    metrics = Metrics()
    # `slow` has read nothing: everything past the retention stays until the cap; past the cap
    # (the 20 h entries) it is trimmed, charged to `slow` only (`mid` and `fast` had read them)
    assert _trim(settings, stream, now_ms, metrics) == {"slow": 3}
    assert [sid.decode() for sid, _ in r.xrange(stream)] == ids[3:]
    sample = metrics.registry.get_sample_value
    assert sample("goose_ingest_topic_trimmed_unread_total", {"group": "slow"}) == 3
    assert sample("goose_ingest_topic_trimmed_unread_total", {"group": "mid"}) == 0  # series exist from 0
    assert sample("goose_ingest_topic_trimmed_unread_total", {"group": "fast"}) == 0
    # nothing more is past the cap: a second sweep trims and counts nothing
    assert _trim(settings, stream, now_ms, metrics) == {}
    assert len(r.xrange(stream)) == 5
    # the operator drops the dead sink's group: `mid`'s pending entry (5 h) is now the frontier
    r.xgroup_destroy(stream, "slow")
    assert _trim(settings, stream, now_ms, metrics) == {}
    assert [sid.decode() for sid, _ in r.xrange(stream)][0] <= ids[3]  # mid's pending entry is kept
    # six hours later the 5 h entries are past the cap too: `mid` loses the three it never
    # acknowledged (its pending one and the two after it), `fast` nothing
    assert _trim(settings, stream, now_ms + 6 * HOUR_MS, metrics) == {"mid": 3}
    assert sample("goose_ingest_topic_trimmed_unread_total", {"group": "mid"}) == 3
    assert [sid.decode() for sid, _ in r.xrange(stream)] == ids[6:]


def test_a_topic_without_groups_is_trimmed_by_age_and_every_group_read_part_too(settings):
    settings = settings.model_copy(update={"topic_retention_hours": 1.0, "topic_max_unread_hours": 10.0})
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.runs_partition(0)
    now_ms = int(time.time() * 1000)
    for i in range(300):  # enough for an approximate trim to delete whole nodes
        r.xadd(stream, {"data": "{}"}, id=f"{now_ms - 5 * HOUR_MS}-{i}")
    r.xadd(stream, {"data": "{}"}, id=f"{now_ms}-0")
    assert _trim(settings, stream, now_ms) == {}
    assert r.xlen(stream) < 301  # nobody registered: the age trim as before
    assert _trim(settings, settings.layout.runs_partition(1) + ".missing", now_ms) == {}  # no stream: nothing


def test_the_worker_user_may_trim_topics_that_exporters_registered_on(acl_broker: AclBroker):  # noqa: F811
    b = acl_broker
    settings = b.settings.model_copy(update={
        "topic_retention_hours": 1.0, "topic_max_unread_hours": 10.0,
        "redis_username": b.user("worker"), "redis_password": SecretStr(b.passwords["worker"])})
    admin = b.client("admin")
    stream = settings.layout.events_partition(0)
    now_ms = int(time.time() * 1000)
    _fill(admin, stream, now_ms)
    b.client("otlp-exporter").xgroup_create(stream, "goose-ingest-otlp", id="0")
    assert _trim(settings, stream, now_ms) == {"goose-ingest-otlp": 3}
    assert b.denials() == []
