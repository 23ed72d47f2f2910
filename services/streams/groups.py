"""Consumer groups: created at id 0, through a broker outage, and recreated when Redis loses them.

At id 0, not `$` (FastStream's default): a consumer exports what its streams still retain, so a
consumer started after its producer loses nothing. A broker that refuses the group's creation for
its own state (OOM at maxmemory, LOADING, READONLY, a topology change: `is_outage`) is waited for
with one warning line, never a traceback (issue 20 finding 3): nothing is lost by starting later.
A group Redis lost (restarted empty, flushed: NOGROUP on read) is recreated at 0 and read again;
the consumers' writes are idempotent, so re-reading what they had exported doubles nothing.

Moved here from services/broker/groups.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.exceptions import RedisError, ResponseError

from services.broker.errors import describe, is_outage
from services.settings import Settings
from services.streams.backoff import Backoff

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
            if not is_nogroup(exc) or conn is None:
                raise
            log.warning("consumer group %s missing on %s (Redis restarted empty or flushed): recreating it at 0",
                        group, stream)
            await create_group(conn, stream, group)
            return ()

    sub._xreadgroup = guarded


START_RETRY_S = 0.5  # the first wait before a subscriber or a consumer's start is tried again
START_RETRY_MAX_S = 5.0  # the longest wait between two tries of a subscriber start the broker refused
FASTSTREAM_START_S = 3.0  # FastStream 0.7.8's limit on a Redis subscriber's start (fail_after in its `start`)


def hold_reads_until(sub: Any, started: asyncio.Event) -> None:
    """Wrap a FastStream stream subscriber's XREADGROUP so that it first waits for `started` (set
    once every subscriber of the app has started: FastStream's `after_startup`).

    FastStream starts the subscribers one after the other and gives each one 3 s
    (`anyio.fail_after(3.0)` in its Redis subscriber's `start`) for its read task to answer a
    PING; a subscriber already started reads at once. Facing a backlog, its first batch (seconds of
    normalizing and redaction on a starved CPU) held the event loop while the next subscriber's
    PING reply waited, and the worker exited 1 with a TimeoutError (issue 20). Holding every read
    until all have started keeps batches out of the start; nothing is read, so nothing is pending
    for a start that fails. Like `guard_missing_group`, the wrapped method is FastStream's read call."""
    read: Callable[..., Awaitable[Any]] = sub._xreadgroup

    async def held(**kwargs: Any) -> Any:
        if not started.is_set():
            await started.wait()
        return await read(**kwargs)

    sub._xreadgroup = held


def start_through_refusals(sub: Any, stream: str) -> None:
    """FastStream's stream subscriber creates its group itself when it starts (XGROUP CREATE, which
    Redis refuses at maxmemory even for a group that exists) and treats any error but BUSYGROUP as
    fatal: the process exited with a traceback when Redis filled up between our own group creation
    and the subscribers' start. Retry the start while the broker's refusal is an outage.

    The same for a start that outlasted FastStream's 3 s for its read task's first PING (a
    TimeoutError from `anyio.fail_after(3.0)`; issue 20): the event loop was held (a starved CPU,
    a paused process) or the broker answered late. The half-started subscriber is stopped first
    (its read task still runs; a second start would add a second reader) and started again."""
    start = sub.start

    async def patient(*args: Any, **kwargs: Any) -> Any:
        backoff, warned, late = Backoff(START_RETRY_S, START_RETRY_MAX_S), False, False
        while True:
            try:
                return await start(*args, **kwargs)
            except RedisError as exc:
                if not is_outage(exc):
                    raise
                if not warned:
                    logging.getLogger("goose_ingest").warning(
                        "subscriber of %s: broker refuses to start it (%s); waiting", stream, describe(exc))
                    warned = True
            except TimeoutError:
                await sub.stop()
                if not late:
                    logging.getLogger("goose_ingest").warning(
                        "subscriber of %s: not started within FastStream's %.0f s (starved CPU or slow broker); "
                        "starting it again", stream, FASTSTREAM_START_S)
                    late = True
            await asyncio.sleep(backoff.next())

    sub.start = patient
