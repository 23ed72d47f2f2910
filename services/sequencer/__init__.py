"""Pure per-run sequencing: order by seq, drop duplicates, hold early entries, end runs.

Sits between the raw log and the normaliser; the worker, ``replay`` and tests all drive
the same ``RunSequencer`` so that live processing and replay cannot disagree.
"""

from services.sequencer.entries import Entry, EntryError, parse_fields
from services.sequencer.run import Outcome, RunSequencer, plan_abandon

__all__ = ["Entry", "EntryError", "parse_fields", "Outcome", "RunSequencer", "plan_abandon"]
