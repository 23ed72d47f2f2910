"""The reference side of the compiled-core comparison: runs ``core_cases`` procedures on the Python
core and answers with their bytes.

    GOOSE_INGEST_PURE_PYTHON=1 python -m tests.support.pure_core

Reads one request a line on stdin (stdlib JSON: ``{"op": ..., "case": ...}``), writes one line
a request: the procedure's bytes (orjson output never holds a newline). The first line it writes
says how the core was loaded, so the caller can check that this really is the Python core.
"""

from __future__ import annotations

import json
import sys

from services.native import core_kind
from tests.support import core_cases


def main() -> None:
    out = sys.stdout.buffer
    out.write(json.dumps({"core": core_kind()}).encode() + b"\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.write(core_cases.run(request["op"], request["case"]) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
