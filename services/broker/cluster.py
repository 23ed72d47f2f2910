"""Cluster-aware pieces every command shares: the FastStream broker, readiness, the shard-count check.

FastStream 0.7.8 ships `RedisClusterBroker` (an async redis-py `RedisCluster` underneath): its
stream subscribers issue XGROUP CREATE / XREADGROUP on one stream each, which a
cluster client routes by that stream's slot and re-routes on MOVED / failover. So the worker's
raw-shard subscribers stay plain FastStream batch subscribers in both modes; `make_broker`
chooses the class. See docs/architecture.md ("Redis Cluster").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts.keys import KeyLayout
from services.broker.connect import connection_kwargs, target
from services.broker.errors import TOPOLOGY_CODES, reply_code
from services.broker.facts import META_LAYOUT as META_LAYOUT
from services.broker.facts import META_SHARDS as META_SHARDS
from services.broker.facts import ShardCountMismatch as ShardCountMismatch
from services.broker.facts import check_deployment_facts, judge_meta
from services.broker.facts import layout_name as _layout_name
from services.readiness import READY, Readiness, not_ready
from services.settings import Settings

log = logging.getLogger("goose_ingest.broker")

CLUSTER_SLOTS = 16384


def make_broker(settings: Settings, **options: Any) -> Any:
    """The worker's FastStream broker: RedisClusterBroker over all seeds, or RedisBroker on one node.

    Credentials travel as options, never inside the URL given to FastStream, so the
    GOOSE_INGEST_REDIS_USERNAME / _PASSWORD override holds here too; so do the TLS options
    (``connection_class`` + ``ssl_*`` on one node, ``ssl`` + ``ssl_*`` on a cluster: see connect.py).
    """
    # Imported here: taps and other commands use this module without loading FastStream.
    from faststream.redis import RedisBroker, RedisClusterBroker

    t = target(settings)
    creds = connection_kwargs(settings)
    if not settings.redis_cluster:
        return RedisBroker(t.url_without_credentials, **creds, **options)
    first, *_rest = t.seeds
    # Missing slots must surface as not-ready (cluster_health), not as a crash at start; FastStream
    # passes this through to redis-py's RedisCluster but does not declare it in its TypedDict.
    passthrough: dict[str, Any] = {"require_full_coverage": False}
    return RedisClusterBroker(
        f"redis://{first}",
        startup_nodes=[(s.host, s.port) for s in t.seeds],
        **passthrough,
        **creds,
        **options,
    )


# ---------------------------------------------------------------------------------- readiness
def parse_cluster_info(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep:
            out[name] = value
    return out


def judge_cluster_info(info: dict[str, str]) -> Readiness:
    """Pure: is a node's CLUSTER INFO a cluster that can serve every shard?"""
    if info.get("cluster_state") != "ok":
        return not_ready(f"cluster_state={info.get('cluster_state', 'unknown')}")
    served = int(info.get("cluster_slots_ok", "0") or 0)
    if served < CLUSTER_SLOTS:
        return not_ready(f"{CLUSTER_SLOTS - served} of {CLUSTER_SLOTS} slots not served")
    return READY


async def cluster_health(client: Any) -> Readiness:
    """Readiness of the broker: on a cluster, the primaries' view must be ok with every slot served.

    Each primary is asked on its own: one that does not answer (killed, failover in progress) is
    skipped, its replica's promotion shows in the others' view; no answer at all is not ready.
    """
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    if not isinstance(client, AsyncRedisCluster):
        return READY
    try:
        await client.initialize()
        nodes = client.get_primaries()
    except (RedisError, RedisClusterException) as exc:
        return not_ready(f"cluster discovery failed ({type(exc).__name__})")
    answered = 0
    for node in nodes:
        try:
            info = await client.execute_command("CLUSTER INFO", target_nodes=node)
        except (RedisError, RedisClusterException):
            continue
        answered += 1
        if isinstance(info, bytes):
            info = parse_cluster_info(info.decode())
        health = judge_cluster_info({str(k): str(v) for k, v in dict(info).items()})
        if not health.ok:
            return health
    if not answered:
        return not_ready("no primary answered CLUSTER INFO")
    return READY


class BrokerGate:
    """The worker's readiness before its parts exist, and while the cluster cannot serve every shard.

    A worker must not crash-loop on a cluster with slots missing (a primary and its replica both
    gone): it starts its metrics server first (liveness stays green, /readyz says why not),
    waits in `open` until every slot is served, checks the shard count, and once running keeps
    watching (`watch`), so /readyz turns red again during an outage and green after it.
    """

    def __init__(self, settings: Settings, poll_s: float = 1.0) -> None:
        self.settings = settings
        self.poll_s = poll_s
        self.health = not_ready("starting: connecting to the broker")
        self._after: Any = None  # the running worker's own readiness, once it exists

    def readiness(self) -> Readiness:
        if not self.health.ok or self._after is None:
            return self.health if not self.health.ok else not_ready("starting")
        return self._after()

    def then(self, readiness: Any) -> None:
        self._after = readiness

    async def _check(self, client: Any) -> Readiness:
        health = await cluster_health(client)
        if health.ok:
            return health
        return not_ready(f"Redis Cluster not serving: {health.reason}")

    async def open(self, client: Any, prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        """Wait until the cluster serves every slot (at once on a single node), check the shard count,
        then run `prepare` (the worker creates its groups). A broker error on the way (a failover
        while the worker starts) is waited out like missing slots; ShardCountMismatch is not."""
        while True:
            try:
                health = await self._check(client)
                if health.ok:
                    await ensure_shard_count_async(client, self.settings.layout)
                    if prepare is not None:
                        await prepare()
                    break
            except (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError) as exc:
                health = not_ready(f"broker unavailable ({type(exc).__name__})")
            if health != self.health:
                log.warning("%s; waiting (readiness fails meanwhile)", health.reason)
            self.health = health
            await asyncio.sleep(self.poll_s)
        self.health = READY

    async def watch(self, client: Any, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            health = await self._check(client)
            if health.ok != self.health.ok:
                log.warning("%s", "Redis Cluster serving every slot again" if health.ok else health.reason)
            self.health = health


# ---------------------------------------------------------------------------------- durable sends
class ReplicationShortfall(RedisError):
    """Fewer replicas than REDIS_WAIT_REPLICAS acknowledged a batch in time: it counts as not sent."""


class SlotsUnavailable(RedisConnectionError):
    """The stream's slot has no known primary right now (a failover in progress): retry later.

    A ConnectionError, so callers that retry an unreachable broker (the tap's spool) retry this too;
    redis-py's own RedisClusterException is not a RedisError and would escape them."""


def xadd_batch(client: Any, stream: str, entries: list[Mapping[Any, Any]], wait_replicas: int = 0,
               wait_timeout_ms: int = 1000) -> None:
    """XADD `entries` to `stream` in one pipeline; with `wait_replicas`, also WAIT for that many replicas.

    WAIT counts the writes of the connection it runs on, so it must follow the XADDs on the same
    connection: the whole batch goes through one pipeline of one node (on a cluster, the node that
    owns the stream's slot). Raises ReplicationShortfall when the replicas did not confirm in time
    (the caller re-sends; the workers drop duplicates by (run, seq)). After a MOVED or a dead node
    the cluster client's slot map is refreshed, so the caller's retry goes to the new primary.
    """
    conn = client
    if isinstance(client, RedisCluster):
        # The owning node's own client: one connection (needed by WAIT), and no per-command
        # routing in redis-py's ClusterPipeline (which costs more than the XADDs themselves).
        try:
            conn = client.get_node_from_key(stream).redis_connection
        except RedisClusterException as exc:  # e.g. SlotNotCoveredError mid-failover: not a RedisError
            _refresh_slots(client)
            raise SlotsUnavailable(f"no node serves {stream} yet ({type(exc).__name__})") from None
    pipe = conn.pipeline(transaction=False)
    for fields in entries:
        pipe.xadd(stream, fields)
    if wait_replicas:
        pipe.execute_command("WAIT", wait_replicas, wait_timeout_ms)
    try:
        replies = pipe.execute()
    except (RedisConnectionError, ResponseError) as exc:
        # A MOVED arrives as MovedError with the code dropped from its message (services/broker/errors.py):
        # read by its code, or a slot map gone stale (a restarted primary still claiming its old slots
        # answered the last refresh) would send every retry to the same replica, forever.
        if conn is not client and (isinstance(exc, RedisConnectionError) or reply_code(exc) in TOPOLOGY_CODES):
            _refresh_slots(client)
        raise
    if wait_replicas and int(replies[-1]) < wait_replicas:
        if conn is not client:
            # No replica confirmed: either the replica is away, or this node no longer is the slot's
            # primary and its own map is stale (a restarted node briefly still claims its old slots).
            _refresh_slots(client)
        raise ReplicationShortfall(
            f"{replies[-1]} of {wait_replicas} replicas acknowledged within {wait_timeout_ms} ms"
        )


def _refresh_slots(client: Any) -> None:
    try:
        client.nodes_manager.initialize()
    except (RedisError, RedisClusterException) as exc:  # a failover in progress: the next attempt refreshes again
        log.debug("slot map refresh failed (%s)", type(exc).__name__)


# ---------------------------------------------------------------------------------- shard count
# judge_meta and the facts' names live in services/broker/facts.py (no redis-py: the tap uses them too).
def ensure_shard_count(client: Any, layout: KeyLayout) -> None:
    """Record the shard count on first use (HSETNX), then refuse a different one (sync clients).

    Every worker, tap, publish and import calls this before it writes: in cluster mode a changed
    count would move runs' states to other slots mid-run.
    """
    check_deployment_facts(layout, client.hgetall, client.hsetnx, NoPermissionError)


async def ensure_shard_count_async(client: Any, layout: KeyLayout) -> None:
    """`ensure_shard_count` for asyncio clients (the worker)."""
    facts = await client.hgetall(layout.meta())
    judge_meta(layout, facts)
    if len(facts) < 2:
        try:
            await client.hsetnx(layout.meta(), META_SHARDS, str(layout.shards))
            await client.hsetnx(layout.meta(), META_LAYOUT, _layout_name(layout))
        except NoPermissionError:
            return  # see ensure_shard_count
        judge_meta(layout, await client.hgetall(layout.meta()))


__all__ = [
    "BrokerGate",
    "ShardCountMismatch",
    "cluster_health",
    "ensure_shard_count",
    "ensure_shard_count_async",
    "judge_cluster_info",
    "judge_meta",
    "make_broker",
    "ReplicationShortfall",
    "xadd_batch",
]
