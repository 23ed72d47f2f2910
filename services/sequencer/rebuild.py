"""Pure rebuild of runs from the raw log, with the same sequencer the workers use.

Input: the raw streams' entries and the control streams' abandon markers, merged in stream-id
order. An abandon marker names exactly the entries its run consists of; entries it excludes are
fed after it (where the live worker met them: after the run had ended), so live processing and
replay agree whatever the timing was.

The rules between the log and a run's sequencer are the worker's own, from one place
(services/sequencer/feed.py): entries are read by ``parse_batch`` (size cap, entry errors), an
entry dead-lettered for its content makes its run report the seq missing when run and seq are
known (``rejected_loss``), an entry read from a shard its run does not belong to (a cluster) is
skipped as the worker dead-letters it (``wrong_shard``), and ``feed`` runs the items. Dead
letters for too many deliveries or failed commits depend on crashes, not on the log.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from contracts.raw import ABANDON
from contracts.stream_ids import StreamId
from services.normalizer import Limits
from services.sequencer import Entry, Rejected, RunSequencer, parse_batch
from services.sequencer.feed import RunItem, feed, rejected_loss, wrong_shard
from services.sequencer.run import DEFAULT_MAX_HELD_BYTES

if TYPE_CHECKING:
    from services.redaction import Redactor


class LogEntry(NamedTuple):
    """One stream entry of the log: its id, its fields, whether it came from a control stream, and
    the raw shard it was read from (None: unknown, the wrong-shard rule is not applied to it)."""

    sid: str
    fields: dict[bytes, bytes]
    control: bool = False
    shard: int | None = None


@dataclass
class Rebuilt:
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run -> events
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    invalid: int = 0
    failed: list[str] = field(default_factory=list)  # runs whose processing raised even entry by entry


def sid_key(sid: str) -> tuple[int, int]:
    """Sort key of a stream id: ids of different streams interleave by (ms, n)."""
    return StreamId.parse(sid)


def merge_log(*streams: list[LogEntry]) -> list[LogEntry]:
    """Entries of several streams (raw shards, control streams) in stream-id order."""
    return sorted((e for s in streams for e in s), key=lambda e: sid_key(e.sid))


def rebuild(entries: Sequence[LogEntry] | Sequence[tuple[str, dict[bytes, bytes]]], limits: Limits, max_buffered: int,
            run: str | None = None, max_bytes: int | None = None, redactor: Redactor | None = None,
            max_held_bytes: int = DEFAULT_MAX_HELD_BYTES, shard_of: Callable[[str], int] | None = None) -> Rebuilt:
    """entries: the log in stream-id order (raw and control streams merged, see `merge_log`).
    ``max_bytes``: the workers' MAX_LINE_BYTES (None: no cap); ``shard_of``: the cluster's run ->
    shard (None: one shard or no cluster)."""
    by_run: dict[str, list[RunItem]] = {}
    out = Rebuilt()
    cap = sys.maxsize if max_bytes is None else max_bytes
    logged = [item if isinstance(item, LogEntry) else LogEntry(*item) for item in entries]
    for control in (False, True):  # each kind of stream read as the workers read it
        part = [e for e in logged if e.control == control]
        parsed = parse_batch([e.sid for e in part], [e.fields for e in part], cap, control)
        for item, entry in zip(part, parsed, strict=True):
            if type(entry) is Rejected:
                out.invalid += 1
                lost = rejected_loss(entry, item.fields, item.sid)
                if lost is not None and (run is None or lost.run == run) and not _misplaced(lost.run, item, shard_of):
                    by_run.setdefault(lost.run, []).append(lost)
                continue
            assert type(entry) is Entry
            if _misplaced(entry.run, item, shard_of):
                out.invalid += 1  # the worker dead-letters it (invalid-entry)
                continue
            if run is not None and entry.run != run:
                continue
            by_run.setdefault(entry.run, []).append(entry)
    for key, items in by_run.items():
        items.sort(key=lambda e: sid_key(e.sid))
        ordered = _around_marker(items)
        try:
            events, records = _feed(key, ordered, limits, max_buffered, redactor, max_held_bytes, guarded=False)
        except Exception:
            try:  # as the worker does: again, entry by entry
                events, records = _feed(key, ordered, limits, max_buffered, redactor, max_held_bytes, guarded=True)
            except Exception:
                out.failed.append(key)
                continue
        out.events[key] = events
        out.records[key] = records
    return out


def _misplaced(run: str, item: LogEntry, shard_of: Callable[[str], int] | None) -> bool:
    return not item.control and item.shard is not None and wrong_shard(run, item.shard, shard_of) is not None


def _around_marker(items: list[RunItem]) -> list[RunItem]:
    marker = next((e for e in items if isinstance(e, Entry) and e.kind == ABANDON), None)
    if marker is None:
        return items

    def named(e: RunItem) -> bool:
        if isinstance(e, Entry) and e.kind == ABANDON:
            return False
        return e.seq <= marker.through and not any(a <= e.seq <= b for a, b in marker.missing)

    before = [e for e in items if e is not marker and named(e)]
    after = [e for e in items if e is not marker and not named(e)]
    return before + [marker] + after


def _feed(run: str, items: list[RunItem], limits: Limits, max_buffered: int, redactor: Redactor | None,
          max_held_bytes: int, guarded: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sequencer = RunSequencer(run, limits, max_buffered, redactor, max_held_bytes)
    sequencer.guarded = guarded
    outcome = feed(sequencer, items).outcome
    return outcome.events, outcome.records
