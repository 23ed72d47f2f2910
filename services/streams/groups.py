"""Consumer groups: created at id 0, through a broker outage, and recreated when Redis loses them.

At id 0, not `$` (FastStream's default): a consumer exports what its streams still retain, so a
consumer started after its producer loses nothing. A broker that refuses the group's creation for
its own state (OOM at maxmemory, LOADING, READONLY, a topology change: `is_outage`) is waited for
with one warning line, never a traceback (issue 20 finding 3): nothing is lost by starting later.
A group Redis lost (restarted empty, flushed: NOGROUP on read) is recreated at 0 and read again;
the consumers' writes are idempotent, so re-reading what they had exported doubles nothing (for
FastStream subscribers: services/streams/faststream_adapter.py `guard_missing_group`).

Moved here from services/broker/groups.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import ResponseError

from services.backoff import Backoff
from services.broker.errors import describe, is_outage
from services.settings import Settings

log = logging.getLogger("goose_ingest")

RETRY_INITIAL_S = 0.5


def is_busygroup(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError) and "BUSYGROUP" in str(exc)


def is_nogroup(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


async def create_group(client: Any, stream: str, group: str) -> None:
    """Create `group` on `stream` at id 0 (FastStream would start at `$`); an existing one is kept."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if not is_busygroup(exc):
            raise


def create_group_sync(client: Any, stream: str, group: str, start: str = "0") -> None:
    """`create_group` for a synchronous client (the PostgreSQL sink's threads); `start`: the id
    after which the group reads (the archive's: what it holds already)."""
    try:
        client.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if not is_busygroup(exc):
            raise


async def create_groups(
    client: Any,
    streams: Iterable[str],
    group: str,
    retry_max_s: float,
    stopping: asyncio.Event | None = None,
    on_stop: Callable[[], BaseException] | None = None,
) -> None:
    """`create_group` on every stream, waiting (backoff up to `retry_max_s`) while the broker is in
    an outage. `stopping` set meanwhile: raise `on_stop()` (the consumer's own stop exception)."""
    backoff = Backoff(RETRY_INITIAL_S, retry_max_s)
    warned = False
    for stream in streams:
        while True:
            try:
                await create_group(client, stream, group)
                break
            except ResponseError as exc:
                # a refusal for the broker's own state; an unreachable broker is the caller's to
                # report (at start: one line and exit 2)
                if not is_outage(exc):
                    raise
                if not warned:
                    log.warning("broker refuses to create the consumer groups (%s); waiting for it", describe(exc))
                    warned = True
            if stopping is not None and stopping.is_set():
                raise (on_stop() if on_stop is not None else asyncio.CancelledError())
            await asyncio.sleep(backoff.next())
    if warned:
        log.info("consumer groups created; the broker accepts writes again")


async def ensure_groups(client: Any, settings: Settings) -> None:
    """Create the workers' consumer group on every raw shard at id 0."""
    for stream in settings.layout.raw_streams():
        await create_group(client, stream, settings.group)


START_RETRY_S = 0.5  # the first wait before a subscriber or a consumer's start is tried again
START_RETRY_MAX_S = 5.0  # the longest wait between two tries of a subscriber start the broker refused
