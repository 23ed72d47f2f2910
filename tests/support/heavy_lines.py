"""Valid goose lines that cost a worker seconds of normalizing and redaction (a real slow input),
calibrated against this machine's speed when the test runs (tests/worker/test_cpu_heavy_batches.py,
tests/worker/test_start_under_load.py)."""

from __future__ import annotations

import time

import orjson

from services.sequencer import parse_batch
from services.settings import Settings
from services.worker.processor import BatchProcessor

LINE_BYTES = 475_000


def heavy_line(flags: int) -> bytes:
    """A valid goose tool request of ~LINE_BYTES whose command carries `flags` `--password` flags
    (each one a check of the command before it: the costly part of redaction), padded with text."""
    command = "mysql --password " * flags
    command += "x" * max(0, LINE_BYTES - 300 - len(command))
    return orjson.dumps({"type": "message", "message": {
        "id": "msg_heavy", "role": "assistant", "created": 1790431339,
        "content": [{"type": "toolRequest", "id": "toolu_heavy", "toolCall": {
            "status": "success", "value": {"name": "shell", "arguments": {"command": command}}}}]}})


class _NoScripts:
    def register_script(self, _: str) -> None:
        return None


def line_cost(settings: Settings, line: bytes) -> float:
    """Seconds one heavy line costs the worker's own batch path (normalize + redact), in this process
    (with its eof: a tool request becomes an event, and is redacted, when its message ends)."""
    processor = BatchProcessor(settings, client=_NoScripts())
    fields = [{b"run": b"calibrate/0", b"seq": b"0", b"ts": b"1", b"line": line},
              {b"run": b"calibrate/0", b"seq": b"1", b"ts": b"1", b"kind": b"eof", b"exit": b"0"}]
    entries = parse_batch(["1-0", "2-0"], fields, settings.max_line_bytes)
    processor.new_sequencer("calibrate/1").accept_many(entries)  # type: ignore[arg-type]  # warm-up
    started = time.perf_counter()
    outcome = processor.new_sequencer("calibrate/0").accept_many(entries)  # type: ignore[arg-type]
    assert outcome.events, "the calibration line produced no event: it measures nothing"
    return time.perf_counter() - started


def line_costing(settings: Settings, seconds: float) -> tuple[bytes, float]:
    """A heavy line near `seconds` of work here, and what it really costs (the flag count is capped
    by the line's size, so on a fast machine a line may cost less than asked)."""
    flags = 4_000
    cost = line_cost(settings, heavy_line(flags))
    flags = max(100, min(LINE_BYTES // 17, int(flags * seconds / cost)))
    line = heavy_line(flags)
    return line, line_cost(settings, line)


def runs_on_shard(settings: Settings, shard: int, prefix: str, n: int) -> list[str]:
    names = (f"{prefix}-{i}" for i in range(10_000))
    return [name for name in names if settings.layout.shard_of(name) == shard][:n]
