"""Reading the archive back: the raw log of a time window, merged with what Redis still holds.

`replay` and `reprocess` need the log of record of some runs, and since the archive exists that
log lives in two places: the archive's raw segments (everything the archive consumer has written)
and the raw and control streams (everything Redis has not trimmed yet). The two overlap: Redis
trims only below the archive's committed position, so the newest archived entries are usually in
Redis too. An entry is identified by (stream kind, shard, stream id), the same in both places, so
the merge keeps one copy of each and orders everything by stream id, exactly the order
`services/sequencer/rebuild.merge_log` expects.

Which segments: a segment's object name carries its stream kind, shard and FIRST stream id only
(services/archive/segments.py), so for a window [since, until) the reader lists the date
partitions of the window plus the day before (a segment that starts before `since` may hold
entries inside it), keeps, per (kind, shard), the segments that start inside the window and the
last one that starts before it, and drops entries outside the window after decoding.

Which runs: a window selects RUNS, not entries. A run is in the window when any of its raw
entries is; it is then rebuilt from all of its entries the reader read, and the reader reads a day
more on each side of the window (`read_log`, `Window.around`), because a run cut in half would not
give the events the workers published (see docs/archive-replay.md, "Replay").

A corrupt segment (not Parquet, truncated, another schema) is NAMED in the result and the others
are still read: one bad object must not hide the rest of the history.

The functions that decide (windows, segment selection, merge, run selection) are pure; only
`read_raw`, `read_log`, `read_lake_events` and `redis_log` do I/O (`read_log` only through its
arguments: the store and an iterable of Redis's entries).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from contracts.keys import KeyLayout
from services.archive.segments import (
    EVENTS_PREFIX,
    RAW_PREFIX,
    STREAM_KINDS,
    SegmentError,
    date_of_ms,
    decode_event_rows,
    decode_raw_segment,
    id_parts,
    parse_lake_key,
    parse_raw_segment_key,
)
from services.archive.store import ArchiveStore
from services.archive.window import DAY_MS, Window
from services.sequencer.rebuild import LogEntry, sid_key

RAW, CONTROL = STREAM_KINDS  # the stream kinds of the format (segments.py): the one spelling


# ---------------------------------------------------------------------------------- segments


@dataclass(frozen=True)
class SegmentRef:
    """A raw segment's object: its name and what the name says."""

    key: str
    stream: str  # "raw" or "control"
    shard: int
    first_id: str
    last_id: str | None = None  # None: a name from before issue 32 (first id only)

    @property
    def order(self) -> tuple[str, int, tuple[int, int]]:
        return self.stream, self.shard, id_parts(self.first_id)


@dataclass(frozen=True)
class Corrupt:
    """An object that could not be read as what its name says, and why (one line)."""

    key: str
    reason: str


def segment_refs(keys: Iterable[str]) -> tuple[list[SegmentRef], list[Corrupt]]:
    """Raw segment names -> refs; a name under raw/ that is not a segment's is reported, not fatal."""
    refs: list[SegmentRef] = []
    odd: list[Corrupt] = []
    for key in keys:
        try:
            parsed = parse_raw_segment_key(key)
        except ValueError as exc:
            odd.append(Corrupt(key, str(exc)))
            continue
        refs.append(SegmentRef(key, parsed.stream, parsed.shard, parsed.first_id, parsed.last_id))
    return sorted(refs, key=lambda r: r.order), odd


def select_segments(refs: Iterable[SegmentRef], win: Window) -> list[SegmentRef]:
    """The segments that may hold entries of the window: per (kind, shard) those that start inside
    it, those that start before it and end inside or after it (their names carry their last id), and
    for names from before issue 32 (first id only) the last one that starts before it (its tail may
    reach into the window). Segments may overlap (docs/archive.md "Guarantees"): the merge keeps one
    copy of each entry."""
    out: list[SegmentRef] = []
    by_stream: dict[tuple[str, int], list[SegmentRef]] = {}
    for ref in refs:
        by_stream.setdefault((ref.stream, ref.shard), []).append(ref)
    for group in by_stream.values():
        group.sort(key=lambda r: id_parts(r.first_id))
        before: SegmentRef | None = None
        for ref in group:
            ms = id_parts(ref.first_id)[0]
            if win.since_ms is not None and ms < win.since_ms:
                if ref.last_id is None:
                    before = ref
                elif id_parts(ref.last_id)[0] >= win.since_ms:
                    out.append(ref)
                continue
            if win.until_ms is not None and ms >= win.until_ms:
                break
            out.append(ref)
        if before is not None:
            out.append(before)
    return sorted(out, key=lambda r: r.order)


# ---------------------------------------------------------------------------------- entries


class Located(NamedTuple):
    """A log entry and where it lives: (stream kind, shard, id) is its identity in Redis and in the
    archive. A NamedTuple: one is made per entry read, a frozen dataclass costs twice as much."""

    stream: str
    shard: int
    sid: str
    fields: dict[bytes, bytes]

    @property
    def identity(self) -> tuple[str, int, str]:
        return self.stream, self.shard, self.sid

    def log_entry(self) -> LogEntry:
        control = self.stream == CONTROL
        return LogEntry(self.sid, self.fields, control, None if control else self.shard)


@dataclass
class ArchiveRead:
    """What the archive gave: entries (any order), corrupt objects named, counts."""

    entries: list[Located] = field(default_factory=list)
    corrupt: list[Corrupt] = field(default_factory=list)
    segments: int = 0
    bytes: int = 0


def list_segments(store: ArchiveStore, win: Window) -> tuple[list[SegmentRef], list[Corrupt]]:
    dates = win.dates()
    prefixes = [f"{RAW_PREFIX}/"] if dates is None else [f"{RAW_PREFIX}/date={d}/" for d in dates]
    keys = [k for p in prefixes for k in store.list(p)]
    refs, odd = segment_refs(keys)
    return select_segments(refs, win), odd


def read_raw(store: ArchiveStore, win: Window) -> ArchiveRead:
    """Every archived raw and control entry whose id falls in the window (I/O: lists and gets), once:
    two objects may hold one entry (docs/archive.md "Guarantees"), the first read is kept."""
    refs, odd = list_segments(store, win)
    out = ArchiveRead(corrupt=list(odd))
    seen: set[tuple[str, int, str]] = set()
    for ref in refs:
        data = store.get(ref.key)
        out.bytes += len(data)
        try:
            archived = decode_raw_segment(data)
        except SegmentError as exc:
            out.corrupt.append(Corrupt(ref.key, str(exc)))
            continue
        out.segments += 1
        for a in archived:
            ident = (a.stream, a.shard, a.id)
            if ident in seen or not (win.everything or win.contains(id_parts(a.id)[0])):
                continue
            seen.add(ident)
            out.entries.append(Located(a.stream, a.shard, a.id, a.fields))
    return out


@dataclass
class LogRead:
    """The log of a window's runs: every entry read (merged, in stream-id order), the runs the window
    selects (None: all), and what the archive could not give."""

    entries: list[Located]
    runs: set[str] | None
    corrupt: list[Corrupt]
    segments: int

    def log(self) -> list[LogEntry]:
        return log_of(self.entries, self.runs)


def read_log(store: ArchiveStore | None, live: Iterable[Located], win: Window) -> LogRead:
    """The archive (None: none) merged with Redis's entries (`live`), read over the window widened by
    a day on each side (`Window.around`), and the runs that have a raw entry inside the window itself."""
    wide = win.around()
    archived = read_raw(store, wide) if store is not None else ArchiveRead()
    entries = merge(archived.entries, live, wide)
    runs = None if win.everything else runs_in(entries, win)
    return LogRead(entries, runs, archived.corrupt, archived.segments)


def redis_log(client: Any, layout: KeyLayout, count: int = 5000) -> Iterator[Located]:
    """Every entry the raw and control streams still hold (client: sync_client's, bytes replies)."""
    for kind, streams in ((RAW, layout.raw_streams()), (CONTROL, layout.control_streams())):
        for shard, stream in enumerate(streams):
            last = "-"
            while True:
                chunk = client.xrange(stream, min=last, max="+", count=count)
                if not chunk:
                    break
                for sid, fields in chunk:
                    yield Located(kind, shard, sid.decode(), fields)
                last = "(" + chunk[-1][0].decode()


def merge(archived: Iterable[Located], live: Iterable[Located], win: Window) -> list[Located]:
    """One copy of every entry (archive and Redis overlap), in stream-id order, inside the window."""
    seen: dict[tuple[str, int, str], Located] = {}
    for entry in archived:
        seen.setdefault(entry.identity, entry)
    for entry in live:
        if win.contains(sid_key(entry.sid)[0]):
            seen.setdefault(entry.identity, entry)
    return sorted(seen.values(), key=lambda e: (sid_key(e.sid), e.stream, e.shard))


def runs_in(entries: Iterable[Located], win: Window) -> set[str]:
    """The runs with a raw entry inside the window (control entries follow their run)."""
    return {e.fields[b"run"].decode(errors="replace") for e in entries
            if e.stream == RAW and b"run" in e.fields and win.contains(sid_key(e.sid)[0])}


def headless(entries: Iterable[Located], runs: set[str]) -> set[str]:
    """The runs of `runs` whose first entry (seq 0) is not among `entries`: their log was read in
    part (it began before what was read), so a rebuild would not give their events."""
    seen: set[str] = set()
    for e in entries:
        if e.stream == RAW and e.fields.get(b"seq") == b"0":
            run = e.fields.get(b"run")
            if run is not None:
                seen.add(run.decode(errors="replace"))
    return runs - seen


def log_of(entries: Iterable[Located], runs: set[str] | None) -> list[LogEntry]:
    """The entries of `runs` (None: all) as rebuild() takes them; entries without a run field (the
    workers dead-letter them) are kept so that rebuild counts them as invalid, as before."""
    out = []
    for e in entries:
        run = e.fields.get(b"run")
        if runs is None or run is None or run.decode(errors="replace") in runs:
            out.append(e.log_entry())
    return out


# ---------------------------------------------------------------------------------- event lake


@dataclass
class LakeRead:
    """Published events found in the event lake, by run and event id; corrupt objects named."""

    events: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    corrupt: list[Corrupt] = field(default_factory=list)
    objects: int = 0


def read_lake_events(store: ArchiveStore, win: Window, runs: set[str] | None) -> LakeRead:
    """The events the topics published (as the archive kept them) of `runs`, from the date
    partitions around the window (an event is filed by its own date, which can precede the entry's)."""
    dates = win.dates()
    if dates is not None and win.until_ms is not None:
        dates = sorted(set(dates) | {date_of_ms(win.until_ms + DAY_MS)})
    prefixes = [f"{EVENTS_PREFIX}/"] if dates is None else [f"{EVENTS_PREFIX}/date={d}/" for d in dates]
    out = LakeRead()
    for prefix in prefixes:
        for key in store.list(prefix):
            try:
                parse_lake_key(key)
                rows = decode_event_rows(store.get(key))
            except (ValueError, SegmentError) as exc:  # SegmentError is a ValueError too
                out.corrupt.append(Corrupt(key, str(exc)))
                continue
            out.objects += 1
            for row in rows:
                run = row["run_key"]
                if runs is None or run in runs:
                    out.events.setdefault(run, {})[row["event_id"]] = orjson.loads(row["data"])
    return out

