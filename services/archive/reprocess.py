"""`goose-ingest reprocess`: rebuild the events of a time window from the log of record with the
CURRENT normalizer and redaction settings, and publish them for the exporters (docs/archive-replay.md,
"Reprocessing").

Design:
- The input is the same as `replay`'s: the archive's raw segments merged with what Redis still
  holds (services/archive/reader.py), the runs with a raw entry in the window, each rebuilt whole by
  the very function replay uses (services/sequencer/rebuild.py) with this process's settings. So a
  redaction rule added today, or a better normalizer, reaches yesterday's runs.
- The output goes to a topic set of its own, `<EVENTS_TOPIC>.reprocessed` and
  `<RUNS_TOPIC>.reprocessed` (partitions and per-type topics as the live ones), never to the live
  topics: consumers of the live topics (tail, dashboards, an OTLP exporter) would otherwise see a
  run's events a second time, out of order with the live runs. An exporter is pointed at the
  reprocessed set by its topic settings (GOOSE_INGEST_EVENTS_TOPIC / _RUNS_TOPIC); the names sit
  under the live ones, so the exporters' ACL users (`harness.events.*`) may already read them.
- Idempotence comes from the contract: event ids are `<runId>:<seq>` and a rebuild assigns the same
  seqs, so a consumer that keys by event id (the PostgreSQL sink: `(run_key, seq, ts)`) replaces the
  old row instead of adding one. Reprocessing twice publishes twice and changes nothing more.
- A run whose first entry (seq 0) was not read (it began more than a day before `--since`, or its
  start is gone from both Redis and the archive) is skipped and named: republishing it from half
  its log would overwrite good rows with wrong events.
- A corrupt archive segment stops the command BEFORE anything is published (the runs it held would
  be rebuilt from half their entries, and their published events would be wrong); it is named on
  stderr. `--allow-corrupt` publishes the rest anyway.

`outputs()` is pure (events and records -> stream entries); `reprocess()` is the shell.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from contracts.keys import KeyLayout
from contracts.topics import TopicEntry
from services.archive import reader
from services.archive.window import Window
from services.normalizer import Limits
from services.sequencer.rebuild import Rebuilt, rebuild
from services.settings import ConfigError, Settings

SUFFIX = "reprocessed"  # <EVENTS_TOPIC>.reprocessed, <RUNS_TOPIC>.reprocessed
PIPELINE_ENTRIES = 1000  # XADDs per round trip


@dataclass(frozen=True)
class Output:
    """One topic entry to write: the stream and its fields, exactly as the worker writes them."""

    stream: str
    fields: dict[bytes, bytes]


@dataclass
class Report:
    window: Window
    runs: int = 0
    events: int = 0
    records: int = 0
    entries_read: int = 0
    segments: int = 0
    corrupt: list[reader.Corrupt] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)  # runs skipped: their start was not read
    published: bool = False
    events_topic: str = ""
    runs_topic: str = ""


def reprocessed_layout(settings: Settings, events_topic: str | None = None, runs_topic: str | None = None) -> KeyLayout:
    """The layout whose topics are the reprocessed set (everything else as the live one)."""
    return settings.model_copy(update={
        "events_topic": events_topic or f"{settings.events_topic}.{SUFFIX}",
        "runs_topic": runs_topic or f"{settings.runs_topic}.{SUFFIX}",
    }).layout


def outputs(rebuilt: Rebuilt, layout: KeyLayout) -> list[Output]:
    """The topic entries of the rebuilt runs: every event to the events topic and its type's topic,
    every record to the runs topic, in the run's partition, with the worker's fields."""
    out: list[Output] = []
    for run in sorted(rebuilt.events):
        shard = layout.shard_of(run)
        for event in rebuilt.events[run]:
            fields = TopicEntry.of_event(event).to_fields()  # the one encoder (contracts/topics.py)
            out.append(Output(layout.events_partition(shard), fields))
            out.append(Output(layout.type_partition(event["type"], shard), fields))
        for record in rebuilt.records.get(run, []):
            out.append(Output(layout.runs_partition(shard), TopicEntry.of_record(record).to_fields()))
    return out


def publish(client: Any, items: Iterable[Output], batch: int = PIPELINE_ENTRIES) -> int:
    """XADD every entry, `batch` per round trip (not transactional: a re-run is idempotent)."""
    written = 0
    pipe = client.pipeline(transaction=False)
    pending = 0
    for item in items:
        pipe.xadd(item.stream, item.fields)  # type: ignore[arg-type,unused-ignore]  # bytes keys and values
        pending += 1
        if pending >= batch:
            pipe.execute()
            written += pending
            pending = 0
    if pending:
        pipe.execute()
        written += pending
    return written


def reprocess(settings: Settings, win: Window, client: Any, store: Any, *, events_topic: str | None = None,
              runs_topic: str | None = None, allow_corrupt: bool = False, dry_run: bool = False,
              err: TextIO = sys.stderr) -> Report:
    """Read, rebuild, publish (see the module docstring). `store`: the archive (None: Redis only)."""
    if win.since_ms is None:
        raise ConfigError("reprocess: --since is required (a date, a time, or a time ago such as 24h)")
    report = Report(win)
    # client None: no broker, the archive alone (the command then rebuilds only: dry_run)
    read = reader.read_log(store, reader.redis_log(client, settings.layout) if client is not None else (), win)
    report.segments, report.corrupt = read.segments, read.corrupt
    runs = read.runs or set()
    # A run whose beginning was not read would be republished from half its log, over good rows.
    report.partial = sorted(reader.headless(read.entries, runs))
    runs -= set(report.partial)
    log = reader.log_of(read.entries, runs)
    report.entries_read = len(log)
    for bad in report.corrupt:
        print(f"reprocess: corrupt archive object {bad.key}: {bad.reason}", file=err)
    if report.corrupt and not allow_corrupt:
        return report
    rebuilt = rebuild(log, Limits(settings.max_span_chars, settings.max_pending_tools, settings.max_pending_tool_bytes),
                      settings.max_buffered_entries, None, settings.max_line_bytes, settings.redactor(),
                      settings.max_held_bytes)
    for run in [r for r in rebuilt.events if r not in runs]:  # entries without a run field never make one
        rebuilt.events.pop(run, None)
        rebuilt.records.pop(run, None)
    report.failed = rebuilt.failed
    layout = reprocessed_layout(settings, events_topic, runs_topic)
    report.events_topic, report.runs_topic = layout.key(layout.events_topic), layout.key(layout.runs_topic)
    report.runs = len(rebuilt.events)
    report.events = sum(len(v) for v in rebuilt.events.values())
    report.records = sum(len(v) for v in rebuilt.records.values())
    if not dry_run and client is not None:
        publish(client, outputs(rebuilt, layout))
        report.published = True
    return report
