"""services/tap/transports.py: which transport a publisher gets, and that each sends one batch of
spool records as the broker (or gateway) stores them. Real Redis; DEFAULT settings otherwise."""

from __future__ import annotations

import redis

from services.settings import Settings
from services.tap.publisher import LineEncoder
from services.tap.transports import ClusterTransport, GatewayTransport, RespTransport, open_transport


def _records(stream: bytes, n: int) -> list[bytes]:
    encoder = LineEncoder("test/transport", stream, {"host": "h"})
    return [encoder.record(i, 1000 + i, b"line %d" % i, "stdout") for i in range(n)]


def test_a_single_node_gets_the_own_resp_connection_and_a_given_plain_client_keeps_the_pipeline(settings):
    own = open_transport(settings, "s")
    try:
        assert type(own) is RespTransport and own.packed and own.conn is not None
    finally:
        own.close()
    client = redis.Redis.from_url(settings.redis_url)
    try:
        given = open_transport(settings, "s", client)
        assert type(given) is RespTransport and given.conn is None and redis.RedisError in given.retryable
        given.close()
        assert client.ping()  # a given client is its owner's to close
    finally:
        client.close()


def test_an_endpoint_gets_the_gateway_transport():
    s = Settings(endpoint="http://127.0.0.1:9/ingest", token="t" * 32)
    transport = open_transport(s, "s")
    try:
        assert type(transport) is GatewayTransport and not transport.packed
        raws = [b"a", b"b"]
        assert transport.batch_of(raws) is raws  # the records as spooled
    finally:
        transport.close()


def test_each_redis_transport_sends_one_batch_of_spool_records_exactly(settings):
    stream = settings.layout.raw_stream(0)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        for transport in (open_transport(settings, stream), ClusterTransport(settings, stream, client)):
            client.delete(stream)
            records = _records(stream.encode(), 5)
            transport.send(transport.batch_of(records))
            got = client.xrange(stream)
            assert [f[b"line"] for _, f in got] == [b"line %d" % i for i in range(5)]
            assert [f[b"seq"] for _, f in got] == [b"%d" % i for i in range(5)]
            transport.close()
    finally:
        client.delete(stream)
        client.close()
