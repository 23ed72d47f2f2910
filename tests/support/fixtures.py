"""Paths to the shared goose transcripts (read-only, beside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("GOOSE_INGEST_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "goose"
TRANSCRIPTS = sorted(FIXTURES.glob("*.jsonl"))
GOLDEN = REPO / "tests" / "golden"
GOLDEN_EPOCH = 1_790_000_000_000


def transcript_lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").splitlines()
