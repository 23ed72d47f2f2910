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

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from services.settings import ENV_PREFIX

if TYPE_CHECKING:
    import ssl

    from services.settings import Settings

DEFAULT_PORT = 6379
SCHEMES = ("redis", "rediss", "unix")


class BrokerConfigError(ValueError):
    """The broker settings are wrong (malformed URL or seed list, not a cluster...): one line, exit 2."""


class BrokerTLSError(BrokerConfigError):
    """TLS to the broker cannot work as configured: a certificate that does not verify, a server that
    does not speak TLS, a client certificate refused or missing, an unreadable CA/cert/key file.

    A configuration error (one line, exit 2), not an unreachable broker: waiting would not fix it,
    as with refused credentials."""


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
        # a unix socket is local: TLS never applies to it (redis-py has no TLS unix connection either)
        tls=(tls or parts.scheme == "rediss") and parts.scheme != "unix",
        url_without_credentials=stripped,
        socket_path=socket_path,
    )


# Redis's reply to SELECT of a database past its `databases` setting (16 by default)
DB_OUT_OF_RANGE = "DB index is out of range"


def is_db_out_of_range(exc: BaseException) -> bool:
    """The broker refused the URL's database number: a configuration error, never worth a retry."""
    return DB_OUT_OF_RANGE in str(exc)


def no_such_database(url: str, reply: str) -> BrokerConfigError:
    """One line for a database number the broker does not have (the URL without its password)."""
    shown = redact_url(url)
    return BrokerConfigError(
        f"GOOSE_INGEST_REDIS_URL {shown}: the broker has no such database ({reply.strip()}); Redis has 16 "
        "(0..15) unless its `databases` setting says more -- use /0"
    )


def require_url(settings: Settings) -> str:
    if not settings.redis_url:
        raise BrokerConfigError("no broker configured: set GOOSE_INGEST_REDIS_URL (or use `goose-ingest up`)")
    return settings.redis_url


def target(settings: Settings) -> BrokerTarget:
    """The parsed broker URL; with TLS on, also checks that the CA/cert/key files load (BrokerTLSError)."""
    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    t = parse_broker_url(require_url(settings), cluster=settings.redis_cluster,
                         username=settings.redis_username, password=password, tls=settings.redis_tls)
    if t.tls:
        tls_options(settings).context()  # a missing or unreadable file: one line now, not a hang later
    return t


# ------------------------------------------------------------------------------------------- TLS
# Env names of the TLS settings, for messages (services/settings.py defines the fields).
TLS_VAR = f"{ENV_PREFIX}REDIS_TLS"
CA_FILE_VAR = f"{ENV_PREFIX}REDIS_TLS_CA_FILE"
CERT_FILE_VAR = f"{ENV_PREFIX}REDIS_TLS_CERT_FILE"
KEY_FILE_VAR = f"{ENV_PREFIX}REDIS_TLS_KEY_FILE"
CHECK_HOSTNAME_VAR = f"{ENV_PREFIX}REDIS_TLS_CHECK_HOSTNAME"


@dataclass(frozen=True)
class TlsOptions:
    """How every broker client does TLS: the one source of redis-py's ``ssl_*`` options and of the
    tap's own ``ssl.SSLContext``, so both trust and present exactly the same certificates.

    The server's certificate is always verified: against the system's CAs (which honour OpenSSL's
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) plus `ca_file` when given, as redis-py does."""

    ca_file: str | None = None
    cert_file: str | None = None  # client certificate (PEM; may hold the key too)
    key_file: str | None = None
    check_hostname: bool = True

    def redis_kwargs(self) -> dict[str, Any]:
        """Options for redis-py's SSLConnection (sync and asyncio) and RedisCluster(ssl=True)."""
        kw: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": self.check_hostname}
        if self.ca_file:
            kw["ssl_ca_certs"] = self.ca_file
        if self.cert_file:
            kw["ssl_certfile"] = self.cert_file
        if self.key_file:
            kw["ssl_keyfile"] = self.key_file
        return kw

    def context(self) -> ssl.SSLContext:
        """The same trust as `redis_kwargs` as an SSLContext; an unreadable file is a BrokerTLSError."""
        import ssl  # only here: it costs the tap ~5 MiB and most taps talk plain TCP

        context = ssl.create_default_context()
        context.check_hostname = self.check_hostname
        if self.ca_file:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise BrokerTLSError(f"{CA_FILE_VAR} {self.ca_file}: {_file_problem(exc)}") from None
        if self.cert_file:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                files = f"{self.cert_file}" + (f" / {self.key_file}" if self.key_file else "")
                raise BrokerTLSError(
                    f"{CERT_FILE_VAR} / {KEY_FILE_VAR} {files}: client certificate and key do not load "
                    f"({_file_problem(exc)})"
                ) from None
        return context


def _file_problem(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, PermissionError):
        return "not readable (permission denied)"
    reason = getattr(exc, "reason", None)
    if reason:
        return str(reason)
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def tls_options(settings: Settings) -> TlsOptions:
    """The TLS options of every broker client, from the settings (used whenever the target is TLS)."""
    if settings.redis_tls_key_file and not settings.redis_tls_cert_file:
        raise BrokerTLSError(f"{KEY_FILE_VAR} is set without {CERT_FILE_VAR} (the client certificate)")
    return TlsOptions(
        ca_file=settings.redis_tls_ca_file or None,
        cert_file=settings.redis_tls_cert_file or None,
        key_file=settings.redis_tls_key_file or None,
        check_hostname=settings.redis_tls_check_hostname,
    )


def tls_failure(exc: BaseException, where: str, *, closed_after_handshake: bool = False) -> BrokerTLSError | None:
    """A TLS failure found anywhere in `exc`'s chain (redis-py wraps it in a ConnectionError), as one
    line naming the cause and the setting that fixes it; None when `exc` is no TLS failure.

    A handshake cut short (EOF: a server restarting) is no TLS failure: that broker is just unreachable.
    Except `closed_after_handshake`: the caller's handshake completed, it presented no client
    certificate, and the connection died at its first exchange. That is how a broker requiring client
    certificates answers under TLS 1.3 when its alert loses the race against our first write."""
    ssl = sys.modules.get("ssl")
    if ssl is None:  # never loaded: no TLS was attempted
        return None
    seen: set[int] = set()
    closed = False
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError) and not isinstance(cur, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            return BrokerTLSError(_explain(cur, ssl, where))
        closed = closed or isinstance(cur, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError,
                                            BrokenPipeError)) or "closed" in str(cur).lower()
        cur = cur.__cause__ or cur.__context__
    if closed_after_handshake and closed:
        return BrokerTLSError(
            f"TLS to the broker {where} failed: it closed the connection right after the handshake, as a broker "
            f"that requires a client certificate does; set {CERT_FILE_VAR} and {KEY_FILE_VAR}"
        )
    return None


def tls_handshake_timeout(where: str, seconds: float | None) -> BrokerTLSError:
    """The TCP connection was accepted but no TLS handshake followed: almost always a plain port."""
    within = f" within {seconds:g} s" if seconds else ""
    return BrokerTLSError(
        f"TLS to the broker {where} failed: no TLS handshake answer{within} (a plain Redis port never answers one); "
        f"use its TLS port, or redis:// without {TLS_VAR} for a plain one"
    )


def _explain(exc: ssl.SSLError, ssl: Any, where: str) -> str:
    head = f"TLS to the broker {where} failed"
    if isinstance(exc, ssl.SSLCertVerificationError):
        message = str(exc.verify_message or exc.reason or "certificate verify failed")
        if "hostname" in message.lower() or "ip address mismatch" in message.lower():
            return (f"{head}: its certificate does not name the host ({message}); connect by a name it lists, "
                    f"or set {CHECK_HOSTNAME_VAR}=false")
        if any(word in message.lower() for word in ("issuer", "self-signed", "self signed", "unable to get")):
            return f"{head}: its certificate does not verify ({message}); set {CA_FILE_VAR} to the CA that signed it"
        return f"{head}: its certificate does not verify ({message}); check the broker's certificate"
    reason = str(exc.reason or "")
    if reason in ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG",
                  "RECORD_LAYER_FAILURE"):
        return (f"{head}: the server does not speak TLS there ({reason}); use its TLS port, or redis:// "
                f"without {TLS_VAR} for a plain one")
    if "CERTIFICATE_REQUIRED" in reason:
        return f"{head}: the broker requires a client certificate ({reason}); set {CERT_FILE_VAR} and {KEY_FILE_VAR}"
    if "ALERT" in reason and ("CERTIFICATE" in reason or "UNKNOWN_CA" in reason):
        return (f"{head}: the broker refused the client certificate ({reason}); check {CERT_FILE_VAR} / "
                f"{KEY_FILE_VAR} against the CA the broker trusts")
    return f"{head} ({reason or str(exc).splitlines()[0]})"
