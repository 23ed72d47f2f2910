"""Every FastStream 0.7.8 internal the consumers touch, in one module (issue 33 item 1), with
`check_faststream` saying whether an installed FastStream still has them in the expected shape
(tests/streams/test_faststream_adapter.py fails on an upgrade that moves one).

FastStream stays the application framework of the worker and `export otlp` (the app, its
lifespan, AsyncAPI, `TestRedisBroker`) and their read loop: one batch stream subscriber per
stream. Where it has no hook for what a consumer needs, the consumer's subscriber is wrapped here,
and only here:

- its read call (`_xreadgroup`, the one method every batch read goes through):
  `guard_missing_group` (NOGROUP recreates the group at 0 instead of stopping the subscriber, which
  FastStream treats as terminal), `hold_reads_until` (no batch before every subscriber started: a
  first batch holding the loop made the next subscriber's start time out), `gate_reads` (the
  worker's shard leases: read only the shards this process holds);
- its `start`: `start_through_refusals` (a broker refusing the group creation for its own state,
  or a start beyond FastStream's fixed 3 s, is tried again instead of exiting with a traceback);
- its message: `plain_batch` hands the raw field maps to the handler untouched, with a no-op own
  acknowledgement (`FAKE_CONSUMER`): the consumer acknowledges atomically with its outputs.

`batch_subscriber` builds a subscriber with all of that, the one way both apps build theirs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faststream.middlewares import AckPolicy
from faststream.redis import StreamSub
from faststream.redis.message import FAKE_CONSUMER, RedisBatchStreamMessage
from redis.exceptions import RedisError, ResponseError

from services.backoff import Backoff
from services.broker.errors import describe, is_outage
from services.streams.groups import START_RETRY_MAX_S, START_RETRY_S, create_group, is_nogroup

log = logging.getLogger("goose_ingest")

FASTSTREAM_START_S = 3.0  # FastStream 0.7.8's limit on a Redis subscriber's start (fail_after in its `start`)
READ_CALL = "_xreadgroup"  # the subscriber method every batch read goes through (wrapped below)


def guard_missing_group(sub: Any, stream: str, group: str, client: Callable[[], Any]) -> None:
    """Wrap a FastStream stream subscriber's XREADGROUP so that NOGROUP (Redis restarted empty or
    was flushed) recreates the group at 0 instead of stopping the subscriber, which FastStream 0.7.8
    treats as terminal. `client()` gives the connection to recreate it with (None until started)."""
    read: Callable[..., Awaitable[Any]] = getattr(sub, READ_CALL)

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

    setattr(sub, READ_CALL, guarded)


def hold_reads_until(sub: Any, started: asyncio.Event) -> None:
    """Wrap a FastStream stream subscriber's XREADGROUP so that it first waits for `started` (set
    once every subscriber of the app has started: FastStream's `after_startup`).

    FastStream starts the subscribers one after the other and gives each one 3 s
    (`anyio.fail_after(3.0)` in its Redis subscriber's `start`) for its read task to answer a
    PING; a subscriber already started reads at once. Facing a backlog, its first batch (seconds of
    normalizing and redaction on a starved CPU) held the event loop while the next subscriber's
    PING reply waited, and the worker exited 1 with a TimeoutError (issue 20). Holding every read
    until all have started keeps batches out of the start; nothing is read, so nothing is pending
    for a start that fails."""
    read: Callable[..., Awaitable[Any]] = getattr(sub, READ_CALL)

    async def held(**kwargs: Any) -> Any:
        if not started.is_set():
            await started.wait()
        return await read(**kwargs)

    setattr(sub, READ_CALL, held)


def gate_reads(sub: Any, may_read: Callable[[], bool], idle_s: float) -> None:
    """Wrap a FastStream stream subscriber's XREADGROUP so it reads only while `may_read()`;
    otherwise it waits as long as an idle read would and returns nothing (the worker's shard
    leases, services/worker/leases.py)."""
    read: Callable[..., Awaitable[Any]] = getattr(sub, READ_CALL)

    async def gated(**kwargs: Any) -> Any:
        if not may_read():
            await asyncio.sleep(idle_s)
            return ()
        return await read(**kwargs)

    setattr(sub, READ_CALL, gated)


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
                    log.warning("subscriber of %s: broker refuses to start it (%s); waiting", stream, describe(exc))
                    warned = True
            except TimeoutError:
                await sub.stop()
                if not late:
                    log.warning("subscriber of %s: not started within FastStream's %.0f s (starved CPU or slow "
                                "broker); starting it again", stream, FASTSTREAM_START_S)
                    late = True
            await asyncio.sleep(backoff.next())

    sub.start = patient


def plain_batch(group: str) -> tuple[Callable[[Any], Awaitable[RedisBatchStreamMessage]], Callable[[Any], Awaitable[None]]]:
    """A parser and a decoder that hand the entries' plain field maps over untouched (no JSON
    decoding and re-encoding of every entry: they are not FastStream envelopes), with a no-op own
    acknowledgement (FAKE_CONSUMER): the consumer acknowledges itself, atomically with its outputs."""

    async def parse(raw: Any) -> RedisBatchStreamMessage:
        return RedisBatchStreamMessage(raw_message=raw, body=b"", consumer=FAKE_CONSUMER, group=group)

    async def decode(msg: Any) -> None:
        return None

    return parse, decode


def batch_subscriber(broker: Any, stream: str, *, group: str, consumer: str, batch_size: int, block_ms: int,
                     handle: Callable[..., Awaitable[None]], client: Callable[[], Any], started: asyncio.Event) -> Any:
    """A batch stream subscriber of `stream` for `group`/`consumer`, acknowledged by the consumer
    (AckPolicy.MANUAL), its entries handed to `handle` as plain fields, the lost group recreated
    (`client()`: the connection, once started), its start tried again through refusals, its reads
    held until `started`."""
    parse, decode = plain_batch(group)
    sub = broker.subscriber(
        stream=StreamSub(stream, group=group, consumer=consumer, batch=True, max_records=batch_size,
                         polling_interval=block_ms),
        parser=parse,
        decoder=decode,
        ack_policy=AckPolicy.MANUAL,
    )
    sub(handle)
    guard_missing_group(sub, stream, group, client)
    start_through_refusals(sub, stream)
    hold_reads_until(sub, started)
    return sub


# ------------------------------------------------------------------ the check
def check_faststream() -> list[str]:
    """What of the internals above an installed FastStream no longer has in the expected shape
    ([] when all is as in 0.7.8). Each line names the internal and what the wrapper relies on."""
    from faststream.redis.subscriber.usecases.basic import LogicSubscriber
    from faststream.redis.subscriber.usecases.stream_subscriber import StreamBatchSubscriber

    problems: list[str] = []

    def source(obj: Any) -> str:
        try:
            return inspect.getsource(obj)
        except (OSError, TypeError):
            return ""

    read = getattr(StreamBatchSubscriber, READ_CALL, None)
    if read is None or not inspect.iscoroutinefunction(read):
        problems.append(f"StreamBatchSubscriber.{READ_CALL}: gone or not a coroutine function (every read wrapper)")
    else:
        params = inspect.signature(read).parameters
        if [p for p in ("count", "block") if p not in params or params[p].kind is not inspect.Parameter.KEYWORD_ONLY]:
            problems.append(f"StreamBatchSubscriber.{READ_CALL}: count/block no longer keyword-only (the wrappers "
                            f"pass **kwargs through): {inspect.signature(read)}")
    start = getattr(StreamBatchSubscriber, "start", None)
    if start is None or not inspect.iscoroutinefunction(start):
        problems.append("StreamBatchSubscriber.start: gone or not a coroutine function (start_through_refusals)")
    elif f"self.{READ_CALL}(" not in source(start):
        problems.append(f"StreamBatchSubscriber.start no longer reads through self.{READ_CALL} (the read wrappers "
                        "would wrap nothing)")
    if f"anyio.fail_after({FASTSTREAM_START_S})" not in source(LogicSubscriber.start):
        problems.append(f"LogicSubscriber.start: no anyio.fail_after({FASTSTREAM_START_S}) any more "
                        "(FASTSTREAM_START_S, start_through_refusals' TimeoutError)")
    if "start_signal.set()" not in source(getattr(StreamBatchSubscriber, "_consume", None)):
        problems.append("StreamBatchSubscriber._consume: no start_signal.set() (the start's PING handshake)")
    if not any("running" in vars(k) for k in StreamBatchSubscriber.__mro__):
        problems.append("subscribers have no `running` (services/streams/watch.py's liveness)")
    if not callable(getattr(StreamBatchSubscriber, "stop", None)):
        problems.append("StreamBatchSubscriber.stop: gone (start_through_refusals stops a half-started subscriber)")
    params = inspect.signature(RedisBatchStreamMessage.__init__).parameters
    if not {"raw_message", "body", "consumer", "group"} <= set(params) and \
            not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        problems.append("RedisBatchStreamMessage(raw_message=, body=, consumer=, group=): not accepted (plain_batch)")
    if not callable(getattr(FAKE_CONSUMER, "xack", None)):
        problems.append("faststream.redis.message.FAKE_CONSUMER: no xack (plain_batch's no-op acknowledgement)")
    return problems
