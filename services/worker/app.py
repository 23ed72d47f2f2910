"""The FastStream application: one batch subscriber per raw shard, plus housekeeping.

A Redis that comes back empty (restarted without persistence, flushed) has lost the consumer
groups. FastStream 0.7.8 treats a missing group as terminal (it stops the subscriber and exits
the app with status 0), so every subscriber's read is guarded: on NOGROUP it recreates the group
at id 0 (as at startup) and reads again; the same process carries on. A subscriber that stops for
any other reason makes /readyz say so and the worker exit with status 1 for its supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from faststream import Context, FastStream
from faststream.redis.message import RedisBatchStreamMessage  # the class (faststream.redis exports an Annotated alias)
from redis.exceptions import RedisError

from services.backoff import Backoff
from services.broker.cluster import BrokerGate, make_broker
from services.broker.connect import async_client
from services.broker.errors import describe, is_outage
from services.metrics import Metrics, serve
from services.settings import Settings
from services.streams.app_shell import AppRuntime
from services.streams.faststream_adapter import batch_subscriber, gate_reads
from services.streams.groups import START_RETRY_MAX_S, START_RETRY_S, ensure_groups
from services.streams.names import unique_consumer
from services.streams.readiness import Readiness, not_ready
from services.worker.commit import LeaseLost
from services.worker.housekeeping import Housekeeper
from services.worker.leases import ShardLeases
from services.worker.processor import BatchProcessor
from services.worker.reporting import record_result
from services.worker.spread import Spread

log = logging.getLogger("goose_ingest.worker")


async def open_through_refusals(gate: BrokerGate, client: Any, prepare: Any) -> None:
    """`gate.open` (shard-count record, groups), waiting while the broker refuses the writes for its
    own state (OOM at maxmemory, LOADING, BUSY: `services.broker.errors.is_outage`) instead of
    exiting with a traceback: a worker started into a full Redis starts once memory is freed
    (issue 20 finding 3; found by tests/consumers). /readyz says why meanwhile."""
    backoff = Backoff(START_RETRY_S, START_RETRY_MAX_S)
    while True:
        try:
            await gate.open(client, prepare=prepare)
            return
        except RedisError as exc:
            if not is_outage(exc):
                raise
            reason = f"broker refuses start-up writes ({describe(exc)}); waiting"
            if gate.health.reason != reason:
                log.warning("%s", reason)
            gate.health = not_ready(reason)
        await asyncio.sleep(backoff.next())


def consumer_name() -> str:
    # Unique per process so a restarted worker never inherits a dead one's identity by accident.
    return unique_consumer()


@dataclass(kw_only=True)
class WorkerRuntime(AppRuntime):
    """The live parts of one worker process (created at startup; tests reach them through this);
    the client, server, watch and tasks are the shell's (services/streams/app_shell.py)."""

    settings: Settings
    consumer: str
    processor: BatchProcessor | None = None
    housekeeper: Housekeeper | None = None
    spread: Spread | None = None
    leases: ShardLeases | None = None  # None: shard leases are off (every worker reads every shard)

    @property
    def subscribers(self) -> list[tuple[str, Any]]:
        return self.watch.readers

    def may_read(self, shard: int) -> bool:
        """Leases on: only the shards this worker holds (none before startup took them)."""
        if not self.settings.shard_leases:
            return True
        return self.leases is not None and self.leases.may_read(shard)

    def batch(self, shard: int) -> contextlib.AbstractContextManager[None]:
        return self.leases.batch(shard) if self.leases is not None else contextlib.nullcontext()

    def subscriber_health(self) -> Readiness:
        return self.watch.readiness()


def build_app(settings: Settings, metrics: Metrics | None = None) -> tuple[FastStream, WorkerRuntime]:
    """The worker app and its runtime (client, processor, housekeeper, subscribers)."""
    # Per-batch log lines only at DEBUG: at INFO they cost ~15% (measured here).
    broker = make_broker(settings, log_level=logging.DEBUG)  # RedisClusterBroker in cluster mode
    app = FastStream(broker, logger=log)
    runtime = WorkerRuntime(settings=settings, consumer=consumer_name())
    layout = settings.layout
    shard_of_stream = {stream: shard for shard, stream in enumerate(layout.raw_streams())}

    async def handle(message: RedisBatchStreamMessage = Context("message")) -> None:  # noqa: B008 (FastStream DI)
        raw = message.raw_message
        processor = runtime.processor
        assert processor is not None, "handlers run after startup"
        shard = shard_of_stream[raw["channel"]]
        started = time.perf_counter()
        with runtime.batch(shard):
            try:
                result = await processor.process(shard, raw["message_ids"], raw["data"])
            except LeaseLost:
                # Nothing was written: the entries stay pending, and the shard's new owner claims them.
                log.warning("shard %d moved to another worker during a batch; that worker takes its entries", shard)
                return
        record_result(metrics, result, time.perf_counter() - started, len(raw["message_ids"]))

    for stream in layout.raw_streams():
        # plain fields handed over untouched; commit.lua acknowledges, atomically with the outputs
        sub = batch_subscriber(broker, stream, group=settings.group, consumer=runtime.consumer,
                               batch_size=settings.batch_size, block_ms=settings.block_ms, handle=handle,
                               client=lambda: runtime.client, started=runtime.all_started)
        gate_reads(sub, functools.partial(runtime.may_read, shard_of_stream[stream]), settings.block_ms / 1000)
        runtime.watch.add(stream, sub)

    gate = BrokerGate(settings)  # readiness while a cluster cannot serve every slot (services/broker/cluster.py)

    @app.on_startup
    async def _startup() -> None:
        client = async_client(settings)
        runtime.client = client
        if metrics is not None:  # serving /healthz before waiting: a cluster outage is "not ready", not a crash loop
            runtime.server = serve(metrics, settings.metrics_host, settings.metrics_port, gate.readiness)
        # cluster: until every slot is served; then the shard-count check and the groups (retried
        # through a failover while starting)
        await open_through_refusals(gate, client, lambda: ensure_groups(client, settings))
        processor = runtime.processor = BatchProcessor(
            settings, client, lease_owner=runtime.consumer if settings.shard_leases else None)
        if metrics is not None and processor.redactor is not None:
            metrics.known_rules = processor.redactor.rule_names
        processor.spread = runtime.spread = Spread(client, settings, metrics)  # runs and hosts failing, fleet-wide
        housekeeper = runtime.housekeeper = Housekeeper(settings, client, processor, runtime.consumer, metrics,
                                                        subscribers=runtime.subscriber_health, owns=runtime.may_read)
        gate.then(housekeeper.readiness)
        if settings.shard_leases:
            runtime.leases = ShardLeases(settings, client, runtime.consumer, on_acquire=housekeeper.take_over,
                                         metrics=metrics)
            processor.pulse = runtime.leases.renew_if_due  # renewal between a long batch's steps (leases.py)
            try:
                await runtime.leases.tick()  # this worker's share before its subscribers read
            except RedisError as exc:  # the lease loop tries again; the subscribers wait for a lease
                log.warning("shard leases: broker unavailable at start-up: %s", type(exc).__name__)
            runtime.leases.start_keepalive()  # before a first long batch can hold the loop

    @app.after_startup
    async def _after() -> None:
        assert runtime.housekeeper is not None
        background = [runtime.housekeeper.run()]
        if runtime.leases is not None:
            background.append(runtime.leases.run())
        if runtime.spread is not None:
            background.append(runtime.spread.run())
        if settings.redis_cluster:
            background.append(gate.watch(runtime.client, settings.sweep_interval_s))
        runtime.started(app, *background)

    @app.on_shutdown
    async def _shutdown() -> None:
        # Subscribers still running here: a requested shutdown. Stopped already: they died on their own
        # (unless they never started: a SIGTERM while waiting for the broker is a requested stop too).
        await runtime.stopping()

    @app.after_shutdown
    async def _closed() -> None:
        if runtime.leases is not None:
            runtime.leases.stop_keepalive()  # the run task may never have started (a stop during start-up)
        if runtime.leases is not None and runtime.client is not None:
            # The subscribers have stopped: give the shards back now instead of letting them expire.
            try:
                await runtime.leases.release_all()
            except Exception as exc:  # an unreachable broker: the leases expire on their own
                log.warning("could not give the shard leases back (%s); they expire in %d ms",
                            type(exc).__name__, settings.lease_ttl_ms)
        await runtime.closed()

    return app, runtime
