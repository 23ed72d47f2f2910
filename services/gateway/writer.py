"""Group commit: the gateway's writes to a single-node Redis, many requests in one pipeline.

Why: one tap line is often one request (a tap at a few lines/s sends each line as it comes), so a
gateway serving 1,000 lines/s serves ~1,000 requests/s. Measured on this machine, a redis-py
asyncio pipeline of one XADD cost ~140 us of the event loop's time and ~240 us under 2,000
concurrent requests (its pool, its command packing, one round trip each): that alone capped a
replica near the target rate. Here a request hands its XADD commands (hand-built RESP,
``services/tap/resp.py``, byte-equal to redis-py's) to a writer; at most ``connections`` pipelines are
in flight, and each takes *every* request queued when it starts: one write, one round trip and
one ``WAIT`` (when ``REDIS_WAIT_REPLICAS`` is set) for the group. An idle gateway sends a lone
request at once (no timer, no added latency); a busy one sends larger groups, like the tap's own
Nagle-like batching.

Per request, the outcome is what it was with a pipeline of its own: stored (every reply of its
commands is an id and the group's WAIT reached the replicas), or ``WriteFailed`` with the reason (an
error reply of one of its commands, the connection lost, replicas short): the gateway answers 503
and the client resends; the workers drop entries already stored by (run, seq). A failure of one
request's command does not fail the others of its group.

The connections are redis-py's (the same connect, AUTH, TLS and SELECT as every other client,
``services/broker/connect.py``); only the commands' bytes and the reading of their replies are done
here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.tap.resp import command as resp_command

MAX_GROUP_COMMANDS = 5_000  # commands in one pipeline at most (a request is never split): bounds a group's buffers


class WriteFailed(Exception):
    """This request's entries are not (all) known to be stored; ``reason`` names no token or entry."""


@dataclass
class _Request:
    commands: list[bytes]
    future: asyncio.Future[None]
    error: str | None = field(default=None)


class GroupWriter:
    """Pipelines the XADD commands of concurrent requests on up to ``connections`` redis-py connections.

    ``make_connection`` returns a new, unconnected ``redis.asyncio`` connection (it connects at its
    first command and again after a failure). Only the event loop's thread uses this object."""

    def __init__(self, make_connection: Callable[[], Any], *, connections: int, wait_replicas: int,
                 wait_timeout_ms: int, on_error: Callable[[BaseException], str]) -> None:
        self._make_connection = make_connection
        self._max_inflight = max(1, connections)
        self._wait = (resp_command(b"WAIT", b"%d" % wait_replicas, b"%d" % wait_timeout_ms)
                      if wait_replicas else None)
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = wait_timeout_ms
        self._on_error = on_error  # an exception -> the reason of the 503 (logs what needs an operator)
        self._queue: list[_Request] = []
        self._idle: list[Any] = []  # connections not in use
        self._inflight = 0
        self.groups = 0  # pipelines sent (a measure of how much grouping happened)

    async def write(self, commands: list[bytes]) -> None:
        """Send these commands (in order, in one pipeline with other requests'); return once all are stored."""
        if not commands:
            return
        req = _Request(commands, asyncio.get_running_loop().create_future())
        self._queue.append(req)
        if self._inflight < self._max_inflight:
            self._inflight += 1
            asyncio.get_running_loop().create_task(self._flusher())
        await req.future

    def _take_group(self) -> list[_Request]:
        n = commands = 0
        for req in self._queue:
            if n and commands + len(req.commands) > MAX_GROUP_COMMANDS:
                break
            n += 1
            commands += len(req.commands)
        group, self._queue = self._queue[:n], self._queue[n:]
        return group

    async def _flusher(self) -> None:
        conn = self._idle.pop() if self._idle else self._make_connection()
        try:
            while self._queue:
                group = self._take_group()
                try:
                    await self._send(conn, group)
                except BaseException as exc:  # the connection failed: every request of the group not yet answered
                    reason = self._on_error(exc) if isinstance(exc, Exception) else "the gateway is stopping"
                    for req in group:
                        req.error = req.error or reason
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    for req in group:
                        if not req.future.done():  # a request whose client went away was cancelled
                            if req.error is None:
                                req.future.set_result(None)
                            else:
                                req.future.set_exception(WriteFailed(req.error))
        finally:
            self._idle.append(conn)
            self._inflight -= 1

    async def _send(self, conn: Any, group: list[_Request]) -> None:
        from redis.exceptions import ResponseError

        payload = [c for req in group for c in req.commands]
        if self._wait is not None:
            payload.append(self._wait)
        self.groups += 1
        await conn.send_packed_command(payload)
        for req in group:
            for _ in req.commands:
                try:
                    await conn.read_response(disable_decoding=True)
                except ResponseError as exc:  # this reply only: the connection is still in step
                    if req.error is None:
                        req.error = self._on_error(exc)
        if self._wait is not None:
            acked = await conn.read_response(disable_decoding=True)
            if int(acked) < self._wait_replicas:
                short = (f"{int(acked)} of {self._wait_replicas} replicas acknowledged within "
                         f"{self._wait_timeout_ms} ms")
                for req in group:
                    req.error = req.error or short

    async def close(self) -> None:
        for conn in self._idle:
            await conn.disconnect()
        self._idle.clear()
