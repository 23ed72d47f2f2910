"""Consumer groups of the raw shard streams."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from services.settings import Settings


async def ensure_groups(client: Any, settings: Settings) -> None:
    """Create the consumer group of every shard at id 0 (FastStream would start at `$`)."""
    for stream in settings.raw_streams():
        try:
            await client.xgroup_create(stream, settings.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
