"""The ingest gateway's ASGI app (Starlette): ``POST /v1/raw``, ``/healthz``, ``/readyz``, ``/metrics``.

Stateless: what a request needs is in the request and in Redis (tokens); the only process state is
the token cache (``GATEWAY_TOKEN_CACHE_S``) and the rate buckets, which are per replica.

A request is, in order: authenticated (401), bounded (413 on Content-Length, then while reading,
then while decompressing), parsed (400), rate-limited (429), checked entry by entry (per-entry
refusals; any entry outside the token's prefix refuses the whole request, 403, nothing written),
then written -- always ``XADD <shard> * <fields>``: on a single node through the group-commit writer
(writer.py: concurrent requests share one pipeline and one WAIT), on a cluster through the shared
``xadd_batch`` (one pipeline per shard, WAIT when ``REDIS_WAIT_REPLICAS`` is set) -- and answered 200
only after that. Any Redis
failure answers 503 with Retry-After: the client resends the batch, and the workers drop entries
already stored by (run, seq), exactly as for a tap that retries after a broker outage.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from contracts.gateway import INGEST_PATH, MAX_BODY_HEADER, MAX_ENTRY_HEADER, TOKEN_PATH
from services.broker.errors import describe, reply_code
from services.gateway.body import (
    OUTSIDE_PREFIX,
    OVERSIZE,
    Accepted,
    BodyError,
    Refused,
    TooLarge,
    check_entry,
    decompress,
    parse,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.tokens import TokenRecord, TokenStore
from services.gateway.writer import GroupWriter, WriteFailed
from services.settings import Settings
from services.tap.resp import xadd

log = logging.getLogger("goose_ingest.gateway")

# Pipelines in flight per replica (group commit: each carries every request queued when it starts, so
# a few suffice; more than one lets a group go out while another waits for its WAIT).
REDIS_CONNECTIONS = 4
# Bodies decoded at once per replica (worker threads), and bodies read or decoded at once per token (its
# other requests wait, unread): together they bound what a replica holds, whatever its connections send.
PARSE_SLOTS = 4
# A body up to this size, sent and decoded, is decoded on the event loop (about a millisecond).
INLINE_BYTES = 256 * 1024
TOKEN_IN_FLIGHT = 2  # below PARSE_SLOTS: one token never holds every slot
# Redis replies that mean a misconfigured gateway, not a passing state of the broker.
CONFIG_CODES = frozenset({"NOPERM", "NOAUTH", "WRONGPASS"})


class RateLimiter:
    """Token buckets per gateway token (lines/s and bytes/s), in this process: the limit is per replica.

    A request is admitted while both buckets are not in debt, and then takes what it carries (it may
    go into debt: a batch larger than one second's allowance still passes once, then waits)."""

    MAX_TOKENS = 100_000  # buckets kept (bounded: cleared when full)
    HELD_WINDOW_S = 60.0  # a token refused within this long is "held at its limit" (metric, one log line)

    def __init__(self, lines_per_s: float, bytes_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lines_per_s = lines_per_s
        self.bytes_per_s = bytes_per_s
        self.clock = clock
        self._buckets: dict[str, list[float]] = {}  # token id -> [lines, bytes, last refill]
        self._held: dict[str, float] = {}  # token id -> when it was last refused over its rate
        self._lock = threading.Lock()

    def held(self, token_id: str) -> bool:
        """Note a refusal of this token over its rate; True when it was not held already (say so once)."""
        now = self.clock()
        with self._lock:
            last = self._held.get(token_id)
            if last is None and len(self._held) >= self.MAX_TOKENS:
                self._held.clear()
            self._held[token_id] = now
        return last is None or now - last > self.HELD_WINDOW_S

    def held_tokens(self) -> int:
        """Tokens refused over their rate within the last HELD_WINDOW_S (the metric: a count, no token label)."""
        since = self.clock() - self.HELD_WINDOW_S
        with self._lock:
            for token_id in [t for t, at in self._held.items() if at < since]:
                del self._held[token_id]
            return len(self._held)

    def admit(self, token_id: str) -> float:
        """0 when the token's buckets are not in debt (nothing taken); otherwise the seconds until they are."""
        return self.take(token_id, 0, 0)

    def charge(self, token_id: str, lines: int, nbytes: int) -> None:
        """Take what a request carries, admitted or not (it may go into debt: the next one waits)."""
        if not self.lines_per_s and not self.bytes_per_s:
            return
        with self._lock:
            b = self._bucket(token_id, self.clock())
            if self.lines_per_s:
                b[0] -= lines
            if self.bytes_per_s:
                b[1] -= nbytes

    def _bucket(self, token_id: str, now: float) -> list[float]:
        b = self._buckets.get(token_id)
        if b is None:
            if len(self._buckets) >= self.MAX_TOKENS:
                self._buckets.clear()
            b = self._buckets[token_id] = [self.lines_per_s, self.bytes_per_s, now]
        elapsed = now - b[2]
        b[2] = now
        b[0] = min(self.lines_per_s, b[0] + elapsed * self.lines_per_s)
        b[1] = min(self.bytes_per_s, b[1] + elapsed * self.bytes_per_s)
        return b

    def take(self, token_id: str, lines: int, nbytes: int) -> float:
        """0 when admitted; otherwise the seconds until it would be."""
        if not self.lines_per_s and not self.bytes_per_s:
            return 0.0
        now = self.clock()
        with self._lock:
            b = self._bucket(token_id, now)
            wait = 0.0
            if self.lines_per_s and b[0] < 0:
                wait = max(wait, -b[0] / self.lines_per_s)
            if self.bytes_per_s and b[1] < 0:
                wait = max(wait, -b[1] / self.bytes_per_s)
            if wait > 0:
                return wait
            if self.lines_per_s:
                b[0] -= lines
            if self.bytes_per_s:
                b[1] -= nbytes
            return 0.0


@dataclass
class _TokenSlot:
    semaphore: anyio.Semaphore
    users: int = 0  # requests holding or waiting for it (the entry goes when none is left)


class Unavailable(Exception):
    """Redis cannot take the batch now (down, OOM, failing over, replicas short): 503 + Retry-After."""


class Gateway:
    def __init__(self, settings: Settings, client: Any) -> None:
        self.settings = settings
        self.client = client
        self.layout = settings.layout
        self.tokens = TokenStore(client, self.layout, settings.gateway_token_cache_s)
        self.limiter = RateLimiter(settings.gateway_rate_lines_per_s, settings.gateway_rate_bytes_per_s)
        self.metrics = GatewayMetrics()
        self.metrics.tokens_at_limit.set_function(self.limiter.held_tokens)
        self._ready_at = 0.0
        self._ready: tuple[bool, str] = (False, "not checked yet")
        # decoding runs in worker threads, PARSE_SLOTS at a time: the event loop (/healthz, other tokens'
        # requests, Redis replies) never waits on a body; the count of each token's requests in progress
        self._slots = anyio.CapacityLimiter(PARSE_SLOTS)
        self._token_slots: dict[str, _TokenSlot] = {}  # tokens with requests being read or decoded
        self._limits = {MAX_BODY_HEADER: str(settings.gateway_max_body_bytes),
                        MAX_ENTRY_HEADER: str(settings.max_line_bytes)}
        # write_async's, made now: its imports (redis.asyncio) and set-up would otherwise stall the event loop
        # at the first request. It binds no loop (its connections connect at their first command).
        self._writer: GroupWriter | None = None if settings.redis_cluster else self._group_writer()

    # ------------------------------------------------------------------ Redis (in worker threads)
    def _redis(self, fn: Callable[[], Any]) -> Any:
        import redis
        from redis.exceptions import RedisClusterException

        try:
            return fn()
        except (redis.RedisError, RedisClusterException) as exc:
            raise self._unavailable_error(exc) from None

    @staticmethod
    def _unavailable_error(exc: BaseException) -> Unavailable:
        """Every Redis failure is a 503 (down, OOM, LOADING, CLUSTERDOWN, a replica shortfall...); one that
        means a misconfigured gateway is also logged as such."""
        if reply_code(exc) in CONFIG_CODES:
            log.error("Redis refused the gateway's user (%s): check its ACL and credentials", describe(exc))
        return Unavailable(describe(exc))

    async def write_async(self, accepted: list[Accepted]) -> None:
        """``write`` on a single node without a thread: the request's ``XADD <shard> *`` commands go into the
        group-commit writer (services/gateway/writer.py: one pipeline and one WAIT for every request
        queued meanwhile). A cluster goes through ``write`` in a thread (slot routing is redis-py's)."""
        if self.settings.redis_cluster:
            await run_in_threadpool(self.write, accepted)
            return
        if self._writer is None:
            self._writer = self._group_writer()
        layout = self.layout
        commands = [xadd(layout.raw_stream(layout.shard_of(a.run)).encode(), a.fields.items()) for a in accepted]
        try:
            await self._writer.write(commands)
        except WriteFailed as exc:
            raise Unavailable(str(exc)) from None

    def _group_writer(self) -> GroupWriter:
        from redis import asyncio as aioredis

        from services.broker.connect import pool_url, single_node_kwargs, target

        t = target(self.settings)
        # The socket timeout bounds a hung broker (then 503); it must outlast a WAIT's own timeout.
        timeout = max(5.0, self.settings.redis_wait_timeout_ms / 1000 + 2.0)
        pool = aioredis.ConnectionPool.from_url(pool_url(t), **{
            **single_node_kwargs(self.settings, t, asyncio=True), "socket_timeout": timeout, "socket_connect_timeout": 2.0})
        # the pool only makes the connections (with the settings' credentials and TLS); the writer keeps them
        return GroupWriter(pool.make_connection, connections=REDIS_CONNECTIONS,
                           wait_replicas=self.settings.redis_wait_replicas,
                           wait_timeout_ms=self.settings.redis_wait_timeout_ms,
                           on_error=lambda exc: str(self._unavailable_error(exc)))

    def write(self, accepted: list[Accepted]) -> None:
        """XADD every accepted entry to its shard (``*`` ids, no option), one pipeline per shard."""
        from services.broker.cluster import xadd_batch

        by_stream: dict[str, list[dict[bytes, bytes]]] = {}
        for a in accepted:
            by_stream.setdefault(self.layout.raw_stream(self.layout.shard_of(a.run)), []).append(a.fields)
        for stream, entries in by_stream.items():
            self._redis(lambda s=stream, e=entries: xadd_batch(  # type: ignore[misc]
                self.client, s, e, self.settings.redis_wait_replicas, self.settings.redis_wait_timeout_ms))

    def check_token(self, presented: str) -> TokenRecord | None:
        return self._redis(lambda: self.tokens.check(presented))

    def ping(self) -> tuple[bool, str]:
        now = time.monotonic()
        if now - self._ready_at > 1.0:
            try:
                self._redis(self.client.ping)
                self._ready = (True, "")
            except Unavailable as exc:
                self._ready = (False, f"Redis unavailable ({exc})")
            self._ready_at = now
        return self._ready

    # ------------------------------------------------------------------ HTTP
    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
        self.metrics.requests.labels(str(status)).inc()
        # every reply announces the limits: a client cuts its batches below them (docs/gateway.md)
        headers = {**self._limits, **(headers or {})}
        # orjson, not Starlette's JSONResponse (stdlib json): a reply holds one result per entry
        return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")

    def _unavailable(self, reason: str) -> Response:
        return self._reply(503, {"error": "unavailable", "reason": reason},
                           {"Retry-After": str(self.settings.gateway_retry_after_s)})

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.gateway_max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit() or len(declared) > 18:
                raise BodyError(400, "Content-Length is not a number")
            if int(declared) > limit:
                raise BodyError(413, f"the body exceeds {limit} bytes")
        chunks: list[bytes] = []
        total = 0
        with anyio.fail_after(self.settings.gateway_body_timeout_s):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise BodyError(413, f"the body exceeds {limit} bytes")
                chunks.append(chunk)
        return b"".join(chunks)

    async def token_info(self, request: Request) -> Response:
        """GET: the token's prefix, stamped labels and the limits -- a tap's start-up check and its
        default run key (docs/gateway.md, "First tap")."""
        token = await self._authenticate(request)
        if isinstance(token, Response):
            return token
        return self._reply(200, {"id": token.id, "prefix": token.prefix, "labels": token.labels,
                                 "max_body_bytes": self.settings.gateway_max_body_bytes,
                                 "max_entry_bytes": self.settings.max_line_bytes})

    async def _authenticate(self, request: Request) -> TokenRecord | Response:
        auth = request.headers.get("authorization", "")
        scheme, _, presented = auth.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return self._reply(401, {"error": "unauthorized", "reason": "no bearer token"},
                               {"WWW-Authenticate": 'Bearer realm="goose-ingest"'})
        answered, token = self.tokens.cached(presented.strip())
        if not answered:  # not cached (or expired): ask Redis, off the event loop
            try:
                token = await run_in_threadpool(self.check_token, presented.strip())
            except Unavailable as exc:
                return self._unavailable(str(exc))
        if token is None:
            return self._reply(401, {"error": "unauthorized", "reason": "invalid or revoked token"},
                               {"WWW-Authenticate": 'Bearer realm="goose-ingest", error="invalid_token"'})
        return token

    async def ingest(self, request: Request) -> Response:
        token = await self._authenticate(request)
        if isinstance(token, Response):
            return token
        # Admission before any work (docs/gateway.md, "Bounded work per request"): a token in debt is
        # answered 429 before its body is read, so a request answered 429 costs nothing.
        wait = self.limiter.admit(token.id)
        if wait > 0:
            if self.limiter.held(token.id):
                # the id names the token's record (`tokens list`), never the token
                log.warning("token %s is held at its rate on this replica (GATEWAY_RATE_LINES_PER_S=%g, "
                            "GATEWAY_RATE_BYTES_PER_S=%g): answered 429 (said once a minute per token)",
                            token.id, self.limiter.lines_per_s, self.limiter.bytes_per_s)
            return self._rate_limited(wait, "over this token's rate on this replica")
        return await self._ingest(request, token)

    def _rate_limited(self, wait: float, reason: str) -> Response:
        self.metrics.rate_limited.inc()
        return self._reply(429, {"error": "rate limited", "reason": reason}, {"Retry-After": str(max(1, math.ceil(wait)))})

    def _decode(self, body: bytes, encoding: str, token: TokenRecord,
                limit: int | None = None) -> list[Accepted | Refused] | BodyError:
        """Decompress within ``limit`` (the body limit unless given), count, parse and check the entries;
        charge the token what that decoded. Its cost is bounded by the limit, MAX_PARTS and MAX_ENTRIES,
        whatever the body: in a worker thread (at most PARSE_SLOTS at once), or on the loop for a small
        one (``INLINE_BYTES``)."""
        limit = self.settings.gateway_max_body_bytes if limit is None else limit
        try:
            data = decompress(body, encoding, limit)
            items = parse(data)
        except BodyError as exc:
            if isinstance(exc, TooLarge) and limit < self.settings.gateway_max_body_bytes:
                return exc  # only over the inline bound: decoded again in a thread (below)
            # a new one, never raised: an exception crossing threads keeps its traceback's frames (and
            # their decoded buffers, up to the body limit) alive until a garbage collection
            return BodyError(exc.status, exc.reason)
        self.limiter.charge(token.id, len(items), max(0, len(data) - len(body)))  # the compressed part: charged
        stamp, max_line = token.labels, self.settings.max_line_bytes
        return [check_entry(obj, token.prefix, stamp, max_line) for obj in items]

    async def _read_and_decode(self, request: Request, token: TokenRecord) -> list[Accepted | Refused] | BodyError:
        """Under the token's TOKEN_IN_FLIGHT slots: its other requests wait, their bodies unread (in the
        socket: the connection's flow control holds them), so one token's bodies in memory are bounded
        however many connections it opens; other tokens' requests do not wait on them."""
        declared = request.headers.get("content-length", "")
        encoding = request.headers.get("content-encoding", "")
        if declared.isdigit() and int(declared) <= INLINE_BYTES:
            # A small body is decoded on the loop, bounded by INLINE_BYTES decoded (~1 ms): a thread hop
            # costs more than that, and the taps' batches are small. Decoded larger (a bomb, or just
            # compressible), it goes the thread's way.
            body = await self._read_body(request)
            self.limiter.charge(token.id, 0, len(body))
            done = self._decode(body, encoding, token, min(INLINE_BYTES, self.settings.gateway_max_body_bytes))
            if not isinstance(done, TooLarge):
                return done
            async with self._token_slot(token.id) as _:
                return await anyio.to_thread.run_sync(self._decode, body, encoding, token, limiter=self._slots)
        async with self._token_slot(token.id) as _:
            body = await self._read_body(request)
            self.limiter.charge(token.id, 0, len(body))  # what was sent, before it is decoded
            return await anyio.to_thread.run_sync(self._decode, body, encoding, token, limiter=self._slots)

    @contextlib.asynccontextmanager
    async def _token_slot(self, token_id: str) -> AsyncIterator[None]:
        slot = self._token_slots.get(token_id)
        if slot is None:
            slot = self._token_slots[token_id] = _TokenSlot(anyio.Semaphore(TOKEN_IN_FLIGHT))
        slot.users += 1
        try:
            async with slot.semaphore:
                yield
        finally:
            slot.users -= 1
            if not slot.users:
                del self._token_slots[token_id]

    async def _ingest(self, request: Request, token: TokenRecord) -> Response:
        try:
            checked = await self._read_and_decode(request, token)
            if isinstance(checked, BodyError):
                raise checked
        except BodyError as exc:
            return self._reply(exc.status, {"error": "bad request" if exc.status == 400 else "refused",
                                            "reason": exc.reason})
        except TimeoutError:
            return self._reply(408, {"error": "timeout",
                                     "reason": f"the body did not arrive within {self.settings.gateway_body_timeout_s} s"})
        outside = [i for i, c in enumerate(checked) if isinstance(c, Refused) and c.reason == OUTSIDE_PREFIX]
        if outside:
            # the whole request: a batch that reaches into another namespace is refused as one (nothing written)
            self.metrics.entries.labels("refused", OUTSIDE_PREFIX).inc(len(checked))
            return self._reply(403, {"error": "forbidden",
                                     "reason": f"{len(outside)} entries are outside the token's prefix {token.prefix!r}",
                                     "entries": outside[:100]})
        accepted = [c for c in checked if isinstance(c, Accepted)]
        if accepted:
            started = time.perf_counter()
            try:
                await self.write_async(accepted)
            except Unavailable as exc:
                return self._unavailable(str(exc))
            self.metrics.redis_seconds.observe(time.perf_counter() - started)
        results: list[dict[str, Any]] = []
        refused: Counter[str] = Counter()
        # one reply object per distinct refusal, however many entries share it (a body of bad lines)
        said: dict[tuple[str, str], dict[str, Any]] = {}
        for c in checked:
            if isinstance(c, Accepted):
                if c.cut:
                    self.metrics.entries.labels("cut", OVERSIZE).inc()
                    results.append({"stored": True, "reason": OVERSIZE,
                                    "detail": f"{c.cut} bytes > {self.settings.max_line_bytes}: kept cut in the raw log, "
                                              "dead-lettered by the workers"})
                    continue
                results.append({"stored": True})
            else:
                refused[c.reason] += 1
                result = said.get((c.reason, c.detail))
                if result is None:
                    result = said[(c.reason, c.detail)] = {"stored": False, "reason": c.reason, "detail": c.detail}
                results.append(result)
        for reason, n in refused.items():
            self.metrics.entries.labels("refused", reason).inc(n)
        self.metrics.entries.labels("stored", "").inc(len(accepted))
        return self._reply(200, {"stored": len(accepted), "refused": sum(refused.values()), "results": results})

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(self, request: Request) -> Response:
        ok, reason = await run_in_threadpool(self.ping)
        return PlainTextResponse("ready\n" if ok else f"not ready: {reason}\n", status_code=200 if ok else 503)

    async def metrics_page(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route(INGEST_PATH, self.ingest, methods=["POST"]),
            Route(TOKEN_PATH, self.token_info, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_page, methods=["GET"]),
        ])
