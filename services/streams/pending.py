"""Reclaim: entries a consumer read but never acknowledged (it died, or it is stuck) are taken over
by another after CLAIM_IDLE_MS, and an entry delivered more than MAX_DELIVERIES times is poison:
dead-lettered `max-deliveries` and acknowledged, so one bad entry never blocks the rest.

The delivery count is Redis's `times_delivered` (XPENDING), raised by every XREADGROUP and XCLAIM
of the entry (and XAUTOCLAIM, which no consumer here uses). It counts only real processing
attempts because of a rule every consumer keeps: an attempt the broker refused for its own state (an outage: `services.broker.errors.is_outage`)
is retried IN PLACE, with the claim refreshed (XCLAIM JUSTID does not count a delivery), and the
entry is never released to be claimed again for it. So MAX_DELIVERIES means "this many attempts
failed on the entry itself".

One reclaim for every consumer (issue 33): the plan is pure (functional core), and the broker calls
around it are written ONCE, as steps (`reclaim`, `pending_page`, `dead_consumer_rows`: generators
that yield each call as a `Call` and get its reply back, "sans I/O"). Two drivers run them on a
client: `drive` on a sync one (the thread consumers' `GroupReader.sweep`), `drive_async` on an
async one (the worker's housekeeping and `export otlp`), where the worker wraps each call in its
outage retry. So the order of XPENDING, XRANGE, XCLAIM and XACK, what counts as poison and what
counts as gone cannot differ between consumers; what each does with the result is its own (the
worker commits poison with its outputs in `commit.lua`, the others through `DeadLetterWriter`, the
archive archives it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Generator, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, TypeVar

from contracts.stream_ids import StreamId

T = TypeVar("T")
CLAIM_CHUNK = 1_000  # ids per XCLAIM: one reply stays a few MB even for large entries


class StreamEntry(NamedTuple):
    """One entry as read from a stream: where it is, its id, its fields."""

    stream: str
    entry_id: str
    fields: dict[bytes, bytes]


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


# ---------------------------------------------------------------------------------- the I/O, once
class Call(NamedTuple):
    """One broker call a step needs: the client method's name and its arguments."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}


Steps = Generator[Call, Any, T]


class Poison(NamedTuple):
    entry: StreamEntry  # with its fields, for the dead letter's `raw.*`
    row: PendingEntry  # its delivery count, for the detail


class Reclaimed(NamedTuple):
    claimed: list[StreamEntry]  # now this consumer's (XCLAIM counted a delivery), in id order
    poison: list[Poison]  # past MAX_DELIVERIES, not claimed: the caller dead-letters and acknowledges them
    gone: list[str]  # pending but trimmed from the stream: acknowledged here, nothing left to handle


def pending_page(stream: str, group: str, count: int, *, idle_ms: int | None = None, after: str | None = None,
                 consumer: str | None = None) -> Steps[list[PendingEntry]]:
    """Up to `count` pending entries of `stream` (idle for `idle_ms`, of `consumer`), in id order,
    those after `after` only (XPENDING's exclusive range, Redis 6.2+)."""
    kwargs: dict[str, Any] = {"min": "-" if after is None else "(" + after, "max": "+", "count": count}
    if idle_ms is not None:
        kwargs["idle"] = idle_ms
    if consumer is not None:
        kwargs["consumername"] = consumer
    return pending_entries((yield Call("xpending_range", (stream, group), kwargs)))


def dead_consumer_rows(stream: str, group: str, me: str, idle_ms: int) -> Steps[list[PendingEntry]]:
    """All the pending entries of the one other consumer whose entries are ALL idle for `idle_ms`
    and whose oldest entry is oldest; [] if none. A consumer with one entry read more recently is
    left alone (alive, or not dead long enough). For a consumer whose batches keep their boundaries."""
    summary = (yield Call("xpending", (stream, group))) or {}
    best: list[PendingEntry] = []
    for row in summary.get("consumers") or []:
        name, total = _text(row["name"]), int(row["pending"])
        if name == me or total <= 0:
            continue
        rows = yield from pending_page(stream, group, total, idle_ms=idle_ms, consumer=name)
        if len(rows) < total:
            continue
        if not best or StreamId.parse(rows[0].entry_id) < StreamId.parse(best[0].entry_id):
            best = rows
    return best


def reclaim(stream: str, group: str, consumer: str, rows: Sequence[PendingEntry], *, idle_ms: int,
            max_deliveries: int, in_flight: Collection[str] = (), claim: bool = True) -> Steps[Reclaimed]:
    """`plan_reclaim` on `rows`, then: the poison's fields (XRANGE, for `raw.*`), XCLAIM of the rest
    (only those still idle for `idle_ms`: a consumer that came back in between keeps its entries),
    XACK of what was trimmed while pending. `claim=False`: poison only (a consumer checking its
    own pending entries at start)."""
    plan = plan_reclaim(rows, max_deliveries, in_flight)
    poison: list[Poison] = []
    gone: list[str] = []
    for row in plan.poison:
        found = yield Call("xrange", (stream,), {"min": row.entry_id, "max": row.entry_id})
        if found and found[0][1]:
            poison.append(Poison(StreamEntry(stream, row.entry_id, found[0][1]), row))
        else:
            gone.append(row.entry_id)
    claimed: list[StreamEntry] = []
    ids = [row.entry_id for row in plan.claim] if claim else []
    for i in range(0, len(ids), CLAIM_CHUNK):
        chunk = ids[i: i + CLAIM_CHUNK]
        reply = yield Call("xclaim", (stream, group, consumer, idle_ms, chunk))
        got = {_text(entry_id): fields for entry_id, fields in reply or []}
        for entry_id in chunk:
            if got.get(entry_id):
                claimed.append(StreamEntry(stream, entry_id, got[entry_id]))
            elif entry_id in got:  # claimed, but trimmed from the stream (Redis before 7 returns it empty)
                gone.append(entry_id)
            # absent: another consumer read it since, or Redis 7 dropped a trimmed one; not ours
    if gone:
        yield Call("xack", (stream, group, *gone))
    return Reclaimed(claimed, poison, gone)


def hand_over(stream: str, group: str, consumer: str, previous: str, count: int) -> Steps[int]:
    """All `count` pending entries of consumer `previous` become `consumer`'s at once, whatever their
    idle time, with XCLAIM JUSTID (no delivery counted: a takeover is not an attempt on the
    entries). Only for a consumer that holds a lease proving `previous` is dead (the archive's
    `adopt`); the entries are then read again as its own."""
    rows = yield from pending_page(stream, group, count, consumer=previous)
    ids = [row.entry_id for row in rows]
    for i in range(0, len(ids), CLAIM_CHUNK):
        yield Call("xclaim", (stream, group, consumer, 0, ids[i: i + CLAIM_CHUNK]), {"justid": True})
    return len(ids)


def drive(client: Any, steps: Steps[T]) -> T:
    """Run `steps` on a sync redis client."""
    try:
        call = next(steps)
        while True:
            call = steps.send(getattr(client, call.method)(*call.args, **call.kwargs))
    except StopIteration as done:
        return done.value


async def drive_async(client: Any, steps: Steps[T],
                      around: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None) -> T:
    """Run `steps` on an async redis client; `around(call)` wraps each call (the worker retries an
    outage in place there)."""
    try:
        call = next(steps)
        while True:
            once = partial(getattr(client, call.method), *call.args, **call.kwargs)
            call = steps.send(await (around(once) if around else once()))
    except StopIteration as done:
        return done.value
