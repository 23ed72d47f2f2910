"""Reclaim: entries a consumer read but never acknowledged (it died, or it is stuck) are taken over
by another after CLAIM_IDLE_MS, and an entry delivered more than MAX_DELIVERIES times is poison:
dead-lettered `max-deliveries` and acknowledged, so one bad entry never blocks the rest.

The delivery count is Redis's `times_delivered` (XPENDING), raised by every XREADGROUP, XCLAIM and
XAUTOCLAIM of the entry. It counts only real processing attempts because of a rule every consumer
keeps: an attempt the broker refused for its own state (an outage: `services.broker.errors.is_outage`)
is retried IN PLACE, with the claim refreshed (XCLAIM JUSTID does not count a delivery), and the
entry is never released to be claimed again for it. So MAX_DELIVERIES means "this many attempts
failed on the entry itself".

The plan is pure (functional core); each consumer does the I/O with its own client (async for the
worker and `export otlp`, sync threads for `export postgres`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple


class PendingEntry(NamedTuple):
    """One row of XPENDING's extended form."""

    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int


class ReclaimPlan(NamedTuple):
    poison: list[PendingEntry]  # delivered more than MAX_DELIVERIES times: dead-letter and ack
    claim: list[PendingEntry]  # take over and process


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pending_entries(rows: Iterable[Mapping[str, Any]] | None) -> list[PendingEntry]:
    """redis-py's `xpending_range` rows as typed records."""
    return [PendingEntry(_text(r["message_id"]), _text(r.get("consumer", "")), int(r.get("time_since_delivered") or 0),
                         int(r["times_delivered"])) for r in rows or []]


def plan_reclaim(rows: Iterable[PendingEntry], max_deliveries: int, in_flight: Collection[str] = ()) -> ReclaimPlan:
    """Split pending entries into poison and entries to claim. `in_flight`: ids this process is
    working on right now (a slow batch is not a dead consumer's: never taken back from ourselves)."""
    poison: list[PendingEntry] = []
    claim: list[PendingEntry] = []
    for row in rows:
        if row.entry_id in in_flight:
            continue
        (poison if row.deliveries > max_deliveries else claim).append(row)
    return ReclaimPlan(poison, claim)


def max_deliveries_detail(row: PendingEntry) -> str:
    """The dead letter's detail for a poison entry (one wording for every consumer)."""
    return f"delivered {row.deliveries} times"
