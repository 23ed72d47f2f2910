"""RunSequencer: one run's ordering, de-duplication, lifecycle and end (contract sections 1, 4).

Rules (each replays identically because it depends only on the run's entries):
- entries are processed in `seq` order; an entry ahead of the next expected seq is held
  (``buffered``) until the gap fills; one already seen is a ``duplicate``;
- an entry more than ``max_buffered`` seqs ahead is dead-lettered (``out-of-window``), which
  also bounds how many entries a run can hold;
- ``eof`` ends the run (``ended``); anything after the end is dead-lettered (``after-end``);
- an ``abandon`` marker (written into the raw log by the worker that decides a run is idle)
  names the last seq the run consists of and the ranges that never arrived: held entries up
  to it are processed in order, each gap is reported as a ``warning`` (code
  ``missing-entries``), and the run ends as ``abandoned`` (or ``ended`` if an eof was held).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.normalizer.machine import Limits, RunNormalizer
from services.normalizer.timefmt import format_ms
from services.sequencer.entries import Entry

STATE_VERSION = 1

PROCESSED = "processed"
DUPLICATE = "duplicate"
BUFFERED = "buffered"
DEAD = "dead_lettered"


@dataclass
class Outcome:
    events: list[dict] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    # (entry, outcome, dead-letter reason or None)
    dispositions: list[tuple[Entry, str, str | None]] = field(default_factory=list)
    redactions: dict[str, int] = field(default_factory=dict)  # rule -> replacements

    def extend(self, other: "Outcome") -> None:
        self.events.extend(other.events)
        self.records.extend(other.records)
        self.dispositions.extend(other.dispositions)
        for rule, n in other.redactions.items():
            self.redactions[rule] = self.redactions.get(rule, 0) + n


def _ranges(seqs: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for s in seqs:
        if out and out[-1][1] == s - 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


class RunSequencer:
    """One run's ordering and lifecycle. With a `redactor`, every event is redacted before it
    leaves (secret form fields are tracked in the run's state, so redaction replays alike)."""

    def __init__(self, run: str, limits: Limits = Limits(), max_buffered: int = 10_000, redactor: Any = None) -> None:
        self.run = run
        self.redactor = redactor
        self.secrets: Any = None  # SecretFieldTracker, created on first use
        self.limits = limits
        self.max_buffered = max_buffered
        self.norm = RunNormalizer(run, limits)
        self.next = 0
        self.buffer: dict[int, Entry] = {}
        self.state = "new"  # new | running | ended | abandoned
        self.through = -1  # last seq of an ended run
        self.missing: list[list[int]] = []  # ranges that never arrived, of an ended run
        self.k = 0  # index of the next lifecycle record
        self.host: str | None = None
        self.agent: str | None = None
        self.parent: str | None = None
        self.continues: str | None = None

    # ------------------------------------------------------------------ state
    def to_state(self) -> dict:
        return {
            "v": STATE_VERSION,
            "run": self.run,
            "norm": self.norm.to_state(),
            "next": self.next,
            "buffer": [e.to_list() for _, e in sorted(self.buffer.items())],
            "state": self.state,
            "through": self.through,
            "missing": self.missing,
            "k": self.k,
            "host": self.host,
            "agent": self.agent,
            "parent": self.parent,
            "continues": self.continues,
            "secrets": self.secrets.to_dict() if self.secrets is not None else None,
        }

    @classmethod
    def from_state(
        cls, st: dict, limits: Limits = Limits(), max_buffered: int = 10_000, redactor: Any = None
    ) -> "RunSequencer":
        if st.get("v") != STATE_VERSION:
            raise ValueError(f"run state version {st.get('v')!r} is not {STATE_VERSION}")
        self = cls(st["run"], limits, max_buffered, redactor)
        self.norm = RunNormalizer.from_state(st["norm"], limits)
        self.next = st["next"]
        self.buffer = {e[1]: Entry.from_list(e) for e in st["buffer"]}
        self.state = st["state"]
        self.through = st["through"]
        self.missing = st["missing"]
        self.k = st["k"]
        self.host = st["host"]
        self.agent = st["agent"]
        self.parent = st.get("parent")
        self.continues = st.get("continues")
        if st.get("secrets") is not None:
            from services.redaction import SecretFieldTracker

            self.secrets = SecretFieldTracker.from_dict(st["secrets"])
        return self

    @property
    def ended(self) -> bool:
        return self.state in ("ended", "abandoned")

    def _in_missing(self, seq: int) -> bool:
        return any(a <= seq <= b for a, b in self.missing)

    # ------------------------------------------------------------------ input
    def accept(self, entry: Entry, out: Outcome | None = None) -> Outcome:
        """Process one entry; its results are appended to `out` (a new Outcome by default)."""
        if out is None:
            out = Outcome()
        first = len(out.events)
        self._accept(entry, out)
        if self.redactor is not None and len(out.events) > first:
            self._redact(out, first)
        return out

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
        if entry.kind == "abandon":
            self._abandon(entry, out)
            return
        if self.ended:
            if entry.seq <= self.through and not self._in_missing(entry.seq):
                out.dispositions.append((entry, DUPLICATE, None))
            else:
                out.dispositions.append((entry, DEAD, "after-end"))
            return
        if entry.seq < self.next or entry.seq in self.buffer:
            out.dispositions.append((entry, DUPLICATE, None))
            return
        if entry.seq > self.next:
            # Held entries lie in (next, next + max_buffered], so the window also bounds the hold.
            if entry.seq - self.next > self.max_buffered:
                out.dispositions.append((entry, DEAD, "out-of-window"))
            else:
                self.buffer[entry.seq] = entry
                out.dispositions.append((entry, BUFFERED, None))
            return
        self._process(entry, out)
        out.dispositions.append((entry, PROCESSED, None))
        self._drain_buffer(out)

    def _drain_buffer(self, out: Outcome) -> None:
        while not self.ended and self.next in self.buffer:
            self._process(self.buffer.pop(self.next), out)
        if self.ended:
            self._drop_buffer(out)

    def _drop_buffer(self, out: Outcome) -> None:
        for _, held in sorted(self.buffer.items()):
            out.dispositions.append((held, DEAD, "after-end"))
        self.buffer.clear()

    def _process(self, entry: Entry, out: Outcome) -> None:
        if self.host is None and entry.host:
            self.host = entry.host
        if self.agent is None and entry.agent:
            self.agent = entry.agent
        if self.parent is None and entry.parent:
            self.parent = entry.parent
        if self.continues is None and entry.continues:
            self.continues = entry.continues
        if self.state == "new":
            self.state = "running"
            self._record(out, "started", entry.ts, entry.seq)
        self.next = entry.seq + 1
        norm = self.norm
        if entry.kind == "eof":
            out.events.extend(norm.end(entry.seq, entry.ts, entry.exit))
            self.state = "ended"
            self.through = entry.seq
            extra: dict[str, Any] = {}
            if entry.exit is not None:
                extra["exitCode"] = entry.exit
            if self.missing:
                extra["missing"] = self.missing
            self._record(out, "ended", entry.ts, entry.seq, usage=True, **extra)
            return
        usage_before = norm.usage
        out.events.extend(norm.line(entry.seq, entry.ts, entry.line, entry.stream))
        if norm.usage is not usage_before:
            self._record(out, "completed", entry.ts, entry.seq, usage=True)

    def _abandon(self, marker: Entry, out: Outcome) -> None:
        if self.ended:
            out.dispositions.append((marker, DUPLICATE, None))
            return
        # Entries the marker does not name are not part of the run.
        for seq in sorted(self.buffer):
            if seq > marker.through or any(a <= seq <= b for a, b in marker.missing):
                out.dispositions.append((self.buffer.pop(seq), DEAD, "after-end"))
        missing: list[list[int]] = []
        for seq in sorted(self.buffer):
            if seq > self.next:
                missing.append([self.next, seq - 1])
                out.events.extend(
                    self.norm.warn(
                        seq,
                        marker.ts,
                        f"raw entries {self.next}..{seq - 1} of this run never arrived",
                        "missing-entries",
                        (self.next, seq - 1),
                    )
                )
            self.missing = missing
            self._process(self.buffer.pop(seq), out)
            if self.ended:
                self._drop_buffer(out)
                out.dispositions.append((marker, PROCESSED, None))
                return
        if marker.through >= self.next:
            # The run's last entries never arrived and nothing after them did either.
            missing.append([self.next, marker.through])
        self.missing = missing
        out.events.extend(self.norm.end(max(self.next - 1, 0), marker.ts))
        self.state = "abandoned"
        self.through = max(marker.through, self.next - 1)
        extra: dict[str, Any] = {"missing": missing} if missing else {}
        self._record(out, "abandoned", marker.ts, max(self.next - 1, 0), usage=True, **extra)
        out.dispositions.append((marker, PROCESSED, None))

    # ---------------------------------------------------------------- records
    def _record(self, out: Outcome, state: str, ts: int, seq: int, usage: bool = False, **extra: Any) -> None:
        record: dict[str, Any] = {
            "recordId": f"{self.run}:run:{self.k}",
            "runId": self.run,
            "state": state,
            "timestamp": format_ms(ts),
            "seq": seq,
            "counts": self.norm.counts_by_type(),
        }
        self.k += 1
        if usage and self.norm.usage:
            record.update(self.norm.usage)
        record.update(extra)
        if self.host:
            record["host"] = self.host
        if self.agent:
            record["agent"] = self.agent
        if self.parent:
            record["parentRunId"] = self.parent
        if self.continues:
            record["continuesRunId"] = self.continues
        out.records.append(record)


def plan_abandon(seq: RunSequencer) -> tuple[int, list[list[int]]]:
    """What an abandon marker for this run names now: (through, missing ranges)."""
    held = sorted(seq.buffer)
    through = held[-1] if held else seq.next - 1
    gaps = [s for s in range(seq.next, through + 1) if s not in seq.buffer] if held else []
    return through, _ranges(gaps)
