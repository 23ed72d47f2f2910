"""Targets a case can break: a collector that goes away and then answers with outage statuses, a
private PostgreSQL cluster that stops, a PostgreSQL behind a slow proxy, an S3 server (moto) that
hangs (SIGSTOP) or answers through a slow proxy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from psycopg.conninfo import make_conninfo

from tests.consumers.harness import (
    ArchiveConsumer,
    Consumer,
    JsonlConsumer,
    OtlpConsumer,
    PostgresConsumer,
    Target,
    World,
)
from tests.support import postgres as postgres_support
from tests.support.otlp_receiver import RunningReceiver
from tests.support.postgres import PrivateCluster
from tests.support.s3_proxy import S3Proxy
from tests.support.s3_server import S3Server
from tests.support.slow_proxy import SlowProxy

Phase = tuple[float, Callable[[], None]]  # (seconds after the outage began, what changes then)
Down = Callable[[float], list[Phase]]  # takes the outage's length
OUTAGE_STATUSES = (401, 403, 404, 429, 503)


def private_cluster() -> AbstractContextManager[PrivateCluster]:
    # its own prefix: other pytest sessions on the machine clean up their own temporary roots
    return postgres_support.private_cluster("goose-contract-pg-")


def _reopen(t: Target, fail_status: int | None) -> None:
    """A receiver on the same port again (the old one's spans carried over), answering `fail_status`."""
    old = t.receiver
    assert old is not None
    port, spans = old.receiver.port, old.receiver.spans
    old.close()
    new = RunningReceiver(port)
    new.receiver.spans.extend(spans)
    new.receiver.fail_status = fail_status
    t.receiver = new


@contextmanager
def outage(c: Consumer, w: World) -> Iterator[tuple[Target, Down, Callable[[], None]]]:
    if isinstance(c, OtlpConsumer):
        with c.target(w) as t:
            def down(length_s: float) -> list[Phase]:
                assert t.receiver is not None
                t.extra["port"] = t.receiver.receiver.port
                t.receiver.close()  # connection refused for 30 s, then each status for an equal share of the rest
                span = max(length_s - 30.0, 0.0) / len(OUTAGE_STATUSES)
                return [(30.0 + i * span, lambda s=s: _reopen(t, s)) for i, s in enumerate(OUTAGE_STATUSES)]

            def up() -> None:
                assert t.receiver is not None
                t.receiver.receiver.fail_status = None

            # the receiver is closed at down(): spans delivered before stay readable through t.receiver
            yield t, down, up
        return
    if isinstance(c, PostgresConsumer):
        with private_cluster() as cluster:
            t = Target(dsn=cluster.dsn)

            def pg_down(length_s: float) -> list[Phase]:
                cluster.stop("fast")
                return []

            yield t, pg_down, cluster.start
        return
    if isinstance(c, ArchiveConsumer):
        with c.target(w) as t:
            s3: S3Server = t.extra["s3"]

            def s3_down(length_s: float) -> list[Phase]:
                s3.pause()  # hangs: what a client meets when a store stops answering (its objects kept)
                return []

            yield t, s3_down, s3.resume
        return
    if isinstance(c, JsonlConsumer):
        with c.target(w) as t:
            where, away = t.extra["dir"], t.extra["dir"].with_name(t.extra["dir"].name + ".away")

            def dir_down(length_s: float) -> list[Phase]:
                where.rename(away)  # the volume gone: nothing can be written, what was written is kept
                return []

            yield t, dir_down, lambda: away.rename(where)
        return
    raise ValueError(f"{c.name} has no external target")


@contextmanager
def slowed(c: Consumer, w: World, delay_s: float) -> Iterator[Target]:
    if isinstance(c, OtlpConsumer):
        with c.target(w) as t:
            t.rx.delay_s = delay_s
            yield t
        return
    if isinstance(c, PostgresConsumer):
        with c.target(w) as t:
            proxy = SlowProxy(5432, delay_s)
            try:
                t.extra["read_dsn"] = t.dsn
                t.dsn = make_conninfo(t.dsn, host="127.0.0.1", port=str(proxy.port))
                yield t
            finally:
                proxy.close()
        return
    if isinstance(c, ArchiveConsumer):
        with c.target(w) as t:
            s3_proxy = S3Proxy(t.extra["s3"].port)  # every S3 request held delay_s (the test reads moto directly)
            s3_proxy.delay_s = delay_s
            try:
                t.extra["endpoint"] = s3_proxy.endpoint
                yield t
            finally:
                s3_proxy.close()
        return
    raise ValueError(f"{c.name} has no external target")
