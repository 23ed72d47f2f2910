"""Pure per-run sequencing: order by seq, drop duplicates, hold early entries, end runs.

Sits between the raw log and the normaliser; the worker, ``replay`` and tests all drive
the same ``RunSequencer`` so that live processing and replay cannot disagree.
"""

from services.sequencer.entries import (
    Entry,
    EntryError,
    EntryIdentity,
    Rejected,
    entry_identity,
    parse_batch,
    parse_fields,
)
from services.sequencer.run import Disposition, HeldChanges, Outcome, RunSequencer, missing_ranges, plan_abandon, tally

__all__ = ["Disposition", "Entry", "EntryError", "EntryIdentity", "entry_identity", "HeldChanges", "Outcome", "Rejected",
           "RunSequencer", "missing_ranges", "parse_batch", "parse_fields", "plan_abandon", "tally"]
