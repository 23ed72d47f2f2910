"""How a tap's batches reach the broker: three transports behind one ``send(batch)``.

The publisher (``publisher.py``) keeps what every transport shares: seqs, the spool, pacing,
retries and their log lines. A transport only turns spooled records into its kind of batch
(``batch_of``) and sends one batch, raising one of its ``retryable`` errors when the broker did not
take it (the publisher then retries the same batch):

- ``RespTransport``: a single node. The batch is hand-built RESP XADD commands
  (``services/tap/resp.py``, byte-equivalent to redis-py's) sent in one write, on the tap's own
  connection (``services/tap/conn.py``: redis-py is never imported) or on a connection of a given
  plain ``redis.Redis`` client (the importer's). ``packed``: the publisher keeps recent commands
  in memory, so a batch is not read back from the spool.
- ``ClusterTransport``: redis-py's ``RedisCluster`` (imported only then); the batch is field maps
  sent by ``xadd_batch`` (slot routing, MOVED handling).
- ``GatewayTransport``: an ingest gateway over HTTP (``services/tap/http_transport.py``,
  docs/gateway.md); the batch is the spool records themselves.

With ``REDIS_WAIT_REPLICAS`` the Redis transports also WAIT for replicas before a batch counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from services.broker.url import BrokerTLSError, target, tls_options
from services.settings import Settings
from services.tap.conn import BrokerError, ReplicationShortfall, ReplyError, RespConnection
from services.tap.resp import command as resp_command
from services.tap.resp import xadd_commands
from services.tap.spool import decode_record

if TYPE_CHECKING:
    from services.tap.http_transport import HttpTransport

RECV_BYTES = 65536
# The own connection's timeouts: a hung broker must not hold a batch forever (then: spool and retry).
SOCKET_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 2.0
# A TLS failure mid-run (the broker's certificate replaced) is retried like an outage, its reason
# logged; at start the tap's credential check already refused it (one line, exit 2).
BASE_RETRYABLE: tuple[type[BaseException], ...] = (OSError, BrokerError, BrokerTLSError)


class Transport(Protocol):
    """One way to the broker. ``send`` is called from the publisher's sender thread only."""

    # Batches are encoded XADD commands (``RespTransport``): the publisher may build them as it spools.
    packed: bool
    # What ``send`` raises when the batch was not taken and may be sent again.
    retryable: tuple[type[BaseException], ...]
    # Where the batches go (log lines redact it; None: no broker URL configured).
    url: str | None
    # What the log lines call it, and it while it does not take batches: an agent host through a gateway
    # has no broker to name, and a gateway answering 503 or 429 is not unreachable.
    noun: str
    down: str

    def batch_of(self, raws: list[bytes]) -> Any:
        """The batch that sends these spool records."""

    def send(self, batch: Any) -> None:
        """Send one batch; return only when the broker took all of it."""

    def close(self) -> None: ...


class RespTransport:
    """A single node: hand-built RESP XADDs in one write, on the tap's own connection or a given client's."""

    packed = True
    noun = "broker"
    down = "unreachable"

    def __init__(self, settings: Settings, stream_key: bytes, client: Any = None) -> None:
        self.settings = settings
        self.url = settings.redis_url
        self._stream_key = stream_key
        self.retryable = BASE_RETRYABLE
        self.client = client
        self.conn: RespConnection | None = None
        if client is None:
            self.conn = RespConnection(target(settings), connect_timeout=CONNECT_TIMEOUT_S,
                                       socket_timeout=SOCKET_TIMEOUT_S, tls=tls_options(settings))
        else:
            import redis

            self.retryable += (redis.RedisError,)

    def batch_of(self, raws: list[bytes]) -> list[bytes]:
        return xadd_commands(self._stream_key, raws)

    def send(self, batch: list[bytes]) -> None:
        """Send the XADDs (plus WAIT when configured) in one write; read all their replies.

        Any failure drops the connection (a half-read pipeline must never be reused); the caller retries."""
        n = len(batch)
        wait = self.settings.redis_wait_replicas
        payload = batch
        if wait:
            payload = [*batch, resp_command(b"WAIT", str(wait).encode(),
                                            str(self.settings.redis_wait_timeout_ms).encode())]
        expected = n + (1 if wait else 0)
        if self.conn is not None:
            replies = self.conn.pipeline(payload, expected)
        else:
            replies = self._redis_py_pipeline(b"".join(payload), expected)
        for reply in replies[:n]:
            if isinstance(reply, ReplyError):
                raise reply
        if wait:
            acked = replies[-1]
            if isinstance(acked, ReplyError):
                raise acked
            if int(acked) < wait:  # type: ignore[call-overload]
                raise ReplicationShortfall(
                    f"{acked} of {wait} replicas acknowledged within {self.settings.redis_wait_timeout_ms} ms")

    def _redis_py_pipeline(self, payload: bytes, expected: int) -> list[object]:
        """`RespConnection.pipeline` on a connection of a given redis-py client (the importer's)."""
        import hiredis  # redis-py's own optional parser (installed with redis[hiredis])
        import redis

        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([payload])  # a list: one sendall of the whole pipeline
            # redis-py's connection has no public "read N raw replies"; its socket and hiredis' reader do it
            # without a Python call per reply.
            sock = conn._sock
            if sock is None:  # pragma: no cover - send_packed_command connects or raises
                raise redis.ConnectionError("not connected")
            reader = hiredis.Reader(replyError=ReplyError)
            replies: list[object] = []
            while len(replies) < expected:
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        raise redis.ConnectionError("the broker closed the connection")
                    reader.feed(data)
                    continue
                replies.append(reply)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return replies

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()  # a given client is its owner's to close


class ClusterTransport:
    """redis-py's client (a ``RedisCluster``, or any client that is no plain ``redis.Redis``): field
    maps through ``xadd_batch``."""

    packed = False
    noun = "broker"
    down = "unreachable"

    def __init__(self, settings: Settings, stream_key: str, client: Any = None) -> None:
        import redis

        from services.broker.connect import sync_client_with_timeouts

        self.settings = settings
        self.url = settings.redis_url
        self._stream_key = stream_key
        self.retryable = (*BASE_RETRYABLE, redis.RedisError)
        self._own = client is None
        self.client = client if client is not None else sync_client_with_timeouts(
            settings, socket_timeout=SOCKET_TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S)

    def batch_of(self, raws: list[bytes]) -> list[Mapping[str, Any]]:
        return [decode_record(r) for r in raws]

    def send(self, batch: list[Mapping[str, Any]]) -> None:
        from services.broker.cluster import xadd_batch  # cluster clients only: redis-py is loaded

        xadd_batch(self.client, self._stream_key, batch, self.settings.redis_wait_replicas,
                   self.settings.redis_wait_timeout_ms)

    def close(self) -> None:
        if self._own:
            try:
                self.client.close()
            except Exception:
                pass


class GatewayTransport:
    """An ingest gateway (docs/gateway.md): the spool records as they are, over HTTP."""

    packed = False
    retryable = BASE_RETRYABLE
    noun = "gateway"
    down = "out of service"

    def __init__(self, settings: Settings) -> None:
        from services.tap.http_transport import HttpTransport

        self.http: HttpTransport = HttpTransport(settings)
        self.url: str | None = self.http.url

    def batch_of(self, raws: list[bytes]) -> list[bytes]:
        return raws

    def send(self, batch: list[bytes]) -> None:
        self.http.send(batch)

    def close(self) -> None:
        self.http.close()


def open_transport(settings: Settings, stream_key: str, client: Any = None) -> Transport:
    """The transport of a publisher: a gateway when an endpoint is configured (and no client given),
    the own RESP connection for a single node, redis-py's for a cluster; a given client keeps the
    hand-built pipeline when it is a plain ``redis.Redis``. Creating one does not connect."""
    if client is None and settings.endpoint:
        return GatewayTransport(settings)
    if client is None and not settings.redis_cluster:
        return RespTransport(settings, stream_key.encode())
    if client is not None:
        import redis

        if isinstance(client, redis.Redis):
            return RespTransport(settings, stream_key.encode(), client)
    return ClusterTransport(settings, stream_key, client)
