"""The plain loop a sink of the topics runs on: read a batch, have the sink write it, acknowledge it.

A sink supplies only its target (bytewax's shape): `write_batch(entries) -> dead letters`, which
raises OSError-like `TargetDown` while the target cannot take the batch, and `close()`. Everything
else is here and the same for every sink built on it (`export jsonl`; issue 33 item 3):

- reading through `GroupReader` (services/streams/reader.py): own pending entries first after a
  (re)start, the sweep every SWEEP_INTERVAL_S that claims what a dead consumer left and
  dead-letters poison (`max-deliveries`), the group recreated at 0 after NOGROUP;
- the batch is written while it is held (the sweep never claims it back), retried with backoff
  while the target is down -- nothing acknowledged, readiness false with the target's reason;
- then one acknowledgement per shard, with the sink's dead letters (deadletter_ack.lua: a dead
  letter exists iff its entry is acknowledged, old dead letters trimmed by age), retried in place
  while the broker refuses it;
- a broker away: readiness false, positions back to the own pending entries, backoff.

A crash between the write and the acknowledgement re-delivers the batch: `write_batch` must be
idempotent on (stream, entry id). Single-threaded: a sink whose target benefits from overlapping
reads and writes keeps its own loop (`export postgres`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import ResponseError

from contracts.consumers import Consumer
from contracts.deadletters import DeadLetter
from services.backoff import Backoff
from services.broker.errors import describe
from services.settings import Settings
from services.streams.groups import is_nogroup
from services.streams.reader import BROKER_ERRORS, GroupReader, StreamEntry, by_stream
from services.streams.readiness import READY, Readiness, not_ready

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


class TargetDown(Exception):
    """The target cannot take the batch now (its message is /readyz's reason): retried, never dead-lettered."""


class Target(Protocol):
    def write_batch(self, entries: Sequence[StreamEntry], reader: GroupReader) -> list[DeadLetter]: ...

    def close(self) -> None: ...


class SinkMetrics:
    """What /metrics shows of a sink on this loop (labels: the registry's names and two outcomes)."""

    def __init__(self, sink: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.entries = Counter("goose_ingest_sink_entries_total", "Topic entries a sink acknowledged, by outcome "
                               "(written: in the target, dead_lettered: in its dead-letter stream).",
                               ["sink", "outcome"], registry=self.registry)
        self.written, self.dead = self.entries.labels(sink, "written"), self.entries.labels(sink, "dead_lettered")


class BatchSink:
    def __init__(self, row: Consumer, settings: Settings, client: Any, target: Target, group: str, consumer: str,
                 log: logging.Logger) -> None:
        layout = settings.layout
        self.settings, self.target, self.log = settings, target, log
        self.shards = [[e, r] for e, r in zip(layout.events_partitions(), layout.runs_partitions(), strict=True)]
        self.reader = GroupReader(client, self.shards, group, consumer, max_deliveries=settings.max_deliveries,
                                  claim_idle_ms=settings.claim_idle_ms, exporter=row.name, logger=log,
                                  deadletter_stream=lambda shard: layout.export_deadletter_partition(row.name, shard),
                                  deadletter_retention_hours=settings.deadletter_keep_hours)
        self.stopping = threading.Event()
        self.why: dict[str, str] = {"broker": "connecting to the broker"}  # side -> why not ready
        self._last_sweep = 0.0
        self.metrics = SinkMetrics(row.name)

    def readiness(self) -> Readiness:
        if self.stopping.is_set():
            return not_ready("stopping")
        return not_ready("; ".join(self.why.values())) if self.why else READY

    def stop(self) -> None:
        self.stopping.set()

    def fault(self) -> None:
        """Nothing ends this loop but a stop: an outage of the broker or the target is waited out."""
        return None

    def run(self) -> None:
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
        while not self.stopping.is_set():
            try:
                entries = self._sweep() or self._read()
                self.why.pop("broker", None)
                backoff.reset()
                if entries and not self._deliver(entries):
                    return
                continue
            except BROKER_ERRORS as exc:
                self.why["broker"] = f"broker unreachable ({type(exc).__name__})"
                self.log.warning("broker unreachable (%s); retrying in %.1fs", type(exc).__name__, backoff.delay)
            except ResponseError as exc:  # NOGROUP: the broker lost the group; recreated at 0, re-read
                self.why["broker"] = f"broker refused a read ({describe(exc)})"
                self.log.warning("%s; reading again from the group's start", "consumer group missing"
                                 if is_nogroup(exc) else f"broker refused a read: {describe(exc)}")
            self.reader.reset()
            if self.stopping.wait(backoff.next()):
                return

    def _sweep(self) -> list[StreamEntry]:
        if time.monotonic() - self._last_sweep < self.settings.sweep_interval_s:
            return []
        self._last_sweep = time.monotonic()
        return self.reader.sweep(self.settings.batch_size).claimed

    def _read(self) -> list[StreamEntry]:
        out: list[StreamEntry] = []
        single, catching_up = len(self.shards) == 1, self.reader.catching_up
        for pair in self.shards:
            block = self.settings.block_ms if single and not catching_up else None
            out += self.reader.read(pair, self.settings.batch_size, block).entries
        if not out and not single and not catching_up:
            self.stopping.wait(self.settings.block_ms / 1000)  # a cluster is read shard by shard without BLOCK
        return out

    def _deliver(self, entries: list[StreamEntry]) -> bool:
        """Write (retried while the target is down), then acknowledge. False when stopping first."""
        backoff = Backoff(BACKOFF_START_S, BACKOFF_MAX_S)
        while True:
            try:
                dead = self.target.write_batch(entries, self.reader)
                self.why.pop("target", None)
                break
            except TargetDown as exc:
                self.why["target"] = str(exc)
                self.log.warning("%s; retrying in %.1fs", exc, backoff.delay)
            if self.stopping.wait(backoff.next()):
                return False
        if not self.reader.ack_in_place(by_stream(entries), dead, self.stopping, self._refused,
                                        Backoff(BACKOFF_START_S, BACKOFF_MAX_S)):
            return False
        self.why.pop("broker", None)
        self.metrics.written.inc(len(entries) - len(dead))
        self.metrics.dead.inc(len(dead))
        return True

    def _refused(self, exc: BaseException, backoff: float) -> None:
        self.why["broker"] = f"broker refuses the acknowledgement ({describe(exc)})"
        self.log.warning("%s; retrying in %.1fs", self.why["broker"], backoff)


def serve(row: Consumer, settings: Settings, target: Target, group: str, consumer: str, log: logging.Logger) -> int:
    """Run a sink of this loop as its command does, on the thread consumers' shell
    (services/streams/thread_shell.py: /healthz at once, the broker checked, signals, the reader
    thread watched); the target is closed at the end."""
    from services.streams import thread_shell

    layout = settings.layout
    return thread_shell.serve(
        row.command, settings, log, awaiting="connecting to the broker",
        streams=[layout.events_topic, layout.runs_topic],
        build=lambda client: BatchSink(row, settings, client, target, group, consumer, log),
        metrics=lambda sink: sink.metrics, describe=lambda sink: f"group {group}, consumer {consumer}",
        stopping="finishing the current batch", close=target.close)
