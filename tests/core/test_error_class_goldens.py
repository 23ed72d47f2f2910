"""A golden per error class and format: small checked-in inputs under tests/golden/error-classes/<format>/
(`<class>.jsonl`, written the way each CLI prints that failure: docs/contract.md, "Error classes", and
the shared format specs) with their checked-in normalizer output (`<class>.events.jsonl`).

The shared fixtures only reach six classes; these reach every class each CLI can print. Not here:
`max_turns` for goose, Codex and opencode (goose's max-turns stop is an agent message, not an error; Codex
exec has no turn limit; opencode's step limit ends like an answer). `agent_exit` inputs end with exit code 1 (the normalizer's own end-of-run error).
Regenerate with `UPDATE_GOLDEN=1 pytest tests/core/test_error_class_goldens.py` and review the diff.
"""

from __future__ import annotations

import os

import orjson
import pytest

from contracts.events import ERROR_CLASSES, harness_event_adapter
from services.normalizer import RunNormalizer
from tests.support.fixtures import GOLDEN, GOLDEN_EPOCH

ROOT = GOLDEN / "error-classes"
FORMATS = ("goose", "claude-code", "codex", "gemini-cli", "opencode")
# opencode: its step limit ends like an answer, nothing says it was hit (docs/contract.md "opencode").
NOT_PRINTED = {"goose": {"max_turns"}, "claude-code": set(), "codex": {"max_turns"}, "gemini-cli": set(),
               "opencode": {"max_turns"}}
EXIT_CODES = {"agent_exit": 1}
CASES = [(fmt, cls) for fmt in FORMATS for cls in ERROR_CLASSES if cls not in NOT_PRINTED[fmt]]


def normalize(fmt: str, cls: str) -> list[dict]:
    norm = RunNormalizer(f"{fmt}/{cls}", fmt=fmt)
    lines = (ROOT / fmt / f"{cls}.jsonl").read_text().splitlines()
    out: list[dict] = []
    for seq, line in enumerate(lines):
        out += norm.line(seq, GOLDEN_EPOCH + seq, line)
    out += norm.end(len(lines), GOLDEN_EPOCH + len(lines), EXIT_CODES.get(cls, 0))
    return out


def test_every_class_each_cli_prints_has_an_input_and_nothing_else_is_there():
    for fmt in FORMATS:
        inputs = {p.name.removesuffix(".jsonl") for p in (ROOT / fmt).glob("*.jsonl") if not p.name.endswith(".events.jsonl")}
        goldens = {p.name.removesuffix(".events.jsonl") for p in (ROOT / fmt).glob("*.events.jsonl")}
        assert inputs == goldens == set(ERROR_CLASSES) - NOT_PRINTED[fmt], fmt


@pytest.mark.parametrize(("fmt", "cls"), CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_golden_per_class(fmt, cls):
    events = normalize(fmt, cls)
    out = b"".join(orjson.dumps(e) + b"\n" for e in events)
    golden = ROOT / fmt / f"{cls}.events.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_bytes(out)
    assert out == golden.read_bytes()
    for event in events:
        harness_event_adapter.validate_python(event)
    # the input reaches its class: every error (and retry warning) of the run carries it
    classified = [e for e in events if e["type"] == "error" or "errorClass" in e]
    assert [e for e in classified if e["type"] == "error"], "the input produces no error event"
    assert {e.get("errorClass") for e in classified} == {cls}, [(e["type"], e.get("errorClass"), e.get("message"))
                                                              for e in classified]
