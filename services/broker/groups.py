"""Consumer groups of the raw shard streams."""

from __future__ import annotations

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
