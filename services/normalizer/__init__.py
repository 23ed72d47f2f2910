"""The pure core: goose stream-json lines in, harness events out (contract section 3).

Knows nothing of Redis or files. ``RunNormalizer`` holds one run's state, which serialises
to bytes so a run can be processed in pieces by different processes with identical output.
"""

from services.normalizer.machine import Limits, RunNormalizer

__all__ = ["Limits", "RunNormalizer"]
