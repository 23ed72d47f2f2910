"""The FastStream application: one batch subscriber per raw shard, plus housekeeping."""

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
from faststream.redis import RedisBroker, StreamSub
from faststream.redis.message import RedisBatchStreamMessage

from services.broker.connect import async_client, connection_kwargs, require_url
from services.metrics import Metrics, serve
from services.settings import Settings
from services.broker.groups import ensure_groups
from services.worker.batch import BatchProcessor
from services.worker.reporting import record_result
from services.worker.housekeeping import Housekeeper

log = logging.getLogger("goose_ingest.worker")


def consumer_name() -> str:
    # Unique per process so a restarted worker never inherits a dead one's identity by accident.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def build_app(settings: Settings, metrics: Metrics | None = None) -> tuple[FastStream, dict]:
    """The worker app and a dict of its live parts (client, processor, housekeeper) for tests."""
    url = require_url(settings)
    # Per-batch log lines only at DEBUG: at INFO they cost ~15% (measured here).
    broker = RedisBroker(url, **connection_kwargs(settings), log_level=logging.DEBUG)
    app = FastStream(broker, logger=log)
    consumer = consumer_name()
    parts: dict[str, Any] = {"consumer": consumer}

    async def parse(raw: Any) -> RedisBatchStreamMessage:
        # The raw entries are plain fields, not FastStream envelopes: hand them over untouched
        # instead of letting FastStream JSON-decode and re-encode every entry.
        return RedisBatchStreamMessage(raw_message=raw, body=b"", consumer=consumer, group=settings.group)

    async def decode(msg: Any) -> None:
        return None

    async def handle(message: RedisBatchStreamMessage = Context("message")) -> None:
        raw = message.raw_message
        processor: BatchProcessor = parts["processor"]
        started = time.perf_counter()
        result = await processor.process(raw["channel"], raw["message_ids"], raw["data"])
        record_result(metrics, result, time.perf_counter() - started, len(raw["message_ids"]))

    for stream in settings.raw_streams():
        sub = broker.subscriber(
            stream=StreamSub(
                stream,
                group=settings.group,
                consumer=consumer,
                batch=True,
                max_records=settings.batch_size,
                polling_interval=settings.block_ms,
            ),
            parser=parse,
            decoder=decode,
            ack_policy=AckPolicy.MANUAL,  # the commit script acknowledges, atomically with its outputs
        )
        sub(handle)

    @app.on_startup
    async def _startup() -> None:
        client = async_client(settings)
        parts["client"] = client
        await ensure_groups(client, settings)
        parts["processor"] = BatchProcessor(settings, client)
        if metrics is not None and parts["processor"].redactor is not None:
            metrics.known_rules = parts["processor"].redactor.rule_names
        housekeeper = Housekeeper(settings, client, parts["processor"], consumer, metrics)
        parts["housekeeper"] = housekeeper
        if metrics is not None:
            parts["server"] = serve(metrics, settings.metrics_host, settings.metrics_port, housekeeper.is_ready)

    @app.after_startup
    async def _after() -> None:
        parts["task"] = asyncio.create_task(parts["housekeeper"].run())
        parts["housekeeper"].subscribers_running = True

    @app.on_shutdown
    async def _shutdown() -> None:
        housekeeper = parts.get("housekeeper")
        if housekeeper is not None:
            housekeeper.subscribers_running = False
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

    return app, parts
