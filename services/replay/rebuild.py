"""Pure rebuild of runs from raw entries, with the same sequencer the workers use.

Order of feeding: the raw log's own order (stream ids). An abandon marker names exactly the
entries its run consists of; entries it excludes are fed after it (where the live worker met
them: after the run had ended), so live processing and replay agree whatever the timing was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.normalizer.machine import Limits
from services.sequencer import Entry, EntryError, RunSequencer, parse_fields


@dataclass
class Rebuilt:
    events: dict[str, list[dict]] = field(default_factory=dict)  # run -> events
    records: dict[str, list[dict]] = field(default_factory=dict)
    invalid: int = 0


def rebuild(entries: list[tuple[str, dict[bytes, bytes]]], limits: Limits, max_buffered: int,
            run: str | None = None, max_bytes: int | None = None, redactor: object = None) -> Rebuilt:
    """entries: (stream id, fields) in log order, possibly from several shards.

    Entries the workers dead-letter for their content (invalid, oversize) are skipped alike;
    dead letters for too many deliveries depend on crashes, not on the log, and are not replayed.
    """
    by_run: dict[str, list[Entry]] = {}
    out = Rebuilt()
    for sid, fields in entries:
        if max_bytes is not None and sum(len(k) + len(v) for k, v in fields.items()) > max_bytes:
            out.invalid += 1
            continue
        try:
            entry = parse_fields(fields, sid)
        except EntryError:
            out.invalid += 1
            continue
        if run is not None and entry.run != run:
            continue
        by_run.setdefault(entry.run, []).append(entry)
    for key, items in by_run.items():
        items.sort(key=lambda e: _sid_key(e.sid))
        marker = next((e for e in items if e.kind == "abandon"), None)
        ordered = items
        if marker is not None:
            def named(e: Entry) -> bool:
                return e.seq <= marker.through and not any(a <= e.seq <= b for a, b in marker.missing)

            before = [e for e in items if e is not marker and e.kind != "abandon" and named(e)]
            after = [e for e in items if e is not marker and not (e.kind != "abandon" and named(e))]
            ordered = before + [marker] + after
        seq = RunSequencer(key, limits, max_buffered, redactor)
        events: list[dict] = []
        records: list[dict] = []
        for entry in ordered:
            outcome = seq.accept(entry)
            events.extend(outcome.events)
            records.extend(outcome.records)
        out.events[key] = events
        out.records[key] = records
    return out


def _sid_key(sid: str) -> tuple[int, int]:
    ms, _, n = sid.partition("-")
    return int(ms), int(n or 0)
