"""The OTLP exporter's FastStream application: one batch subscriber per topic partition.

Like the worker (services/worker/app.py): batch stream subscribers with manual acks, a parser
that hands the plain field maps through untouched, consumer groups created at id 0 by us
(FastStream would create them at `$`), and a housekeeping task for reclaim, lag gauges and the
root timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from faststream import Context, FastStream
from faststream.redis.message import RedisBatchStreamMessage  # the class (faststream.redis exports an Annotated alias)
from redis.exceptions import RedisError

from services.broker.cluster import make_broker
from services.broker.connect import async_client
from services.export.otlp.mapping import MappingConfig
from services.export.otlp.metrics import OtlpMetrics
from services.export.otlp.processor import Stopping, TraceExporter
from services.export.otlp.sink import SpanSink
from services.metrics import serve
from services.settings import Settings
from services.streams.app_shell import AppRuntime
from services.streams.faststream_adapter import batch_subscriber
from services.streams.names import unique_consumer
from services.streams.readiness import READY, Readiness, fresh, not_ready
from services.streams.watch import ReaderWatch

log = logging.getLogger("goose_ingest.export.otlp")


def consumer_name() -> str:
    return unique_consumer("otlp")


class ExporterHealth:
    """What the exporter's readiness is made of: subscribers running, housekeeping reaching the
    broker, collector and broker not failing; `readiness()` answers with the one `Readiness` type."""

    def __init__(self, settings: Settings, watch: ReaderWatch | None = None) -> None:
        self.settings = settings
        self.watch = watch if watch is not None else ReaderWatch()  # the subscribers: a dead one is not ready
        self.last_ok = 0.0
        self.exporter: TraceExporter | None = None

    def readiness(self) -> Readiness:
        subscribers = self.watch.readiness()
        if not subscribers:
            return subscribers
        if not fresh(self.last_ok, time.monotonic(), self.settings.sweep_interval_s):
            return not_ready("housekeeping has not reached the broker recently")
        if self.exporter is None or not self.exporter.broker_ok:
            return not_ready("the broker refuses the exporter's writes")
        if not self.exporter.collector_ok:
            return not_ready("the collector is unavailable")
        return READY


async def housekeeping(exporter: TraceExporter, readiness: ExporterHealth, settings: Settings) -> None:
    adopted = False
    while True:
        try:
            await exporter.client.ping()
            if not adopted:  # here, not at start: a broker refusing writes must not stop the start
                await exporter.adopt_legacy_state()
                adopted = True
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
        exporter.metrics.ready.set(1 if readiness.readiness() else 0)
        await asyncio.sleep(settings.sweep_interval_s)


@dataclass(kw_only=True)
class ExporterRuntime(AppRuntime):
    """The live parts of one exporter process (created at startup); the client, server, watch and
    tasks are the shell's (services/streams/app_shell.py)."""

    consumer: str
    readiness: ExporterHealth
    metrics: OtlpMetrics
    exporter: TraceExporter | None = None


def build_app(
    settings: Settings, sink: SpanSink, cfg: MappingConfig, metrics: OtlpMetrics | None = None
) -> tuple[FastStream, ExporterRuntime]:
    broker = make_broker(settings, log_level=logging.DEBUG)
    app = FastStream(broker, logger=log)
    health = ExporterHealth(settings)  # its watch is the shell's: a dead subscriber is not ready
    runtime = ExporterRuntime(consumer=consumer_name(), readiness=health, watch=health.watch,
                              metrics=metrics if metrics is not None else OtlpMetrics())
    consumer, readiness, metrics = runtime.consumer, runtime.readiness, runtime.metrics

    async def handle(message: RedisBatchStreamMessage = Context("message")) -> None:  # noqa: B008 (FastStream DI)
        raw = message.raw_message
        exporter = runtime.exporter
        assert exporter is not None  # set at startup, before any subscriber reads
        stream = raw["channel"]
        stream = stream.decode() if isinstance(stream, bytes) else stream
        try:
            await exporter.handler_for(stream)(stream, raw["message_ids"], raw["data"])
        except Stopping:
            log.info("shutting down with a batch of %s unexported: left pending for any replica", stream)

    for stream in settings.layout.events_partitions() + settings.layout.runs_partitions():
        # plain fields handed over untouched; acked by the exporter once the spans are accepted
        sub = batch_subscriber(broker, stream, group=settings.otlp_group, consumer=consumer,
                               batch_size=settings.batch_size, block_ms=settings.block_ms, handle=handle,
                               client=lambda: runtime.client, started=runtime.all_started)
        runtime.watch.add(stream, sub)

    @app.on_startup
    async def _startup() -> None:
        client = runtime.client = async_client(settings)
        exporter = runtime.exporter = TraceExporter(settings, client, sink, cfg, metrics, consumer)
        await exporter.ensure_groups()
        readiness.exporter = exporter
        readiness.last_ok = time.monotonic()
        runtime.server = serve(metrics, settings.metrics_host, settings.metrics_port, readiness.readiness)  # type: ignore[arg-type]

    @app.after_startup
    async def _after() -> None:
        assert runtime.exporter is not None
        # a subscriber that dies on its own: /readyz says so and the exporter exits 1 (the shell's watch)
        runtime.started(app, housekeeping(runtime.exporter, readiness, settings))

    @app.on_shutdown
    async def _shutdown() -> None:
        if runtime.exporter is not None:
            runtime.exporter.stopping.set()  # a batch waiting for the collector gives up, unacked
        await runtime.stopping()  # subscribers already stopped here died on their own: exit 1

    @app.after_shutdown
    async def _closed() -> None:
        await runtime.closed()
        sink.close()

    return app, runtime
