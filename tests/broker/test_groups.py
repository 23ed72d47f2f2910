"""guard_missing_group: a lost consumer group is recreated at 0 instead of ending the subscriber."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from services.streams.faststream_adapter import guard_missing_group


class _Sub:
    """Stands in for FastStream's stream subscriber: its read goes to the real Redis."""

    def __init__(self, client: aioredis.Redis, stream: str, group: str) -> None:
        self.client, self.stream, self.group = client, stream, group

    async def _xreadgroup(self, **_kwargs: object) -> object:
        return await self.client.xreadgroup(self.group, "c1", {self.stream: ">"}, count=10)


def test_nogroup_recreates_the_group_at_0_and_reads_on(settings):
    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url)
        stream, group = settings.layout.events_partitions()[0], "g-test"
        sub = _Sub(client, stream, group)
        guard_missing_group(sub, stream, group, lambda: client)
        await client.xadd(stream, {"a": "1"})  # the stream exists, the group does not (a flushed Redis)
        assert await sub._xreadgroup() == ()  # NOGROUP: recreated instead of raised
        got = await sub._xreadgroup()  # created at 0: the entry written before is delivered
        assert got and got[0][1][0][1] == {b"a": b"1"}
        await client.aclose()

    asyncio.run(scenario())


def test_other_errors_and_an_unstarted_client_still_raise(settings):
    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url)
        stream, group = settings.layout.events_partitions()[0], "g-test"
        sub = _Sub(client, stream, group)
        guard_missing_group(sub, stream, group, lambda: None)  # not started yet: nothing to recreate with
        await client.xadd(stream, {"a": "1"})
        with pytest.raises(ResponseError, match="NOGROUP"):
            await sub._xreadgroup()
        await client.aclose()

    asyncio.run(scenario())
