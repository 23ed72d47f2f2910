"""The single-node tap's own broker connection: one socket, hand-built RESP out, hiredis replies in.

Why not redis-py: importing it costs the tap ~7 MiB of its ~40 MiB budget (redis 8 also loads
OpenTelemetry's metrics API when installed), and the tap needs four commands. The connection does
what redis-py's does on connect, from the same settings (``services/broker/url.py``): TCP with
TCP_NODELAY and keepalive, or a unix socket; TLS via ``ssl`` for ``rediss://`` or
GOOSE_INGEST_REDIS_TLS, with the context of ``url.TlsOptions`` (the same CA, client certificate
and host name check as redis-py's clients); ``AUTH [user] password``; ``SELECT db``. It sends no CLIENT SETINFO / SETNAME (the tap's
ACL role does not allow them; redis-py ignores their refusal).

Errors keep redis-py's meanings, so callers behave as before: an unreachable or dropped broker is
an ``OSError`` (``ConnectionError`` / ``TimeoutError``: spool and retry); refused credentials are
`AuthFailed` and a missing permission `NoPermission` (one line and exit 2 before the command
starts, see ``services/cli.py``); any other error reply is a `ReplyError`. A TLS failure (the
certificate does not verify, the server does not speak TLS, our client certificate is refused) is
``url.BrokerTLSError``, as with redis-py's clients (see ``services/broker/connect.py``).

Cluster mode does not use this module (redis-py's RedisCluster routes by slot).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

import hiredis

from services.broker.url import is_db_out_of_range, no_such_database
from services.tap.resp import command

if TYPE_CHECKING:
    import ssl

    from services.broker.url import BrokerTarget, TlsOptions

RECV_BYTES = 65536


class BrokerError(Exception):
    """A broker answer that is not a success (the counterpart of redis-py's RedisError)."""


class ReplyError(BrokerError):
    """An error reply (``-ERR ...``, ``-WRONGTYPE ...``)."""


class AuthFailed(ReplyError):
    """The broker refused the credentials (WRONGPASS, NOAUTH, AUTH without a configured password)."""


class NoPermission(ReplyError):
    """The user lacks a permission the command needs (NOPERM)."""


class ReplicationShortfall(BrokerError):
    """Fewer replicas than REDIS_WAIT_REPLICAS acknowledged a batch in time: it counts as not sent."""


def classify(message: str, during_auth: bool = False) -> ReplyError:
    """The error for an error reply, by its code (as redis-py's parser maps them)."""
    if message.startswith("NOPERM"):
        return NoPermission(message)
    if during_auth or message.startswith(("WRONGPASS", "NOAUTH")):
        return AuthFailed(message)
    return ReplyError(message)


class RespConnection:
    """One lazily (re)connected socket to one Redis node. Not thread-safe: one owner thread at a time.

    Any failure closes the socket (a half-read pipeline must never be reused); the next call
    connects again."""

    def __init__(self, target: BrokerTarget, *, connect_timeout: float, socket_timeout: float | None,
                 tls: TlsOptions | None = None) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout
        self.tls = tls  # None with a TLS target: the system's CAs, no client certificate
        self._tls_context: ssl.SSLContext | None = None  # built once: loading the CAs costs ~ms
        self._sock: socket.socket | None = None
        # a TLS handshake completed and nothing answered yet: a close now is a refused client certificate
        self._unanswered = False
        # One receive buffer for the connection's life: recv(64 kB) would allocate 64 kB per reply
        # batch and shrink it to the few bytes that came, which fragments the heap (RSS grew ~40 kB/s
        # at 10,000 lines/s).
        self._buf = bytearray(RECV_BYTES)

    # --- connection ------------------------------------------------------------------------
    def _open_socket(self) -> socket.socket:
        t = self.target
        if t.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.connect_timeout)
                sock.connect(t.socket_path)
            except BaseException:
                sock.close()
                raise
            return sock
        seed = t.seeds[0]
        sock = socket.create_connection((seed.host, seed.port), timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if t.tls:
                from services.broker.url import TlsOptions

                if self._tls_context is None:
                    self._tls_context = (self.tls or TlsOptions()).context()
                try:
                    sock = self._tls_context.wrap_socket(sock, server_hostname=seed.host)
                except TimeoutError:  # TCP was accepted but no handshake followed: a plain port
                    from services.broker.url import tls_handshake_timeout

                    raise tls_handshake_timeout(str(seed), self.connect_timeout) from None
        except BaseException:
            sock.close()
            raise
        return sock

    def _tls_failure(self, exc: OSError) -> Exception:
        """`exc`, or the BrokerTLSError it stands for (the same one line as redis-py's clients give)."""
        if not self.target.tls:
            return exc
        from services.broker.url import tls_failure

        without_cert = not (self.tls is not None and self.tls.cert_file)
        return tls_failure(exc, str(self.target.seeds[0]), closed_after_handshake=self._unanswered and without_cert) or exc

    def connect(self) -> None:
        """Connect, authenticate and select the database (no-op when connected)."""
        if self._sock is not None:
            return
        try:
            self._connect()
        except OSError as exc:
            failure = self._tls_failure(exc)
            if failure is exc:
                raise
            raise failure from None

    def _connect(self) -> None:
        t = self.target
        self._unanswered = False
        self._sock = self._open_socket()
        self._unanswered = t.tls
        try:
            self._sock.settimeout(self.socket_timeout)
            handshake = b""
            authenticates = bool(t.username or t.password)  # as redis-py: an empty password sends no AUTH
            if authenticates:
                # as redis-py: AUTH user password with a user, else AUTH password
                user = [t.username.encode()] if t.username else []
                handshake += command(b"AUTH", *user, (t.password or "").encode())
            if t.db:
                handshake += command(b"SELECT", str(t.db).encode())
            if handshake:
                replies = self._exchange([handshake], int(authenticates) + int(bool(t.db)))
                self._unanswered = False
                for i, reply in enumerate(replies):
                    if isinstance(reply, ReplyError):
                        if is_db_out_of_range(reply):  # a wrong URL, not an outage: never spool for it
                            raise no_such_database(t.url_without_credentials, str(reply))
                        raise classify(str(reply), during_auth=authenticates and i == 0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    @property
    def local_address(self) -> tuple[str, int] | str | None:
        """The socket's own address while connected (tests find the connection in CLIENT LIST with it)."""
        return self._sock.getsockname() if self._sock is not None else None

    # --- commands --------------------------------------------------------------------------
    def _exchange(self, parts: Sequence[bytes], expected: int) -> list[object]:
        """Send the commands ``parts`` in one write and read ``expected`` replies; error replies are
        returned as `ReplyError` values, not raised (the caller decides which ones matter)."""
        sock = self._sock
        if sock is None:  # pragma: no cover - callers connect first
            raise ConnectionError("not connected")
        sock.sendall(parts[0] if len(parts) == 1 else b"".join(parts))
        reader = hiredis.Reader(replyError=ReplyError)
        buf = self._buf
        replies: list[object] = []
        while len(replies) < expected:
            reply = reader.gets()
            if reply is False:
                got = sock.recv_into(buf)
                if not got:
                    raise ConnectionError("the broker closed the connection")
                reader.feed(buf, 0, got)  # type: ignore[arg-type]  # any buffer works; the stubs say bytes
                continue
            replies.append(reply)
        return replies

    def pipeline(self, parts: Sequence[bytes], expected: int) -> list[object]:
        """Send pre-encoded commands in one write and return their ``expected`` replies, error replies
        as `ReplyError` values. Any failure (I/O or protocol) drops the connection and raises."""
        self.connect()
        try:
            replies = self._exchange(parts, expected)
            self._unanswered = False
            return replies
        except OSError as exc:
            # TLS 1.3 reports a refused client certificate at the first read, not in the handshake
            self.close()
            failure = self._tls_failure(exc)
            if failure is exc:
                raise
            raise failure from None
        except BaseException:
            self.close()
            raise

    def execute(self, *args: bytes | str) -> object:
        """One command; raises its error reply (`AuthFailed`, `NoPermission` or `ReplyError`)."""
        parts = [a.encode() if isinstance(a, str) else a for a in args]
        (reply,) = self.pipeline([command(*parts)], 1)
        if isinstance(reply, ReplyError):
            raise classify(str(reply))
        return reply

    # the two hash calls services/broker/facts.py needs, in redis-py's shapes
    def hgetall(self, key: str) -> dict[bytes, bytes]:
        flat = self.execute("HGETALL", key)
        if not isinstance(flat, list):
            raise ReplyError(f"HGETALL answered {type(flat).__name__}")
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def hsetnx(self, key: str, field: str, value: str) -> object:
        return self.execute("HSETNX", key, field, value)
