"""Consumer groups: created at id 0, and recreated when Redis loses them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError

from services.settings import Settings


async def create_group(client: Any, stream: str, group: str) -> None:
    """Create `group` on `stream` at id 0 (FastStream would start at `$`); an existing one is kept."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def ensure_groups(client: Any, settings: Settings) -> None:
    """Create the consumer group of every raw shard at id 0."""
    for stream in settings.layout.raw_streams():
        await create_group(client, stream, settings.group)


def guard_missing_group(sub: Any, stream: str, group: str, client: Callable[[], Any]) -> None:
    """Wrap a FastStream stream subscriber's XREADGROUP so that NOGROUP (Redis restarted empty or
    was flushed) recreates the group at 0 instead of stopping the subscriber, which FastStream 0.7.8
    treats as terminal. FastStream has no hook for this; the wrapped method is its read call.
    `client()` gives the connection to recreate it with (None until started)."""
    read: Callable[..., Awaitable[Any]] = sub._xreadgroup

    async def guarded(**kwargs: Any) -> Any:
        try:
            return await read(**kwargs)
        except ResponseError as exc:
            conn = client()
            if "NOGROUP" not in str(exc) or conn is None:
                raise
            logging.getLogger("goose_ingest").warning(
                "consumer group %s missing on %s (Redis restarted empty or flushed): recreating it at 0", group, stream
            )
            await create_group(conn, stream, group)
            return ()

    sub._xreadgroup = guarded
