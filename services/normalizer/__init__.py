"""The pure core: agent stream lines in, harness events out (contract section 3 and its extension).

Knows nothing of Redis or files. ``RunNormalizer`` holds one run's state, which serialises
to bytes so a run can be processed in pieces by different processes with identical output.
``machinery`` holds what every format shares; ``formats/`` holds each input format's own mapping
(one module per row of contracts/formats.py); ``run_normalizer`` puts them together with the
format decision.
"""

from contracts.events import FORMATS
from services.normalizer.machinery import Limits, RawLine
from services.normalizer.run_normalizer import RunNormalizer

__all__ = ["FORMATS", "Limits", "RawLine", "RunNormalizer"]
