"""The broker URL and the settings' credentials, parsed without any Redis client library.

Split out of ``connect.py`` so that commands which never use redis-py (the single-node tap, see
``services/tap/conn.py``) parse and report a broker address exactly as the redis-py clients do.

One broker URL names either one node (``redis://[user:pw@]host:port/db``, ``rediss://``,
``unix://``) or, with ``GOOSE_INGEST_REDIS_CLUSTER=true``, the seed nodes of a Redis Cluster
(``redis://[user:pw@]h1:p1,h2:p2``; one seed is enough, the client discovers the rest).
``GOOSE_INGEST_REDIS_USERNAME`` / ``_PASSWORD`` override the URL's own credentials (the URL is
the address, the settings hold the secret). A malformed URL raises `BrokerConfigError`: one
line, with the password never in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

if TYPE_CHECKING:
    from services.settings import Settings

DEFAULT_PORT = 6379
SCHEMES = ("redis", "rediss", "unix")


class BrokerConfigError(ValueError):
    """The broker settings are wrong (malformed URL or seed list, not a cluster...): one line, exit 2."""


# Query options whose values are shown in logs: redis-py's connection options that carry no secret.
# Any other parameter (password, token, key, sig, auth, an option added later...) is shown as `name=***`.
SHOWN_QUERY_OPTIONS = frozenset({
    "db", "protocol", "ssl_cert_reqs", "ssl_check_hostname", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "retry_on_timeout", "health_check_interval", "max_connections", "decode_responses",
    "single_connection_client", "read_from_replicas", "require_full_coverage",
})


def _redact_query(query: str) -> str:
    shown = []
    for pair in query.split("&"):
        if not pair:
            continue
        name, sep, value = pair.partition("=")
        shown.append(f"{name}={value}" if unquote(name).lower() in SHOWN_QUERY_OPTIONS else (f"{name}=***" if sep else "***"))
    return "&".join(shown)


def redact_url(url: str | None) -> str:
    """The URL safe to log: userinfo (user and password) as ``***``, the values of query parameters
    other than harmless connection options as ``***``, no fragment."""
    if not url:
        return "(no broker URL)"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable broker URL)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, _redact_query(parts.query), ""))


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
    socket_path: str = ""  # unix:// only


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
    db = 0
    socket_path = ""
    if parts.scheme == "unix":
        if cluster:
            raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {shown}: a Redis Cluster is not reached over a unix socket")
        seeds: tuple[Seed, ...] = ()
        socket_path = unquote(parts.path)
        # redis-py reads a unix socket's database from the query (unix:///path?db=2)
        db_text = (parse_qs(parts.query).get("db") or ["0"])[0]
        if not db_text.isdigit():
            raise BrokerConfigError(f"GOOSE_INGEST_REDIS_URL {shown}: database {db_text!r} is not a number")
        db = int(db_text)
    else:
        seeds = tuple(_parse_hostport(h, shown) for h in hostlist.split(","))
        if len(seeds) > 1 and not cluster:
            raise BrokerConfigError(
                f"GOOSE_INGEST_REDIS_URL {shown}: several hosts given; set GOOSE_INGEST_REDIS_CLUSTER=true for a cluster"
            )
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
        socket_path=socket_path,
    )


def require_url(settings: Settings) -> str:
    if not settings.redis_url:
        raise BrokerConfigError("no broker configured: set GOOSE_INGEST_REDIS_URL (or use `goose-ingest up`)")
    return settings.redis_url


def target(settings: Settings) -> BrokerTarget:
    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    return parse_broker_url(require_url(settings), cluster=settings.redis_cluster,
                            username=settings.redis_username, password=password, tls=settings.redis_tls)
