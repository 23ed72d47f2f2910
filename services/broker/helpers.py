"""Small broker helpers: a sync client with socket timeouts (and `redact_url`, from url.py)."""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from services.broker.connect import _cluster_error, _cluster_kwargs, pool_url, single_node_kwargs, target
from services.broker.url import redact_url as redact_url  # re-exported; defined there (no redis-py)
from services.settings import Settings


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
