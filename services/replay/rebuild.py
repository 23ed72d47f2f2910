"""Pure rebuild of runs from the raw log, with the same sequencer the workers use.

Input: the raw streams' entries and the control streams' abandon markers, merged in stream-id
order. An abandon marker names exactly the entries its run consists of; entries it excludes are
fed after it (where the live worker met them: after the run had ended), so live processing and
replay agree whatever the timing was.

Entries the workers dead-letter for their content (invalid, oversize) are skipped alike, and
when their run and seq are known the run reports that seq missing, as the worker's run did.
Dead letters for too many deliveries or failed commits depend on crashes, not on the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from contracts.raw import ABANDON, OVERSIZE
from services.normalizer import Limits
from services.sequencer import Entry, EntryError, RunSequencer, entry_identity, parse_fields
from services.sequencer.run import DEFAULT_MAX_HELD_BYTES

if TYPE_CHECKING:
    from services.redaction import Redactor


class LogEntry(NamedTuple):
    """One stream entry of the log: its id, its fields, and whether it came from a control stream."""

    sid: str
    fields: dict[bytes, bytes]
    control: bool = False


class _Lost(NamedTuple):
    run: str
    seq: int
    sid: str
    reason: str | None = None  # as the workers name it in the run's warning (oversize)


@dataclass
class Rebuilt:
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run -> events
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    invalid: int = 0
    failed: list[str] = field(default_factory=list)  # runs whose processing raised even entry by entry


def sid_key(sid: str) -> tuple[int, int]:
    """Sort key of a stream id: ids of different streams interleave by (ms, n)."""
    ms, _, n = sid.partition("-")
    return int(ms), int(n or 0)


def merge_log(*streams: list[LogEntry]) -> list[LogEntry]:
    """Entries of several streams (raw shards, control streams) in stream-id order."""
    return sorted((e for s in streams for e in s), key=lambda e: sid_key(e.sid))


def rebuild(entries: list[LogEntry] | list[tuple[str, dict[bytes, bytes]]], limits: Limits, max_buffered: int,
            run: str | None = None, max_bytes: int | None = None, redactor: Redactor | None = None,
            max_held_bytes: int = DEFAULT_MAX_HELD_BYTES) -> Rebuilt:
    """entries: the log in stream-id order (raw and control streams merged, see `merge_log`)."""
    by_run: dict[str, list[Entry | _Lost]] = {}
    out = Rebuilt()
    for item in entries:
        sid, fields = item[0], item[1]
        control = len(item) > 2 and bool(item[2])
        if max_bytes is not None and sum(len(k) + len(v) for k, v in fields.items()) > max_bytes:
            out.invalid += 1
            identity = entry_identity(fields)
            if identity is not None and (run is None or identity.run == run):
                by_run.setdefault(identity.run, []).append(_Lost(identity.run, identity.seq, sid, OVERSIZE))
            continue
        try:
            entry = parse_fields(fields, sid, control)
        except EntryError as exc:
            out.invalid += 1
            if exc.run is not None and exc.seq is not None and (run is None or exc.run == run):
                by_run.setdefault(exc.run, []).append(_Lost(exc.run, exc.seq, sid))
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


def _around_marker(items: list[Entry | _Lost]) -> list[Entry | _Lost]:
    marker = next((e for e in items if isinstance(e, Entry) and e.kind == ABANDON), None)
    if marker is None:
        return items

    def named(e: Entry | _Lost) -> bool:
        if isinstance(e, Entry) and e.kind == ABANDON:
            return False
        return e.seq <= marker.through and not any(a <= e.seq <= b for a, b in marker.missing)

    before = [e for e in items if e is not marker and named(e)]
    after = [e for e in items if e is not marker and not named(e)]
    return before + [marker] + after


def _feed(run: str, items: list[Entry | _Lost], limits: Limits, max_buffered: int, redactor: Redactor | None,
          max_held_bytes: int, guarded: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sequencer = RunSequencer(run, limits, max_buffered, redactor, max_held_bytes)
    sequencer.guarded = guarded
    events: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, _Lost):
            outcome = sequencer.lose(item.seq, sid_key(item.sid)[0], reason=item.reason)
        else:
            outcome = sequencer.accept(item)
        events.extend(outcome.events)
        records.extend(outcome.records)
    return events, records
