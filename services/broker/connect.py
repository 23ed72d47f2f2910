"""Redis clients built from Settings; credentials only ever come from there."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from services.settings import Settings


def _kwargs(settings: Settings) -> dict:
    kw: dict = {
        # Arming the per-reply timer costs ~7 us a command (measured here); blocking
        # reads carry their own BLOCK timeout, and health checks catch dead sockets.
        "socket_timeout": None,
        "socket_connect_timeout": 5,
        "health_check_interval": 30,
        "retry_on_timeout": False,
    }
    if settings.redis_username:
        kw["username"] = settings.redis_username
    if settings.redis_password is not None:
        kw["password"] = settings.redis_password.get_secret_value()
    if settings.redis_tls:
        kw["ssl"] = True
    if settings.redis_tls_ca_file:
        kw["ssl_ca_certs"] = settings.redis_tls_ca_file
    return kw


def connection_kwargs(settings: Settings) -> dict:
    """Credentials and TLS options only (for clients that take a URL plus keyword options)."""
    return {k: v for k, v in _kwargs(settings).items() if k in ("username", "password", "ssl", "ssl_ca_certs")}


def require_url(settings: Settings) -> str:
    if not settings.redis_url:
        raise RuntimeError("no broker configured: set GOOSE_INGEST_REDIS_URL (or use `goose-ingest up`)")
    return settings.redis_url


def sync_client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(require_url(settings), **_kwargs(settings))


def async_client(settings: Settings) -> aioredis.Redis:
    return aioredis.Redis.from_url(require_url(settings), **_kwargs(settings))
