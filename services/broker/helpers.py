"""Small broker helpers: URL redaction for messages, and a sync client with socket timeouts."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

from services.broker.connect import _kwargs, require_url
from services.settings import Settings


def redact_url(url: str | None) -> str:
    """The URL with any userinfo (user and password) replaced by ``***``: safe to log."""
    if not url:
        return "(no broker URL)"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable broker URL)"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def sync_client_with_timeouts(settings: Settings, socket_timeout: float | None, connect_timeout: float) -> redis.Redis:
    """Like ``connect.sync_client`` but with explicit timeouts (for producers that must notice a hung broker)."""
    kw = _kwargs(settings)
    kw["socket_timeout"] = socket_timeout
    kw["socket_connect_timeout"] = connect_timeout
    return redis.Redis.from_url(require_url(settings), **kw)
