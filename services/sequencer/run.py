"""RunSequencer: one run's ordering, de-duplication, lifecycle and end (contract sections 1, 4).

Rules (each replays identically because it depends only on the run's entries):
- entries are processed in `seq` order; an entry ahead of the next expected seq is held
  (``buffered``) until the gap fills; one already seen is a ``duplicate``;
- an entry more than ``max_buffered`` seqs ahead is dead-lettered (``out-of-window``), which
  also bounds how many entries a run can hold; one that would make the held entries exceed
  ``max_held_bytes`` is dead-lettered (``hold-limit``);
- a seq the run will never get (its entry was dead-lettered: out-of-window, hold-limit, invalid,
  oversize, too many deliveries, a processing error) is *lost*: when the run reaches it, it is
  skipped and reported as a ``warning`` (code ``missing-entries``) and in the final record's
  ``missing``;
- ``eof`` ends the run (``ended``); anything after the end is dead-lettered (``after-end``);
- an ``abandon`` marker (written by the worker that decides a run is idle, on the control
  stream) names the last seq the run consists of and the ranges that never arrived: held
  entries up to it are processed in order, each gap is reported as a ``warning`` (code
  ``missing-entries``), and the run ends as ``abandoned`` (or ``ended`` if an eof was held).

In *guarded* mode (``guarded=True``, the shell's retry after a processing exception) every
entry is processed against a snapshot: an entry whose normalizing or redaction raises is
dead-lettered ``processing-error`` (detail: the exception class, never its message) and
lost, and the run goes on. Unguarded and guarded runs give the same output for entries that
do not raise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from contracts.raw import (
    ABANDON,
    AFTER_END,
    BUFFERED,
    DEAD,
    DEFAULT_MAX_HELD_BYTES,
    DUPLICATE,
    EOF,
    HOLD_LIMIT,
    LINE,
    OUT_OF_WINDOW,
    PROCESSED,
    PROCESSING_ERROR,
)
from contracts.runs import RUN_STATES
from services.normalizer import Limits, RunNormalizer
from services.normalizer.timefmt import format_ms
from services.sequencer.entries import Entry, SeqRange

STATE_VERSION = 1
DEFAULT_MAX_BUFFERED = 10_000
DEFAULT_LIMITS = Limits()
HELD_ENTRY_OVERHEAD = 64  # bytes counted per held entry besides its line (fields, seq, labels)

# Lifecycle of a run: `new` until its first entry, then the record states of contracts.runs.
NEW = "new"


def _run_state(name: str) -> str:
    if name not in RUN_STATES:
        raise AssertionError(f"{name!r} is not a run state of contracts.runs")
    return name


STARTED, COMPLETED, ENDED, ABANDONED = (_run_state(n) for n in ("started", "completed", "ended", "abandoned"))
RUNNING = "running"
MISSING_ENTRIES = "missing-entries"  # code of the warning for seqs that never arrive

__all__ = [
    "BUFFERED", "DEAD", "DUPLICATE", "PROCESSED", "Disposition", "HeldChanges", "Outcome", "RunSequencer",
    "plan_abandon", "DEFAULT_MAX_BUFFERED", "DEFAULT_MAX_HELD_BYTES", "MISSING_ENTRIES",
]


class Disposition(NamedTuple):
    """What happened to one entry: its outcome, and for dead letters the reason and a detail."""

    entry: Entry
    outcome: str
    reason: str | None = None
    detail: str | None = None


class HeldChanges(NamedTuple):
    """What a worker stores beside the run's state, changed since the last `take_held_changes`:
    held entries added and removed, and pending tool calls kept (key, stored JSON) and given up."""

    added: list[Entry]
    removed: list[int]
    calls_added: list[tuple[int, bytes]] = []
    calls_removed: list[int] = []


class _Mark(NamedTuple):
    events: int
    records: int
    dispositions: int


@dataclass
class Outcome:
    events: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    dispositions: list[Disposition] = field(default_factory=list)
    redactions: dict[str, int] = field(default_factory=dict)  # rule -> replacements
    redacted: int = 0  # events[:redacted] are already redacted (by guarded steps)
    # pending tool calls surfaced early, by the cap that did it (count, bytes; docs/contract.md Caps)
    evictions: dict[str, int] = field(default_factory=dict)

    def extend(self, other: Outcome) -> None:
        self.events.extend(other.events)
        self.records.extend(other.records)
        self.dispositions.extend(other.dispositions)
        for rule, n in other.redactions.items():
            self.redactions[rule] = self.redactions.get(rule, 0) + n
        self.add_evictions(other.evictions)

    def add_evictions(self, evictions: dict[str, int]) -> None:
        for cap, n in evictions.items():
            self.evictions[cap] = self.evictions.get(cap, 0) + n

    def mark(self) -> _Mark:
        return _Mark(len(self.events), len(self.records), len(self.dispositions))

    def truncate(self, mark: _Mark) -> None:
        del self.events[mark.events:]
        del self.records[mark.records:]
        del self.dispositions[mark.dispositions:]
        self.redacted = min(self.redacted, mark.events)


def _held_size(entry: Entry) -> int:
    return len(entry.line.encode("utf-8", "surrogatepass")) + HELD_ENTRY_OVERHEAD


def _in_ranges(seq: int, ranges: Any) -> bool:
    return any(a <= seq <= b for a, b in ranges)


class RunSequencer:
    """One run's ordering and lifecycle. With a `redactor`, every event is redacted before it
    leaves (secret form fields are tracked in the run's state, so redaction replays alike)."""

    def __init__(
        self,
        run: str,
        limits: Limits = DEFAULT_LIMITS,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        redactor: Any = None,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
    ) -> None:
        self.run = run
        self.redactor = redactor
        self.secrets: Any = None  # SecretFieldTracker, created on first use
        self.limits = limits
        self.max_buffered = max_buffered
        self.max_held_bytes = max_held_bytes
        self.guarded = False
        self.norm = RunNormalizer(run, limits)
        self.next_seq = 0
        self.buffer: dict[int, Entry] = {}
        self.held_bytes = 0
        self.lost: dict[int, int] = {}  # seq -> ts of entries ahead of `next` that will never arrive
        self.lost_max = -1  # the highest seq known lost (also beyond the window)
        # why a lost seq was dead-lettered, when its warning can say it (oversize); stored only when set
        self.lost_why: dict[int, str] = {}
        self.state = NEW  # new | running | ended | abandoned
        self.through = -1  # last seq of an ended run
        self.missing: list[list[int]] = []  # ranges that never arrived
        self.next_record = 0  # index of the next lifecycle record (its recordId: <run>:run:<index>)
        self.host: str | None = None
        self.agent: str | None = None
        self.parent: str | None = None
        self.continues: str | None = None
        self._held_added: dict[int, Entry] = {}
        self._held_removed: set[int] = set()

    # ------------------------------------------------------------------ state
    def to_state(self, include_held: bool = True) -> dict[str, Any]:
        """The run as JSON-able data. `include_held=False` leaves the held entries and the pending
        tool calls' blocks out (the worker stores them one by one beside the state;
        `from_state(..., held=..., calls=...)` puts them back)."""
        st = self._state_fields(include_held)
        if self.lost_why:  # absent otherwise: a run without such a loss keeps its state as it was
            st["lostWhy"] = sorted([s, w] for s, w in self.lost_why.items())
        return st

    def _state_fields(self, include_held: bool) -> dict[str, Any]:
        return {
            "v": STATE_VERSION,
            "run": self.run,
            "norm": self.norm.to_state(include_calls=include_held),
            "next": self.next_seq,
            "buffer": [e.to_list() for _, e in sorted(self.buffer.items())] if include_held else None,
            "heldBytes": self.held_bytes,
            "lost": sorted([s, t] for s, t in self.lost.items()),
            "lostMax": self.lost_max,
            "state": self.state,
            "through": self.through,
            "missing": self.missing,
            "k": self.next_record,
            "host": self.host,
            "agent": self.agent,
            "parent": self.parent,
            "continues": self.continues,
            "secrets": self.secrets.to_dict() if self.secrets is not None else None,
        }

    @classmethod
    def from_state(
        cls,
        st: dict[str, Any],
        limits: Limits = DEFAULT_LIMITS,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        redactor: Any = None,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
        held: dict[int, Entry] | None = None,
        calls: dict[int, Any] | None = None,
    ) -> RunSequencer:
        if st.get("v") != STATE_VERSION:
            raise ValueError(f"run state version {st.get('v')!r} is not {STATE_VERSION}")
        self = cls(st["run"], limits, max_buffered, redactor, max_held_bytes)
        self._load(st, held, calls)
        return self

    def _load(self, st: dict[str, Any], held: dict[int, Entry] | None, calls: dict[int, Any] | None) -> None:
        """Every attribute a state carries, from a state (``from_state``, ``_restore``)."""
        self.norm = RunNormalizer.from_state(st["norm"], self.limits, calls)
        self.next_seq = st["next"]
        if st.get("buffer") is not None:
            self.buffer = {e[1]: Entry.from_list(e) for e in st["buffer"]}
            if held is not None:  # stored whole by an older worker: store them one by one from now on
                self._held_added = dict(self.buffer)
        else:
            self.buffer = dict(held or {})
        self.held_bytes = st.get("heldBytes", sum(map(_held_size, self.buffer.values())))
        self.lost = {int(s): int(t) for s, t in st.get("lost", ())}
        self.lost_max = st.get("lostMax", -1)
        self.lost_why = {int(s): str(w) for s, w in st.get("lostWhy", ())}
        self.state = st["state"]
        self.through = st["through"]
        self.missing = st["missing"]
        self.next_record = st["k"]
        self.host = st["host"]
        self.agent = st["agent"]
        self.parent = st.get("parent")
        self.continues = st.get("continues")
        self.secrets = None
        if st.get("secrets") is not None:
            from services.redaction import SecretFieldTracker

            self.secrets = SecretFieldTracker.from_dict(st["secrets"])

    def take_held_changes(self) -> HeldChanges:
        """Held entries and pending calls added/removed since the last call (or since the state
        was loaded)."""
        calls_added, calls_removed = self.norm.take_call_changes()
        if not self._held_added and not self._held_removed:  # the usual case: nothing held
            return HeldChanges([], [], calls_added, calls_removed)
        changes = HeldChanges(list(self._held_added.values()), sorted(self._held_removed), calls_added, calls_removed)
        self._held_added = {}
        self._held_removed = set()
        return changes

    @property
    def ended(self) -> bool:
        return self.state in (ENDED, ABANDONED)

    def _in_missing(self, seq: int) -> bool:
        return _in_ranges(seq, self.missing)

    # ------------------------------------------------------------------ held entries
    def _hold(self, entry: Entry) -> None:
        self.buffer[entry.seq] = entry
        self.held_bytes += _held_size(entry)
        self._held_added[entry.seq] = entry
        self._held_removed.discard(entry.seq)

    def _unhold(self, seq: int) -> Entry:
        entry = self.buffer.pop(seq)
        self.held_bytes -= _held_size(entry)
        if self._held_added.pop(seq, None) is None:
            self._held_removed.add(seq)
        return entry

    # ------------------------------------------------------------------ input
    def accept(self, entry: Entry, out: Outcome | None = None) -> Outcome:
        """Process one entry; its results are appended to `out` (a new Outcome by default)."""
        if out is None:
            out = Outcome()
        first = len(out.events)
        self._accept(entry, out)
        if self.redactor is not None and len(out.events) > first:
            self._redact_new(out, first)
        return out

    def accept_many(self, entries: Sequence[Entry], out: Outcome | None = None) -> Outcome:
        """Process entries in order: the same results as one `accept` per entry (a property test
        checks it). Stretches of in-order line entries of a running run, the common case, go
        through the normalizer's batch call (`RunNormalizer.lines`) instead of a call chain per line."""
        if out is None:
            out = Outcome()
        i, n = 0, len(entries)
        while i < n:
            j = self._in_order_end(entries, i)
            if j > i + 1:  # a stretch of one is cheaper the reference way (no generator to set up)
                self._accept_lines(entries[i:j], out)
                i = j
            else:
                self.accept(entries[i], out)
                i += 1
        return out

    def _in_order_end(self, entries: Sequence[Entry], i: int) -> int:
        """The end of the stretch entries[i:j] that `_accept_lines` may take: line entries with
        consecutive seqs from `next`, while nothing is held or lost (so no drain can interleave)
        and the run is running (no start record; seq 0, which fixes the format, is never in it)."""
        if self.guarded or self.state != RUNNING or self.buffer or self.lost:
            return i
        expected = self.next_seq
        j = i
        n = len(entries)
        while j < n:
            entry = entries[j]
            if entry.kind != LINE or entry.seq != expected:
                break
            expected += 1
            j += 1
        return j

    def _accept_lines(self, entries: Sequence[Entry], out: Outcome) -> None:
        """`accept` of each entry (see `_in_order_end` for what they are), in one normalizer call.
        The per-entry bookkeeping of `_process` runs in the generator the normalizer pulls from:
        when it asks for entry k+1, entry k is fully normalized, which is the moment `_process`
        checks for a new usage (a `completed` record with the counts of that moment)."""
        norm = self.norm
        first = len(out.events)
        dispositions = out.dispositions
        usage = norm.usage
        pulled = 0

        def after(entry: Entry) -> None:
            nonlocal usage
            dispositions.append(Disposition(entry, PROCESSED))
            if norm.usage is not usage:
                usage = norm.usage
                self._record(out, COMPLETED, entry.ts, entry.seq, usage=True)

        def feed() -> Iterator[tuple[int, int, str, str]]:
            nonlocal pulled
            for entry in entries:
                if pulled:
                    after(entries[pulled - 1])
                self._adopt_labels(entry)
                self.next_seq = entry.seq + 1
                pulled += 1
                yield entry.seq, entry.ts, entry.line, entry.stream

        events = norm.lines(feed())
        if pulled != len(entries):  # the batch call must take every entry; the caller retries guarded
            raise RuntimeError(f"the normalizer took {pulled} of {len(entries)} entries")
        after(entries[-1])
        out.events.extend(events)
        if norm.evictions:
            out.add_evictions(norm.take_evictions())
        if self.redactor is not None and len(out.events) > first:
            self._redact_new(out, first)

    def lose(self, seq: int, ts: int, out: Outcome | None = None, reason: str | None = None) -> Outcome:
        """A seq of this run whose entry was dead-lettered outside the sequencer (invalid, oversize,
        too many deliveries, a failed commit): it will never arrive, so the run skips it and reports
        it missing instead of waiting for it. `ts` dates the warning (the entry's stream id time);
        `reason`, when the replay of the raw log knows it as well (oversize), is named in the warning."""
        if out is None:
            out = Outcome()
        first = len(out.events)
        if not (self.ended or seq < self.next_seq or seq in self.buffer or seq in self.lost):
            self._mark_lost(seq, ts)
            if reason and seq in self.lost:
                self.lost_why[seq] = reason
            # A run that has not started yet skips it with its first entry (junk alone starts no run).
            if seq == self.next_seq and self.state != NEW:
                self._drain_buffer(out)
        if self.redactor is not None and len(out.events) > first:
            self._redact_new(out, first)
        return out

    def _mark_lost(self, seq: int, ts: int) -> None:
        self.lost_max = max(self.lost_max, seq)
        if seq - self.next_seq <= self.max_buffered:  # beyond the window only lost_max remembers it
            self.lost[seq] = ts

    def _redact_new(self, out: Outcome, first: int) -> None:
        # Events produced by guarded steps are already redacted (inside their guard).
        start = max(first, out.redacted)
        if len(out.events) > start:
            self._redact(out, start)

    def _redact(self, out: Outcome, first: int) -> None:
        if self.secrets is None:
            from services.redaction import SecretFieldTracker

            self.secrets = SecretFieldTracker()
        tracker = self.secrets
        events = out.events
        for i in range(first, len(events)):
            event = events[i]
            if event["type"] == "unknown":
                tracker.observe(event["raw"])
            events[i], counts = self.redactor.redact_event(event, tracker=tracker)
            for rule, n in counts.items():
                out.redactions[rule] = out.redactions.get(rule, 0) + n

    def _accept(self, entry: Entry, out: Outcome) -> None:
        if entry.kind == ABANDON:
            self._abandon(entry, out)
            return
        if self.ended:
            if entry.seq <= self.through and not self._in_missing(entry.seq):
                out.dispositions.append(Disposition(entry, DUPLICATE))
            else:
                out.dispositions.append(Disposition(entry, DEAD, AFTER_END))
            return
        if entry.seq < self.next_seq or entry.seq in self.buffer or entry.seq in self.lost:
            out.dispositions.append(Disposition(entry, DUPLICATE))
            return
        if entry.seq > self.next_seq:
            # Held entries lie in (next, next + max_buffered], so the window also bounds the hold.
            if entry.seq - self.next_seq > self.max_buffered:
                out.dispositions.append(Disposition(entry, DEAD, OUT_OF_WINDOW))
                self._mark_lost(entry.seq, entry.ts)
            elif self.held_bytes + _held_size(entry) > self.max_held_bytes:
                out.dispositions.append(Disposition(entry, DEAD, HOLD_LIMIT))
                self._mark_lost(entry.seq, entry.ts)
            else:
                self._hold(entry)
                out.dispositions.append(Disposition(entry, BUFFERED))
                if self.next_seq in self.lost:
                    self._drain_buffer(out)
            return
        if self._step(entry, out):
            out.dispositions.append(Disposition(entry, PROCESSED))
        self._drain_buffer(out)

    def _drain_buffer(self, out: Outcome) -> None:
        while not self.ended:
            if self.next_seq in self.buffer:
                self._step(self._unhold(self.next_seq), out)
            elif self.next_seq in self.lost:
                last = self.next_seq
                while last + 1 in self.lost:
                    last += 1
                self._skip(self.next_seq, last, self.lost[self.next_seq], out)
            else:
                break
        if self.ended:
            self._drop_buffer(out)

    def _drop_buffer(self, out: Outcome) -> None:
        for seq in sorted(self.buffer):
            out.dispositions.append(Disposition(self._unhold(seq), DEAD, AFTER_END))
        self.lost.clear()
        self.lost_why.clear()

    def _gap(self, first: int, last: int, ts: int, out: Outcome) -> None:
        """Report seqs first..last as never arriving (a warning, and the record's `missing`)."""
        message = f"raw entries {first}..{last} of this run never arrived"
        if self.lost_why:
            why = {w for s, w in self.lost_why.items() if first <= s <= last}
            known = sum(1 for s in self.lost_why if first <= s <= last)
            if len(why) == 1 and known == last - first + 1:  # every one of them, for the same reason
                message += f": dead-lettered ({why.pop()})"
            for s in [s for s in self.lost_why if first <= s <= last]:
                del self.lost_why[s]
        out.events.extend(self._guard_events(lambda: self.norm.warn(
            last, ts, message, MISSING_ENTRIES, (first, last))))
        if self.missing and self.missing[-1][1] == first - 1:
            self.missing[-1][1] = last
        else:
            self.missing.append([first, last])
        for s in [s for s in self.lost if first <= s <= last]:
            del self.lost[s]

    def _skip(self, first: int, last: int, ts: int, out: Outcome) -> None:
        self._gap(first, last, ts, out)
        self.next_seq = last + 1

    def _step(self, entry: Entry, out: Outcome) -> bool:
        """Process one in-order entry. Guarded: an exception costs only this entry (restored state,
        dead letter, seq lost and skipped). True when it was processed."""
        if not self.guarded:
            self._process(entry, out)
            if self.norm.evictions:
                out.add_evictions(self.norm.take_evictions())
            return True
        snapshot = self._snapshot()
        mark = out.mark()
        try:
            self._process(entry, out)
            if self.redactor is not None:
                self._redact_new(out, mark.events)
                out.redacted = len(out.events)
        except Exception as exc:  # the class name only: a message may quote the entry's data
            self._restore(snapshot)  # a new normalizer: the failed step's evictions go with its events
            out.truncate(mark)
            out.dispositions.append(Disposition(entry, DEAD, PROCESSING_ERROR, type(exc).__name__))
            self._skip(entry.seq, entry.seq, entry.ts, out)
            return False
        if self.norm.evictions:
            out.add_evictions(self.norm.take_evictions())
        return True

    def _guard_events(self, produce: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Events of a service-side step (warning, end flush); guarded, a failure yields none."""
        if not self.guarded:
            return produce()
        try:
            return produce()
        except Exception:
            return []

    def _snapshot(self) -> tuple[bytes, dict[int, Entry], dict[int, Entry], set[int], Any]:
        # Without the held entries and the calls' blocks (kept by reference: nothing mutates them),
        # so a guarded step costs the same whatever the run holds.
        return (orjson.dumps(self.to_state(include_held=False)), dict(self.buffer), dict(self._held_added),
                set(self._held_removed), self.norm.side_snapshot())

    def _restore(self, snapshot: tuple[bytes, dict[int, Entry], dict[int, Entry], set[int], Any]) -> None:
        state, buffer, added, removed, side = snapshot
        self._load(orjson.loads(state), buffer, side[0])
        self._held_added, self._held_removed = added, removed
        self.norm.side_restore(side)

    def _adopt_labels(self, entry: Entry) -> None:
        """A run's labels are the first non-empty value any of its processed entries carries."""
        if self.host is None and entry.host:
            self.host = entry.host
        if self.agent is None and entry.agent:
            self.agent = entry.agent
        if self.parent is None and entry.parent:
            self.parent = entry.parent
        if self.continues is None and entry.continues:
            self.continues = entry.continues

    def _process(self, entry: Entry, out: Outcome) -> None:
        self._adopt_labels(entry)
        if self.state == NEW:
            self.state = RUNNING
            self._record(out, STARTED, entry.ts, entry.seq)
        self.next_seq = entry.seq + 1
        norm = self.norm
        if entry.seq == 0:
            # The run's input format is fixed by its seq-0 entry's labels (extension F1, F2, F4).
            out.events.extend(norm.apply_labels(entry.format, entry.agent, entry.seq, entry.ts))
        if entry.kind == EOF:
            out.events.extend(norm.end(entry.seq, entry.ts, entry.exit, self.agent, entry.signal))
            self.state = ENDED
            self.through = entry.seq
            extra: dict[str, Any] = {}
            if entry.exit is not None:
                extra["exitCode"] = entry.exit
            if self.missing:
                extra["missing"] = self.missing
            self._record(out, ENDED, entry.ts, entry.seq, usage=True, **extra)
            return
        usage_before = norm.usage
        out.events.extend(norm.line(entry.seq, entry.ts, entry.line, entry.stream))
        if norm.usage is not usage_before:
            self._record(out, COMPLETED, entry.ts, entry.seq, usage=True)

    def _abandon(self, marker: Entry, out: Outcome) -> None:
        if self.ended:
            out.dispositions.append(Disposition(marker, DUPLICATE))
            return
        # Entries the marker does not name are not part of the run.
        for seq in sorted(self.buffer):
            if seq > marker.through or _in_ranges(seq, marker.missing):
                out.dispositions.append(Disposition(self._unhold(seq), DEAD, AFTER_END))
        for seq in sorted(self.buffer):
            if seq not in self.buffer:  # a guarded step may have dropped it already
                continue
            if seq > self.next_seq:
                self._skip(self.next_seq, seq - 1, marker.ts, out)
            self._step(self._unhold(seq), out)
            if self.ended:
                self._drop_buffer(out)
                out.dispositions.append(Disposition(marker, PROCESSED))
                return
        if marker.through >= self.next_seq:
            # The run's last entries never arrived (or were lost) and nothing after them did either.
            self._gap(self.next_seq, marker.through, marker.ts, out)
        self.lost.clear()
        self.lost_why.clear()
        out.events.extend(self._guard_events(lambda: self.norm.end(max(self.next_seq - 1, 0), marker.ts)))
        self.state = ABANDONED
        self.through = max(marker.through, self.next_seq - 1)
        extra: dict[str, Any] = {"missing": self.missing} if self.missing else {}
        self._record(out, ABANDONED, marker.ts, max(self.next_seq - 1, 0), usage=True, **extra)
        out.dispositions.append(Disposition(marker, PROCESSED))

    # ---------------------------------------------------------------- records
    def _record(self, out: Outcome, state: str, ts: int, seq: int, usage: bool = False, **extra: Any) -> None:
        record: dict[str, Any] = {
            "recordId": f"{self.run}:run:{self.next_record}",
            "runId": self.run,
            "state": state,
            "timestamp": format_ms(ts),
            "seq": seq,
            "counts": self.norm.counts_by_type(),
        }
        self.next_record += 1
        if usage and self.norm.usage:
            record.update(self.norm.usage)
        record.update(extra)
        if self.host:
            record["host"] = self._envelope_text(self.host, out)
        if self.agent:
            record["agent"] = self._envelope_text(self.agent, out)
        if self.norm.format:
            record["format"] = self.norm.format
        if self.parent:
            record["parentRunId"] = self.parent
        if self.continues:
            record["continuesRunId"] = self.continues
        out.records.append(record)

    def _envelope_text(self, value: str, out: Outcome) -> str:
        """A label of the entries' envelope (host, agent) as published: whoever runs the tap
        writes it, so it is redacted like event content (the exporters make span names and
        attributes of it); run keys stay identity, pattern-checked."""
        if self.redactor is None:
            return value
        text: str
        text, counts = self.redactor.redact_text(value)
        for rule, n in counts.items():
            out.redactions[rule] = out.redactions.get(rule, 0) + n
        return text


def plan_abandon(sequencer: RunSequencer) -> tuple[int, list[list[int]]]:
    """What an abandon marker for this run names now: (through, missing ranges).

    `through` covers held entries and lost seqs (dead-lettered entries the run will never get),
    so every seq up to the last one the run is known to have had is either taken or missing."""
    held = sorted(sequencer.buffer)
    through = max(held[-1] if held else -1, sequencer.lost_max, sequencer.next_seq - 1)
    gaps: list[list[int]] = []
    first = sequencer.next_seq
    for seq in held:  # never a range() over seqs: a lost seq may lie far beyond the window
        if seq > first:
            gaps.append([first, seq - 1])
        first = seq + 1
    if through >= first:
        gaps.append([first, through])
    return through, gaps


def missing_ranges(ranges: list[list[int]]) -> tuple[SeqRange, ...]:
    return tuple((a, b) for a, b in ranges)


def tally(dispositions: list[Disposition], outcomes: dict[str, int], dead: dict[str, int], processed: list[str]) -> None:
    """Adds a run's dispositions to a batch's counts: entries by outcome, dead letters by reason,
    and the stream ids of the entries processed (abandon markers aside, they are not the run's
    activity). One call a run, so the loop over entries runs in the core."""
    for d in dispositions:
        outcomes[d.outcome] = outcomes.get(d.outcome, 0) + 1
        if d.reason is not None:
            dead[d.reason] = dead.get(d.reason, 0) + 1
        if d.outcome == PROCESSED and d.entry.kind != ABANDON:
            processed.append(d.entry.sid)
