"""What the tap, `publish` and `spool` say on stderr: one line prefixed with the program's name.

The messages of every job of the tap (services/tap/command.py and the modules it hands off to) go
through here, so a user reads one voice, and a test can match a line whatever module printed it."""

from __future__ import annotations

import logging
import sys

PROG = "goose-ingest"
log = logging.getLogger("goose_ingest.tap")


def setup_logging() -> None:
    root = logging.getLogger("goose_ingest")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False


def err(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)
