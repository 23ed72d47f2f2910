"""A stolen gateway credential cannot be narrowed by Redis ACLs, so its damage is made visible (issue 34 item 3):
a real redis-server with the shipped ACL roles; the gateway's own user empties one shard (`XADD ... MAXLEN 0`)
and blocks another (`XADD` at the maximal id); a worker's housekeeping sees both (metric, one log line each,
a readiness reason for the blocked shard), and a worker-like trim of expired entries is no damage."""

from __future__ import annotations

import asyncio
import logging
import time
from uuid import uuid4

import pytest
import redis
from prometheus_client import generate_latest

from services.broker.acl import ROLE_NAMES, render, user_name
from services.broker.connect import async_client
from services.broker.embedded import start_redis
from services.metrics import Metrics
from services.settings import Settings
from services.worker.damage import AHEAD_LIMIT_MS, DELETED_UNEXPIRED, ID_AHEAD, Seen, judge
from services.worker.housekeeping import Housekeeper
from services.worker.processor import BatchProcessor

ROOT_USER, ROOT_PASSWORD = "test-root", f"root-{uuid4().hex}"
MAX_ID = "18446744073709551615-18446744073709551615"


def test_judge_reads_unexpired_deletions_and_ids_ahead_of_the_clock():
    now, keep = 10_000_000, 1_000_000

    def info(last: int | str, added: int = 5, length: int = 5, deleted: str = "0-0") -> dict:
        return {"last-generated-id": last if isinstance(last, str) else f"{last}-0", "entries-added": added,
                "length": length, "max-deleted-entry-id": deleted}

    assert judge(info(now), now, keep) == []
    assert judge(info(now, deleted=f"{now - keep - 1}-5"), now, keep) == []  # XDEL of an expired entry
    assert judge(info(now, deleted=f"{now - keep}-0"), now, keep) == [DELETED_UNEXPIRED]  # XDEL of a live one
    assert judge(info(now, length=0), now, keep) == [DELETED_UNEXPIRED]  # emptied: its last entry was unexpired
    assert judge(info(now - keep - 1, length=0), now, keep) == []  # trimmed empty by age: what workers do
    before = Seen(5, f"{now - 10}-0")
    assert judge(info(now, added=7, length=1), now, keep, before, still_there=False) == [DELETED_UNEXPIRED]
    assert judge(info(now, added=7, length=7), now, keep, before, still_there=True) == []
    assert judge(info(now, added=2, length=2), now, keep, before, still_there=False) == []  # recreated, not trimmed
    assert judge(info(now, added=7, length=1), now, keep, Seen(5, f"{now - keep - 1}-0"), still_there=False) == []
    assert judge(info(now + AHEAD_LIMIT_MS), now, keep) == []
    assert judge(info(MAX_ID), now, keep) == [ID_AHEAD]
    assert judge({}, now, keep) == []  # nothing to judge


def test_the_gateways_user_empties_and_blocks_shards_and_the_workers_see_both(tmp_path, caplog):
    acl = tmp_path / "users.acl"
    acl.write_text("user default on nopass ~* &* +@all\n")
    server = start_redis(dir=str(tmp_path / "redis"), extra_args=["--aclfile", str(acl)])
    try:
        settings = Settings(redis_url=server.url, namespace=f"dmg{uuid4().hex[:6]}", shards=4)
        passwords = {role: f"pw-{role}-{uuid4().hex[:8]}" for role in ROLE_NAMES}
        acl.write_text(render(settings.layout, passwords) + f"user {ROOT_USER} on >{ROOT_PASSWORD} ~* &* +@all\n")
        with redis.Redis(port=server.port, socket_timeout=10) as c:
            c.execute_command("ACL", "LOAD")
        root = redis.Redis(port=server.port, username=ROOT_USER, password=ROOT_PASSWORD, socket_timeout=10)
        for stream in settings.layout.raw_streams():
            root.xgroup_create(stream, settings.group, id="0", mkstream=True)
        s0, s1, s2, s3 = settings.layout.raw_streams()
        gateway = redis.Redis(port=server.port, username=user_name("gateway", settings.namespace),
                              password=passwords["gateway"], socket_timeout=10)

        def add(stream: str, n: int, **options) -> None:
            for seq in range(n):
                gateway.xadd(stream, {"run": "team-a/r", "seq": str(seq), "kind": "line", "line": "x"}, **options)

        for stream in (s0, s1, s3):
            add(stream, 5)
        # the control: what a worker's trim does (entries older than the retention, below the frontier)
        root.xadd(s2, {"run": "old/r", "seq": "0"}, id="1000-0")
        root.xadd(s2, {"run": "old/r", "seq": "1"}, id="1001-0")
        root.xtrim(s2, minid="1001-0")
        # before any sweep: the gateway's user empties shard 3 (no ACL can forbid MAXLEN)
        add(s3, 1, maxlen=0, approximate=False)
        assert root.xlen(s3) == 0

        worker_settings = Settings(redis_url=server.url, namespace=settings.namespace, shards=settings.shards,
                                   redis_username=user_name("worker", settings.namespace),
                                   redis_password=passwords["worker"])
        metrics = Metrics()
        metrics.shards = settings.shards

        async def body() -> tuple[str, str]:
            client = async_client(worker_settings)
            try:
                keeper = Housekeeper(worker_settings, client, BatchProcessor(worker_settings, client), "w",
                                     metrics=metrics)
                with caplog.at_level(logging.ERROR, logger="goose_ingest.worker"):
                    await keeper.gauge_backlog()  # a sweep's first step: shard 3 is seen emptied
                    # between two sweeps: shard 0 trimmed to nothing, then written again; shard 1 blocked
                    add(s0, 1, maxlen=0, approximate=False)
                    add(s0, 2)
                    gateway.xadd(s1, {"run": "team-a/r", "seq": "5"}, id=MAX_ID)
                    with pytest.raises(redis.ResponseError):
                        add(s1, 1)  # every tap's XADD * now fails
                    await keeper.gauge_backlog()
                    await keeper.check_damage()  # again: said once
                keeper.last_ok = time.monotonic()
                return keeper.readiness().reason, caplog.text
            finally:
                await client.aclose()

        reason, logged = asyncio.run(body())
    finally:
        server.close()
    scraped = generate_latest(metrics.registry).decode()

    def value(shard: int, why: str) -> str:
        line = next(x for x in scraped.splitlines()
                    if x.startswith("goose_ingest_raw_shard_damaged{") and f'shard="{shard}"' in x and f'"{why}"' in x)
        return line.rsplit(" ", 1)[1]

    assert value(0, DELETED_UNEXPIRED) == "1.0" and value(0, ID_AHEAD) == "0.0"
    assert value(1, ID_AHEAD) == "1.0" and value(1, DELETED_UNEXPIRED) == "0.0"
    assert value(2, DELETED_UNEXPIRED) == "0.0" and value(2, ID_AHEAD) == "0.0"  # the worker-like trim
    assert value(3, DELETED_UNEXPIRED) == "1.0"  # still held, though the later sweeps saw nothing new
    assert "raw shard 1" in reason and "ahead of the clock" in reason
    assert logged.count("raw shard 0: entries younger than RAW_RETENTION_HOURS were deleted") == 1
    assert logged.count("raw shard 3: entries younger than RAW_RETENTION_HOURS were deleted") == 1
    assert logged.count("raw shard 1: its last id is far ahead of the clock") == 1
