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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from services.settings import Settings

log = logging.getLogger("goose_ingest.broker")

DEFAULT_PORT = 6379
SCHEMES = ("redis", "rediss", "unix")


class BrokerConfigError(ValueError):
    """The broker settings are wrong (malformed URL or seed list, not a cluster...): one line, exit 2."""


class BrokerUnreachable(RedisConnectionError):
    """No seed node of the cluster answered (a ConnectionError: callers that wait for a broker wait)."""


@dataclass(frozen=True)
class Seed:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class BrokerTarget:
    """A parsed broker URL: where to connect (credentials resolved against the settings)."""

    scheme: str
    seeds: tuple[Seed, ...]
    db: int
    username: str | None
    password: str | None
    tls: bool
    url_without_credentials: str  # for single-node clients (keeps the URL's query options)


def _parse_hostport(text: str, url_for_errors: str) -> Seed:
    text = text.strip()
    if not text:
        raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {url_for_errors}: empty host in the seed list")
    if text.startswith("["):  # [IPv6]:port
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {url_for_errors}: unclosed '[' in {text!r}")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {url_for_errors}: no host in {text!r}")
    if not port_text:
        return Seed(host, DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BrokerConfigError(
            f"GOOSE_INGEST_REDIS_URL {url_for_errors}: port {port_text!r} of {host} is not a number in 1..65535"
        )
    return Seed(host, int(port_text))


def parse_broker_url(url: str, *, cluster: bool, username: str | None = None,
                     password: str | None = None, tls: bool = False) -> BrokerTarget:
    """Parse a broker URL; `username`/`password` (from the settings) override the URL's own."""
    from services.broker.helpers import redact_url

    shown = redact_url(url)
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {shown}: not a URL ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise BrokerConfigError(
            f"GOOSE_INGEST_REDIS_URL {shown}: scheme must be redis://, rediss:// or unix://, not {parts.scheme or 'none'!r}"
        )
    netloc = parts.netloc
    userinfo, at, hostlist = netloc.rpartition("@")
    url_user = url_pw = None
    if at:
        user_text, colon, pw_text = userinfo.partition(":")
        url_user = unquote(user_text) or None
        url_pw = unquote(pw_text) if colon else None
    if parts.scheme == "unix":
        if cluster:
            raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {shown}: a Redis Cluster is not reached over a unix socket")
        seeds: tuple[Seed, ...] = ()
    else:
        seeds = tuple(_parse_hostport(h, shown) for h in hostlist.split(","))
        if len(seeds) > 1 and not cluster:
            raise BrokerConfigError(
                f"GOOSE_INGEST_REDIS_URL {shown}: several hosts given; set GOOSE_INGEST_REDIS_CLUSTER=true for a cluster"
            )
    db = 0
    path = parts.path.strip("/")
    if parts.scheme != "unix" and path:
        if not path.isdigit():
            raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {shown}: database {path!r} is not a number")
        db = int(path)
        if cluster and db != 0:
            raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {shown}: a Redis Cluster has only database 0")
    stripped = urlunsplit((parts.scheme, hostlist, parts.path, parts.query, parts.fragment))
    return BrokerTarget(
        scheme=parts.scheme,
        seeds=seeds,
        db=db,
        username=username if username else url_user,
        password=password if password is not None else url_pw,
        tls=tls or parts.scheme == "rediss",
        url_without_credentials=stripped,
    )


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


def require_url(settings: Settings) -> str:
    if not settings.redis_url:
        raise BrokerConfigError("no broker configured: set GOOSE_INGEST_REDIS_URL (or use `goose-ingest up`)")
    return settings.redis_url


def target(settings: Settings) -> BrokerTarget:
    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    return parse_broker_url(require_url(settings), cluster=settings.redis_cluster,
                            username=settings.redis_username, password=password, tls=settings.redis_tls)


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
