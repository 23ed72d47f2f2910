"""Raw entries: what a tap publishes for every line goose prints (contract section 1), and the
names of what happens to them (outcomes, dead-letter reasons): one source for every reader."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.stream_ids import StreamId

RUN_KEY_PATTERN = r"^[A-Za-z0-9._:/@-]{1,200}$"
MAX_LABEL_CHARS = 64  # `format` is a short label (goose | claude-code | codex | ...)
# Bytes of out-of-order entries a run may hold before more are dead-lettered HOLD_LIMIT (the default of
# GOOSE_INGEST_MAX_HELD_BYTES, docs/contract.md). Here, not in the sequencer, so that Settings can take
# it without importing the sequencer and the normalizer.
DEFAULT_MAX_HELD_BYTES = 64 * 1024 * 1024
# Bytes of unanswered tool calls a run may keep before the oldest is surfaced as `unknown` (the default
# of GOOSE_INGEST_MAX_PENDING_TOOL_BYTES, docs/contract.md); here for the same reason. Sixteen calls of
# the largest line a tap sends (MAX_LINE_BYTES, 1 MiB) fit; a real run keeps a few small ones.
DEFAULT_MAX_PENDING_TOOL_BYTES = 16 * 1024 * 1024
# Which cap surfaced a pending tool call early (MAX_PENDING_TOOLS, MAX_PENDING_TOOL_BYTES): the `cap`
# label of goose_ingest_pending_tool_evictions.
PENDING_TOOL_CAPS: tuple[str, ...] = ("count", "bytes")

# Entry kinds. `abandon` is a control entry: only workers write it, on the control streams.
LINE = "line"
EOF = "eof"
ABANDON = "abandon"
RAW_KINDS: tuple[str, ...] = (LINE, EOF)
CONTROL_KINDS: tuple[str, ...] = (ABANDON,)

# What a worker did with a raw entry (the `outcome` label of goose_ingest_raw_entries).
PROCESSED = "processed"
DUPLICATE = "duplicate"
BUFFERED = "buffered"
DEAD = "dead_lettered"
RAW_OUTCOMES: tuple[str, ...] = (PROCESSED, DUPLICATE, BUFFERED, DEAD)

# Why an entry was dead-lettered (the `reason` field of goose.deadletter and its metric label).
INVALID_ENTRY = "invalid-entry"  # a field does not parse (or a control entry on a raw stream)
OVERSIZE = "oversize"  # larger than MAX_LINE_BYTES
MAX_DELIVERIES = "max-deliveries"  # delivered more than MAX_DELIVERIES times without a commit
AFTER_END = "after-end"  # the run had already ended
OUT_OF_WINDOW = "out-of-window"  # seq too far ahead of the run's next expected one
HOLD_LIMIT = "hold-limit"  # the run already holds MAX_HELD_BYTES of out-of-order entries
PROCESSING_ERROR = "processing-error"  # normalizing or redacting it raised, or its commit failed
DEAD_LETTER_REASONS: tuple[str, ...] = (
    INVALID_ENTRY,
    OVERSIZE,
    MAX_DELIVERIES,
    AFTER_END,
    OUT_OF_WINDOW,
    HOLD_LIMIT,
    PROCESSING_ERROR,
)


def stream_id_ms(sid: str | bytes) -> int:
    """The millisecond part of a Redis stream id (`<ms>-<n>`): the Redis clock when it was added."""
    ms = StreamId.ms_of(sid)
    return ms if ms is not None and ms < 10**15 else 0  # 0: not an id (or beyond any clock)


class RawEntry(BaseModel):
    """One stdout/stderr line of a goose run, or its end (`kind=eof`); on the worker-only control
    stream, an abandon marker (`kind=abandon` with `through` and `missing`).

    On a Redis stream every field is a plain string field of the entry (see docs/raw-entries.md).
    """

    # Workers ignore fields they do not know (a shipper may add its own, e.g. provenance).
    model_config = ConfigDict(extra="allow", title="RawEntry", json_schema_extra={"additionalProperties": {"type": "string"}})

    run: str = Field(pattern=RUN_KEY_PATTERN, description="Run key, globally unique (prefix an installation namespace).")
    seq: int = Field(ge=0, le=2**53, description="0 for the run's first entry, then +1 per entry, no gaps; assigned by the tap.")
    ts: int | str = Field(description="When the tap read the line: Unix milliseconds or an RFC 3339 UTC string.")
    kind: Literal["line", "eof", "abandon"] = Field(
        default="line",
        description="`eof`: the run's input ended. `abandon`: a worker's abandon marker, only valid on the control stream.",
    )
    stream: Literal["stdout", "stderr"] = Field(default="stdout")
    line: str = Field(default=None, description="The raw line without its newline; required for kind=line.")  # type: ignore[assignment]
    exit: int = Field(default=None, ge=-(2**31), le=2**31 - 1, description="goose's exit code, on eof entries when known.")  # type: ignore[assignment]
    signal: int = Field(  # type: ignore[assignment]
        default=None, ge=1, le=127,
        description="kind=eof: the signal the tap forwarded to the command (SIGINT 2, SIGTERM 15, SIGHUP 1), when it did; "
        "the run then ends with a `cancelled` error whatever the exit code (Gemini CLI exits 0 on SIGINT).",
    )
    host: str = Field(default=None, description="Label copied into run lifecycle records.")  # type: ignore[assignment]
    agent: str = Field(default=None, description="Label copied into run lifecycle records, e.g. goose/1.56.0.")  # type: ignore[assignment]
    format: str = Field(  # type: ignore[assignment]
        default=None,
        max_length=MAX_LABEL_CHARS,
        description="The agent's output format: goose, claude-code, codex, gemini-cli, opencode (other short text is kept and reported).",
    )
    parent: str = Field(  # type: ignore[assignment]
        default=None, pattern=RUN_KEY_PATTERN, description="Run key of the parent run (subagent sessions)."
    )
    continues: str = Field(  # type: ignore[assignment]
        default=None, pattern=RUN_KEY_PATTERN, description="Run key this run continues (a later part of an imported session)."
    )
    through: int = Field(  # type: ignore[assignment]
        default=None, ge=-1, le=2**53, description="kind=abandon: the last seq the run consists of (-1: none)."
    )
    missing: list[tuple[int, int]] = Field(
        default=None,  # type: ignore[arg-type]
        description="kind=abandon: JSON list of [first, last] seq ranges that never arrived."
    )

    @model_validator(mode="after")
    def _fields_for_kind(self) -> RawEntry:
        if self.kind == "line" and self.line is None:
            raise ValueError("kind=line needs a `line` field")
        if self.kind == "abandon" and self.through is None:
            raise ValueError("kind=abandon needs a `through` field")
        return self
