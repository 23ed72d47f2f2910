"""The order `tail` and `up` print topic entries in: the order they were committed.

Runs interleave by stream-id time, and each run's own entries are in the run's order: stream ids of
two streams are not comparable within one commit (a script's XADDs may straddle a millisecond). An
event's `seq` is its index in the run; a record's `counts` say how many events the run had when it
was written, so a record goes right before the event with that index. Pure: no broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.stream_ids import StreamId

RECORD_RANK, EVENT_RANK = 0, 1  # a record written when the run had N events comes before event N


@dataclass(frozen=True)
class Followed:
    """A decoded topic entry waiting to be printed, with where it was read (for the commit order)."""

    stream: str
    sid: str
    is_record: bool
    data: dict[str, Any]

    @property
    def ms(self) -> int:
        return StreamId.parse(self.sid).ms

    @property
    def time_order(self) -> tuple[int, int]:
        return StreamId.parse(self.sid)

    @property
    def run_order(self) -> tuple[float, int, int, int]:
        """Position inside its run: by event index, a record before the event it preceded."""
        ms, n = StreamId.parse(self.sid)
        position: float
        if self.is_record:
            counts = self.data.get("counts")
            if isinstance(counts, dict):
                position = sum(v for v in counts.values() if isinstance(v, int))
            else:  # not a contract record: STARTED first, anything else after the run's events
                position = 0 if self.data.get("state") == "started" else float("inf")
            rank = RECORD_RANK
        else:
            seq = self.data.get("seq")
            position = seq if isinstance(seq, int) else float("inf")
            rank = EVENT_RANK
        return position, rank, ms, n

    @property
    def run(self) -> str:
        return str(self.data.get("runId", ""))


def commit_order(entries: list[Followed]) -> list[Followed]:
    """Entries by stream-id time, each run's entries then put in run order within the slots it holds."""
    by_time = sorted(entries, key=lambda e: e.time_order)
    slots: dict[str, list[int]] = {}
    for i, entry in enumerate(by_time):
        slots.setdefault(entry.run, []).append(i)
    ordered = list(by_time)
    for indexes in slots.values():
        for i, entry in zip(indexes, sorted((by_time[i] for i in indexes), key=lambda e: e.run_order), strict=True):
            ordered[i] = entry
    return ordered
