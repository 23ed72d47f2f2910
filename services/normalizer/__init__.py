"""The pure core: agent stream lines in, harness events out (contract section 3 and its extension).

Knows nothing of Redis or files. ``RunNormalizer`` holds one run's state, which serialises
to bytes so a run can be processed in pieces by different processes with identical output.
``run_normalizer`` holds what every format shares; ``goose_format``, ``claude_format`` and
``codex_format`` hold each input format's own mapping.
"""

from contracts.events import FORMATS
from services.normalizer.run_normalizer import Limits, RawLine, RunNormalizer

__all__ = ["FORMATS", "Limits", "RawLine", "RunNormalizer"]
