"""The one loop that feeds a run's sequencer, for the worker and for ``replay`` alike.

``services/sequencer`` promises that live processing and replay cannot disagree; that holds only
if both hand the sequencer the same items in the same way. So the rules between "raw entries of a
stream" and "a run's sequencer" are written once, here, and both shells call them:

- ``parse_batch`` (entries.py) reads entries: the size cap (``oversize``) and the entry-error rule
  (``invalid-entry``); ``rejected_loss`` says which seq a rejected entry costs its run;
- ``lost_of`` says which seq any dead-lettered raw entry costs its run, and why (oversize only is
  named: its reason is in the log, unlike a crash's);
- ``wrong_shard``: in a cluster an entry read from a shard its run does not belong to is
  dead-lettered (its state lives in another slot), never fed, and its seq is not lost there;
- ``feed``: stretches of entries between lost seqs go to ``accept_many``, each lost seq to
  ``lose`` at its stream id's time, into one ``Outcome``.

What is dead-lettered, counted and committed stays in the shells (services/worker/processor.py,
services/sequencer/rebuild.py): this module decides, they act.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from contracts.raw import ABANDON, OVERSIZE, stream_id_ms
from services.sequencer.entries import Entry, Rejected, entry_identity
from services.sequencer.run import Outcome, RunSequencer


class Lost(NamedTuple):
    """A seq of a run whose entry was dead-lettered before reaching the sequencer."""

    run: str
    seq: int
    sid: str
    reason: str | None = None  # named in the run's warning (oversize only: replay knows it too)


RunItem = Entry | Lost


class Fed(NamedTuple):
    """What one ``feed`` produced: the outcome, and the stream-id time (ms) of the run's latest
    activity among the items (0: none), for the run's `lastActivity`."""

    outcome: Outcome
    last_ms: int


def lost_of(fields: dict[bytes, bytes], sid: str, reason: str) -> Lost | None:
    """The seq a raw entry dead-lettered for ``reason`` costs its run (None: it names no run and
    seq). Only ``oversize`` is named in the run's warning."""
    identity = entry_identity(fields)
    if identity is None:
        return None
    return Lost(identity.run, identity.seq, sid, reason if reason == OVERSIZE else None)


def rejected_loss(rejected: Rejected, fields: dict[bytes, bytes], sid: str) -> Lost | None:
    """The seq an entry ``parse_batch`` rejected costs its run: an oversize entry's run and seq as
    far as they can be read (named ``oversize``), an invalid entry's when both were valid before
    another field failed; None when it names no run and seq."""
    if rejected.reason == OVERSIZE:
        return lost_of(fields, sid, OVERSIZE)
    if rejected.run is not None and rejected.seq is not None:
        return Lost(rejected.run, rejected.seq, sid)
    return None


def wrong_shard(run: str, shard: int, shard_of: Callable[[str], int] | None) -> str | None:
    """The dead-letter detail of an entry of ``run`` read from ``shard`` when its run belongs to
    another shard (``shard_of`` None: one shard, or no cluster, so every run is at home)."""
    if shard_of is None:
        return None
    home = shard_of(run)
    return None if home == shard else f"run belongs to shard {home}, not {shard}"


def _no_step() -> None:
    return None


def feed(sequencer: RunSequencer, items: Sequence[RunItem], outcome: Outcome | None = None,
         step: Callable[[], None] = _no_step, step_chars: int = 0) -> Fed:
    """Run a run's items (in stream order) through its sequencer.

    ``step`` runs before the run and after every ``step_chars`` characters of lines (0: never in
    between): the worker renews its shard leases there, so a long run cannot outlast them
    (docs/architecture.md, "Leases"); replay passes nothing. Cutting a stretch into steps changes
    nothing the sequencer decides: ``accept_many`` of a stretch equals ``accept_many`` of its parts.
    """
    out = Outcome() if outcome is None else outcome
    step()
    last_ms = 0
    last_dated: Entry | None = None
    entries: list[Entry] = []  # a stretch between lost seqs (up to step_chars of lines): one accept_many
    chars = 0
    for item in items:
        if isinstance(item, Lost):
            if entries:
                sequencer.accept_many(entries, out)
                entries, chars = [], 0
            ms = stream_id_ms(item.sid)
            sequencer.lose(item.seq, ms, out, item.reason)
            last_ms = max(last_ms, ms)
            continue
        entries.append(item)
        if item.kind != ABANDON:  # abandon markers come from the control stream: not activity of the run
            last_dated = item
        if step_chars:
            chars += len(item.line)
            if chars >= step_chars:
                sequencer.accept_many(entries, out)
                entries, chars = [], 0
                step()
    if entries:
        sequencer.accept_many(entries, out)
    if last_dated is not None:  # items are in stream order: the last dated one has the latest id
        last_ms = max(last_ms, stream_id_ms(last_dated.sid))
    return Fed(out, last_ms)
