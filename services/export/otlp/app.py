"""The OTLP exporter's FastStream application: one batch subscriber per topic partition.

Like the worker (services/worker/app.py): batch stream subscribers with manual acks, a parser
that hands the plain field maps through untouched, consumer groups created at id 0 by us
(FastStream would create them at `$`), and a housekeeping task for reclaim, lag gauges and the
root timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any

from faststream import Context, FastStream
from faststream.middlewares import AckPolicy
from faststream.redis import StreamSub
from faststream.redis.message import RedisBatchStreamMessage
from redis.exceptions import RedisError

from services.broker.cluster import make_broker
from services.broker.connect import async_client
from services.export.otlp.mapping import MappingConfig
from services.export.otlp.metrics import OtlpMetrics
from services.export.otlp.processor import Stopping, TraceExporter
from services.export.otlp.sink import SpanSink
from services.metrics import serve
from services.settings import Settings

log = logging.getLogger("goose_ingest.export.otlp")


def consumer_name() -> str:
    return f"otlp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Readiness:
    """Ready = subscribers running, housekeeping reaching the broker, collector not failing."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.subscribers_running = False
        self.last_ok = 0.0
        self.exporter: TraceExporter | None = None

    def __call__(self) -> bool:
        fresh = time.monotonic() - self.last_ok < max(3 * self.settings.sweep_interval_s, 15.0)
        collector = self.exporter is not None and self.exporter.collector_ok
        return self.subscribers_running and fresh and collector


async def housekeeping(exporter: TraceExporter, readiness: Readiness, settings: Settings) -> None:
    while True:
        try:
            await exporter.client.ping()
            for stream in exporter.streams():
                await exporter.reclaim(stream, exporter.handler_for(stream))
            lag = await exporter.gauge()
            if lag == 0:
                # Only without backlog: a run is not silent just because we are behind.
                await exporter.close_idle_roots()
            readiness.last_ok = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Stopping:
            return
        except RedisError as exc:
            log.warning("housekeeping: broker unavailable: %s", type(exc).__name__)
        except Exception:  # a bug here must not stop the exporter's main job
            log.exception("housekeeping failed")
        exporter.metrics.ready.set(1 if readiness() else 0)
        await asyncio.sleep(settings.sweep_interval_s)


def build_app(
    settings: Settings, sink: SpanSink, cfg: MappingConfig, metrics: OtlpMetrics | None = None
) -> tuple[FastStream, dict[str, Any]]:
    metrics = metrics if metrics is not None else OtlpMetrics()
    broker = make_broker(settings, log_level=logging.DEBUG)
    app = FastStream(broker, logger=log)
    consumer = consumer_name()
    readiness = Readiness(settings)
    parts: dict[str, Any] = {"consumer": consumer, "readiness": readiness, "metrics": metrics}

    async def parse(raw: Any) -> RedisBatchStreamMessage:
        # Topic entries are plain fields, not FastStream envelopes: hand them over untouched.
        return RedisBatchStreamMessage(raw_message=raw, body=b"", consumer=consumer, group=settings.otlp_group)  # type: ignore[arg-type]

    async def decode(msg: Any) -> None:
        return None

    async def handle(message: RedisBatchStreamMessage = Context("message")) -> None:  # noqa: B008 (FastStream DI)
        raw = message.raw_message
        exporter: TraceExporter = parts["exporter"]
        stream = raw["channel"]
        stream = stream.decode() if isinstance(stream, bytes) else stream
        try:
            await exporter.handler_for(stream)(stream, raw["message_ids"], raw["data"])
        except Stopping:
            log.info("shutting down with a batch of %s unexported: left pending for any replica", stream)

    for stream in settings.layout.events_partitions() + settings.layout.runs_partitions():
        sub = broker.subscriber(
            stream=StreamSub(
                stream,
                group=settings.otlp_group,
                consumer=consumer,
                batch=True,
                max_records=settings.batch_size,
                polling_interval=settings.block_ms,
            ),
            parser=parse,
            decoder=decode,
            ack_policy=AckPolicy.MANUAL,  # acked by the exporter once the spans are accepted
        )
        sub(handle)

    @app.on_startup
    async def _startup() -> None:
        client = async_client(settings)
        parts["client"] = client
        exporter = TraceExporter(settings, client, sink, cfg, metrics, consumer)
        await exporter.ensure_groups()
        parts["exporter"] = exporter
        readiness.exporter = exporter
        readiness.last_ok = time.monotonic()
        parts["server"] = serve(metrics, settings.metrics_host, settings.metrics_port, readiness)  # type: ignore[arg-type]

    @app.after_startup
    async def _after() -> None:
        readiness.subscribers_running = True
        parts["task"] = asyncio.create_task(housekeeping(parts["exporter"], readiness, settings))

    @app.on_shutdown
    async def _shutdown() -> None:
        readiness.subscribers_running = False
        exporter = parts.get("exporter")
        if exporter is not None:
            exporter.stopping.set()  # a batch waiting for the collector gives up, unacked
        task = parts.get("task")
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    @app.after_shutdown
    async def _closed() -> None:
        server = parts.get("server")
        if server is not None:
            server.close()
        client = parts.get("client")
        if client is not None:
            await client.aclose()
        sink.close()

    return app, parts
