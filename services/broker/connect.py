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
"""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from services.broker.url import (
    BrokerConfigError,
    BrokerTarget,
    Seed,
    parse_broker_url,
    require_url,
    target,
)
from services.settings import Settings

log = logging.getLogger("goose_ingest.broker")


class BrokerUnreachable(RedisConnectionError):
    """No seed node of the cluster answered (a ConnectionError: callers that wait for a broker wait)."""


def _kwargs(settings: Settings) -> dict[str, Any]:
    """Client options shared by every client (credentials are added by `target`)."""
    kw: dict[str, Any] = {
        # Arming the per-reply timer costs ~7 us a command (measured here); blocking
        # reads carry their own BLOCK timeout, and health checks catch dead sockets.
        "socket_timeout": None,
        "socket_connect_timeout": 5,
        "health_check_interval": 30,
    }
    if settings.redis_tls_ca_file:
        kw["ssl_ca_certs"] = settings.redis_tls_ca_file
    return kw


def _credentials(t: BrokerTarget) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if t.username:
        kw["username"] = t.username
    if t.password is not None:
        kw["password"] = t.password
    if t.tls:
        kw["ssl"] = True
    return kw


def connection_kwargs(settings: Settings) -> dict[str, Any]:
    """Credentials and TLS options only (for clients that take a URL plus keyword options)."""
    kw = _credentials(target(settings))
    if settings.redis_tls_ca_file:
        kw["ssl_ca_certs"] = settings.redis_tls_ca_file
    return kw


def client_url(settings: Settings) -> str:
    """The single-node URL without its credentials (they travel as keyword options instead)."""
    return target(settings).url_without_credentials


def _cluster_error(exc: RedisClusterException, t: BrokerTarget) -> Exception:
    text = str(exc)
    seeds = ",".join(map(str, t.seeds))
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
    kw = {**_kwargs(settings), **_credentials(t)}
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
    return redis.Redis.from_url(t.url_without_credentials, **_kwargs(settings), **_credentials(t))


def async_client(settings: Settings) -> Any:
    """An asyncio client: redis.asyncio.Redis, or RedisCluster (discovered at its first command)."""
    t = target(settings)
    if settings.redis_cluster:
        nodes = [AsyncClusterNode(s.host, s.port) for s in t.seeds]
        return GooseAsyncRedisCluster(t, startup_nodes=nodes, **_cluster_kwargs(settings, t))
    return aioredis.Redis.from_url(t.url_without_credentials, **_kwargs(settings), **_credentials(t))


__all__ = [
    "BrokerConfigError",
    "BrokerTarget",
    "BrokerUnreachable",
    "Seed",
    "async_client",
    "client_url",
    "connection_kwargs",
    "parse_broker_url",
    "require_url",
    "sync_client",
    "target",
]
