"""Redis clients built from Settings; credentials only ever come from there.

One broker URL names either one node (``redis://[user:pw@]host:port/db``, ``rediss://``,
``unix://``) or, with ``GOOSE_INGEST_REDIS_CLUSTER=true``, the seed nodes of a Redis Cluster
(``redis://[user:pw@]h1:p1,h2:p2``; one seed is enough, the client discovers the rest).
``GOOSE_INGEST_REDIS_USERNAME`` / ``_PASSWORD`` override the URL's own credentials (the URL is
the address, the settings hold the secret).

Bad input never becomes a traceback: a malformed URL or seed list, or a node that is not a
cluster, raises `BrokerConfigError`; seeds that cannot be reached raise `BrokerUnreachable`
(a redis ``ConnectionError``, so everything that already waits for or reports an unreachable
broker handles it too). Both carry one line, with the password never in it.

The URL parsing itself lives in ``services/broker/url.py`` (no redis-py), shared with the tap's
own connection; its names are re-exported here.

TLS (``rediss://`` or ``GOOSE_INGEST_REDIS_TLS``): every client gets its options from one place,
``url.tls_options``. redis-py takes them differently per client: a single node's connection pool
needs ``connection_class`` (our `TLSConnection` / `AsyncTLSConnection`) plus the ``ssl_*`` options
(``ssl=True`` is only understood by ``Redis()``/``RedisCluster()``, and a pool given it fails with
"unexpected keyword argument 'ssl'"); a cluster client takes ``ssl=True`` plus the same options.
FastStream's RedisBroker passes ``connection_class`` and ``ssl_*`` through to its pool, and its
RedisClusterBroker passes ``ssl`` and ``ssl_*`` to RedisCluster, so the worker's broker uses the
same options (FastStream's ``security=`` takes an SSLContext that its cluster broker ignores).
A certificate that does not verify, a server that does not speak TLS, or a client certificate the
server refuses is a `BrokerTLSError` (a configuration error: one line, exit 2), never a wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from services.backoff import Backoff
from services.broker.url import (
    BrokerConfigError,
    BrokerTarget,
    BrokerTLSError,
    Seed,
    TlsOptions,
    parse_broker_url,
    require_url,
    target,
    tls_failure,
    tls_handshake_timeout,
    tls_options,
)
from services.settings import Settings

log = logging.getLogger("goose_ingest.broker")


class BrokerUnreachable(RedisConnectionError):
    """No seed node of the cluster answered (a ConnectionError: callers that wait for a broker wait)."""


def _kwargs(settings: Settings) -> dict[str, Any]:
    """Client options shared by every client (credentials and TLS are added by `_credentials`/`_tls`)."""
    return {
        # Arming the per-reply timer costs ~7 us a command (measured here); blocking
        # reads carry their own BLOCK timeout, and health checks catch dead sockets.
        "socket_timeout": None,
        "socket_connect_timeout": 5,
        "health_check_interval": 30,
    }


def _credentials(t: BrokerTarget) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if t.username:
        kw["username"] = t.username
    if t.password is not None:
        kw["password"] = t.password
    return kw


class TLSConnection(redis.SSLConnection):
    """redis-py's SSLConnection whose TLS failures are one-line configuration errors (BrokerTLSError).

    The handshake's errors and a client certificate refused by the server (TLS 1.3 reports that at
    the first read, inside the connect handshake) otherwise surface as a ConnectionError, which
    every caller treats as "broker down, wait". The handshake also gets the connect timeout: with
    ``socket_timeout=None`` a plain port (which never answers a ClientHello) would hang forever."""

    _handshake_done = False

    def _wrap_socket_with_ssl(self, sock: Any) -> Any:
        self._handshake_done = False
        sock.settimeout(self.socket_connect_timeout)
        try:
            wrapped = super()._wrap_socket_with_ssl(sock)
        except TimeoutError:  # socket.timeout: TCP was accepted, the handshake got no answer
            sock.close()
            raise tls_handshake_timeout(f"{self.host}:{self.port}", self.socket_connect_timeout) from None
        wrapped.settimeout(self.socket_timeout)
        self._handshake_done = True
        return wrapped

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().connect_check_health(*args, **kwargs)
        except RedisConnectionError as exc:
            failure = tls_failure(exc, f"{self.host}:{self.port}",
                                  closed_after_handshake=self._handshake_done and not self.certfile)
            if failure is None:
                raise
            raise failure from None


class AsyncTLSConnection(AsyncSSLConnection):
    """`TLSConnection` for redis.asyncio (also the connection class of the worker's FastStream broker).

    The handshake runs inside redis-py's connect timeout; asyncio's own handshake timeout, set below
    it, tells a plain port (handshake never answered) from an unreachable host (connect timeout)."""

    _handshake_done = False

    def _connection_arguments(self) -> Mapping[str, Any]:
        kwargs = dict(super()._connection_arguments())
        if self.socket_connect_timeout:
            kwargs["ssl_handshake_timeout"] = self.socket_connect_timeout * HANDSHAKE_SHARE
        return kwargs

    async def _connect(self) -> None:
        self._handshake_done = False
        await super()._connect()
        self._handshake_done = True

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().connect_check_health(*args, **kwargs)
        except RedisConnectionError as exc:
            where = f"{self.host}:{self.port}"
            if _handshake_aborted(exc):
                limit = self.socket_connect_timeout * HANDSHAKE_SHARE if self.socket_connect_timeout else None
                raise tls_handshake_timeout(where, limit) from None
            failure = tls_failure(exc, where, closed_after_handshake=self._handshake_done and not self.certfile)
            if failure is None:
                raise
            raise failure from None


# asyncio's TLS handshake timeout as a share of the connect timeout around it: it must fire first.
# wait_for_broker: a broker that starts after its clients is asked at once-ish, then every 5 s at most
BROKER_WAIT_START_S = 0.2
BROKER_WAIT_CAP_S = 5.0
HANDSHAKE_SHARE = 0.8


def _handshake_aborted(exc: BaseException) -> bool:
    """asyncio's handshake timeout (a ConnectionAbortedError naming the handshake) in `exc`'s chain."""
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, ConnectionAbortedError) and "handshake" in str(cur).lower():
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _tls(settings: Settings, t: BrokerTarget, *, asyncio: bool) -> dict[str, Any]:
    """TLS options for the client kind `settings` asks for; {} when the broker is not TLS."""
    if not t.tls:
        return {}
    options = tls_options(settings).redis_kwargs()
    if settings.redis_cluster:
        return {"ssl": True, **options}
    return {"connection_class": AsyncTLSConnection if asyncio else TLSConnection, **options}


def connection_kwargs(settings: Settings) -> dict[str, Any]:
    """Credentials and TLS options of an asyncio client (FastStream's brokers take a URL plus these)."""
    t = target(settings)
    return {**_credentials(t), **_tls(settings, t, asyncio=True)}


def client_url(settings: Settings) -> str:
    """The single-node URL without its credentials (they travel as keyword options instead)."""
    return target(settings).url_without_credentials


def _cluster_error(exc: RedisClusterException, t: BrokerTarget) -> Exception:
    text = str(exc)
    seeds = ",".join(map(str, t.seeds))
    failure = tls_failure(exc, seeds)
    if failure is not None:
        return failure
    if "not enabled" in text:
        return BrokerConfigError(
            f"GOOSE_INGEST_REDIS_CLUSTER=true but {seeds} is not a Redis Cluster node (cluster mode disabled)"
        )
    if "cannot be connected" in text or "reachable" in text:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return BrokerUnreachable(f"no seed node of the cluster answered ({seeds}): {type(cause).__name__}")
    # Anything else while discovering (nodes disagreeing on the slot map mid-failover...) is
    # transient: a ConnectionError, which workers wait out and commands report as unreachable.
    return BrokerUnreachable(f"Redis Cluster at {seeds} not usable yet: {text.splitlines()[0] if text else type(exc).__name__}")


class GooseAsyncRedisCluster(AsyncRedisCluster):
    """redis-py's async RedisCluster (discovery runs at the first command) with one-line errors."""

    def __init__(self, goose_target: BrokerTarget, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._goose_target = goose_target

    async def initialize(self, *args: Any, **kwargs: Any) -> GooseAsyncRedisCluster:
        try:
            await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise _cluster_error(exc, self._goose_target) from None
        return self


def _cluster_kwargs(settings: Settings, t: BrokerTarget) -> dict[str, Any]:
    kw = {**_kwargs(settings), **_credentials(t), **_tls(settings, t, asyncio=False)}
    # A cluster with slots missing must still let the worker start and report not-ready
    # (readiness checks CLUSTER INFO, see services/broker/cluster.py) instead of crash-looping.
    kw["require_full_coverage"] = False
    return kw


def sync_client(settings: Settings) -> Any:
    """A sync client: redis.Redis on a single node, RedisCluster (discovered now) on a cluster."""
    t = target(settings)
    if settings.redis_cluster:
        nodes = [ClusterNode(s.host, s.port) for s in t.seeds]
        try:
            return RedisCluster(startup_nodes=nodes, **_cluster_kwargs(settings, t))
        except RedisClusterException as exc:
            raise _cluster_error(exc, t) from None
    return redis.Redis.from_url(pool_url(t), **single_node_kwargs(settings, t, asyncio=False))


def sync_client_with_timeouts(settings: Settings, socket_timeout: float | None, connect_timeout: float) -> Any:
    """Like ``connect.sync_client`` but with explicit timeouts (for producers that must notice a hung broker)."""
    t = target(settings)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout}
    if settings.redis_cluster:
        nodes = [ClusterNode(s.host, s.port) for s in t.seeds]
        try:
            return RedisCluster(startup_nodes=nodes, **{**_cluster_kwargs(settings, t), **timeouts})
        except RedisClusterException as exc:
            raise _cluster_error(exc, t) from None
    return redis.Redis.from_url(pool_url(t), **{**single_node_kwargs(settings, t, asyncio=False), **timeouts})


def pool_url(t: BrokerTarget) -> str:
    """The URL for ``Redis.from_url`` next to `single_node_kwargs`: ``rediss://`` spelled ``redis://``,
    since TLS comes from our ``connection_class`` and redis.asyncio's ``from_url`` would replace
    that with its own SSLConnection for a ``rediss://`` URL (the sync one keeps it)."""
    url = t.url_without_credentials
    return "redis" + url[len("rediss"):] if t.scheme == "rediss" else url


def single_node_kwargs(settings: Settings, t: BrokerTarget, *, asyncio: bool) -> dict[str, Any]:
    """Everything `Redis.from_url(t.url_without_credentials, ...)` needs besides the URL."""
    return {**_kwargs(settings), **_credentials(t), **_tls(settings, t, asyncio=asyncio)}


def async_client(settings: Settings) -> Any:
    """An asyncio client: redis.asyncio.Redis, or RedisCluster (discovered at its first command)."""
    t = target(settings)
    if settings.redis_cluster:
        nodes = [AsyncClusterNode(s.host, s.port) for s in t.seeds]
        return GooseAsyncRedisCluster(t, startup_nodes=nodes, **_cluster_kwargs(settings, t))
    return aioredis.Redis.from_url(pool_url(t), **single_node_kwargs(settings, t, asyncio=True))


__all__ = [
    "AsyncTLSConnection",
    "BrokerConfigError",
    "BrokerTLSError",
    "BrokerTarget",
    "BrokerUnreachable",
    "Seed",
    "TLSConnection",
    "TlsOptions",
    "async_client",
    "client_url",
    "connection_kwargs",
    "parse_broker_url",
    "pool_url",
    "require_url",
    "sync_client",
    "single_node_kwargs",
    "target",
    "tls_failure",
    "tls_options",
]


async def wait_for_broker(settings: Settings, log: logging.Logger, say: Callable[[str], None] | None = None) -> None:
    """Wait until the broker answers, instead of crashing: a worker usually starts before Redis.

    ``say`` gets each retry's reason (an early /readyz shows it, services/metrics/startup.py)."""
    from redis.exceptions import AuthenticationError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from services.broker.connect import async_client
    from services.broker.url import redact_url

    backoff = Backoff(BROKER_WAIT_START_S, BROKER_WAIT_CAP_S)
    while True:
        client = async_client(settings)
        try:
            await client.ping()
            return
        except AuthenticationError:
            raise  # a ConnectionError in redis-py, but waiting will not fix credentials: one line, exit 2
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            log.warning("broker %s unreachable (%s); retrying in %.1fs", redact_url(settings.redis_url),
                        type(exc).__name__, backoff.delay)
            if say is not None:
                say(f"waiting for the broker {redact_url(settings.redis_url)}: unreachable ({type(exc).__name__})")
        finally:
            await client.aclose()
        await asyncio.sleep(backoff.next())
