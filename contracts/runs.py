"""Run lifecycle records (contract section 4): one per transition, on the runs topic."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from contracts.events import InputFormat

RUN_STATES = ("started", "completed", "ended", "abandoned")


class Usage(BaseModel):
    """The agent's cumulative counters from its last completion record (goose `complete`, Claude Code
    `result`, Codex `turn.completed`, Gemini CLI `result`); for opencode, whose usage is per step, the
    sum over the run's `step_finish` records so far. `inputTokens` is the whole prompt, cache reads
    and writes included."""

    inputTokens: int = None  # type: ignore[assignment]
    outputTokens: int = None  # type: ignore[assignment]
    totalTokens: int = None  # type: ignore[assignment]
    cacheReadInputTokens: int = None  # type: ignore[assignment]
    cacheWriteInputTokens: int = None  # type: ignore[assignment]
    costUsd: float = None  # type: ignore[assignment]


class RunRecordBase(Usage):
    model_config = ConfigDict(extra="forbid")

    recordId: str = Field(description="`<run>:run:<k>`, k = 0-based index of the record within its run.")
    runId: str
    timestamp: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
    seq: int = Field(ge=0, description="Raw seq of the entry that caused the transition (for abandoned: the last one taken).")
    counts: dict[str, int] = Field(description="The run's harness events so far, by type (every type present).")
    host: str = None  # type: ignore[assignment]
    agent: str = None  # type: ignore[assignment]
    format: InputFormat = Field(default=None, description="The run's input format, fixed when its seq-0 entry was processed.")  # type: ignore[arg-type]
    parentRunId: str = Field(default=None, description="The parent run of a subagent session (imported runs).")  # type: ignore[assignment]
    continuesRunId: str = Field(default=None, description="The run this one continues (a later part of an imported session).")  # type: ignore[assignment]


class RunStarted(RunRecordBase):
    state: Literal["started"]


class RunCompleted(RunRecordBase):
    state: Literal["completed"]


class RunEnded(RunRecordBase):
    state: Literal["ended"]
    exitCode: int = None  # type: ignore[assignment]
    missing: list[tuple[int, int]] = Field(default=None, description="Ranges of raw seqs that never arrived.")  # type: ignore[arg-type]


class RunAbandoned(RunRecordBase):
    state: Literal["abandoned"]
    missing: list[tuple[int, int]] = Field(default=None, description="Ranges of raw seqs that never arrived.")  # type: ignore[arg-type]


RunRecord = Annotated[RunStarted | RunCompleted | RunEnded | RunAbandoned, Field(discriminator="state")]
run_record_adapter: TypeAdapter[Any] = TypeAdapter(RunRecord)
