"""Harness events: what goose-ingest republishes (contract section 2).

Every event is one flat JSON object: envelope fields, then the kind's fields. Optional fields
without a value are omitted, never null: the models give them no `None` in their JSON type,
and producers serialise with ``exclude_none``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

EVENT_TYPES = (
    "agent",
    "reasoning",
    "read",
    "write",
    "command",
    "search",
    "list",
    "skill",
    "error",
    "warning",
    "unknown",
)
TOOL_EVENT_TYPES = ("read", "write", "command", "search", "list", "skill")

# The agent output formats a run can have (extension section 1); the `format` label of run records.
InputFormat = Literal["goose", "claude-code", "codex", "gemini-cli", "opencode"]
FORMATS: tuple[str, ...] = get_args(InputFormat)

Line = Annotated[int, Field(ge=1)]

# What kind of failure an `error` (or a retry `warning`) reports: a closed vocabulary, assigned by
# services/normalizer/error_classes.py (rules and their sources: docs/contract.md, "Error classes").
ErrorClass = Literal["rate_limit", "auth", "quota", "context_length", "provider_unavailable", "timeout", "max_turns",
                     "cancelled", "agent_exit", "other"]
ERROR_CLASSES: tuple[str, ...] = get_args(ErrorClass)


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eventId: str = Field(description="`<run>:<n>`, n = 0-based index of the event within its run.")
    runId: str = Field(description="The run key.")
    seq: int = Field(ge=0, description="n, the index of the event within its run.")
    timestamp: str = Field(
        pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$",
        description="RFC 3339 UTC with milliseconds: the `ts` of the raw entry whose processing emitted the event.",
    )
    lines: tuple[int, int] = Field(description="[first, last] raw seqs of the entries whose content the event carries.")
    sessionId: str = Field(  # type: ignore[assignment]
        default=None,
        min_length=1,
        description="The agent CLI's own session id current when the event was emitted (Claude Code and Gemini CLI `session_id`, "
        "Codex `thread_id`, opencode `sessionID`); omitted when unknown and always for goose.",
    )


class ToolFields(BaseModel):
    """Carried by events built from a tool call."""

    tool: str = Field(default=None, description="The tool name exactly as the agent sent it (Codex: the item type or mcp__<server>__<tool>).")  # type: ignore[assignment]
    toolCallId: str = Field(default=None, description="The agent's tool call id (Codex: the item id).")  # type: ignore[assignment]
    durationMs: int = Field(default=None, description="ts of the entry that completed the call minus ts of the entry that started it.")  # type: ignore[assignment]


class AgentEvent(Envelope):
    type: Literal["agent"]
    message: str
    truncated: Literal[True] = Field(default=None, description="Present when the text was cut at the span cap.")  # type: ignore[arg-type]


class ReasoningEvent(Envelope):
    type: Literal["reasoning"]
    message: str
    truncated: Literal[True] = Field(default=None, description="Present when the text was cut at the span cap.")  # type: ignore[arg-type]


class CommandEvent(Envelope, ToolFields):
    type: Literal["command"]
    command: str = Field(min_length=1)
    exitCode: int = None  # type: ignore[assignment]
    isSuccess: bool = None  # type: ignore[assignment]


class ReadEvent(Envelope, ToolFields):
    type: Literal["read"]
    path: str = Field(min_length=1)
    startLine: Line = None  # type: ignore[assignment]
    endLine: Line = None  # type: ignore[assignment]
    isSuccess: bool = None  # type: ignore[assignment]


class WriteEvent(Envelope, ToolFields):
    type: Literal["write"]
    path: str = Field(min_length=1)
    startLine: Line = None  # type: ignore[assignment]
    endLine: Line = None  # type: ignore[assignment]
    isSuccess: bool = None  # type: ignore[assignment]


class SearchEvent(Envelope, ToolFields):
    type: Literal["search"]
    query: str = Field(min_length=1)
    path: str = None  # type: ignore[assignment]
    isSuccess: bool = None  # type: ignore[assignment]


class ListEvent(Envelope, ToolFields):
    type: Literal["list"]
    path: str = None  # type: ignore[assignment]
    isSuccess: bool = None  # type: ignore[assignment]


class SkillEvent(Envelope, ToolFields):
    type: Literal["skill"]
    path: str = Field(min_length=1)
    skillName: str = None  # type: ignore[assignment]
    isSuccess: bool = None  # type: ignore[assignment]


class ErrorEvent(Envelope):
    type: Literal["error"]
    message: str
    code: str = None  # type: ignore[assignment]
    errorClass: ErrorClass = Field(
        default=None,  # type: ignore[arg-type]
        description="The kind of failure (closed vocabulary, docs/contract.md \"Error classes\"); set on every error "
        "event since contract 1.1 (absent only on events published before it).",
    )


class WarningEvent(Envelope):
    type: Literal["warning"]
    message: str
    code: str = None  # type: ignore[assignment]
    errorClass: ErrorClass = Field(
        default=None,  # type: ignore[arg-type]
        description="On warnings that announce a retry of a failure (code api_retry, retry, rate_limit): the kind of "
        "failure being retried, as on error events. Absent on other warnings.",
    )


class UnknownEvent(Envelope, ToolFields):
    type: Literal["unknown"]
    raw: Any = Field(description="The unclassifiable record or block, kept whole (goose's own nulls included).")


HarnessEvent = Annotated[
    AgentEvent | ReasoningEvent | CommandEvent | ReadEvent | WriteEvent | SearchEvent | ListEvent | SkillEvent | ErrorEvent | WarningEvent | UnknownEvent,
    Field(discriminator="type"),
]

harness_event_adapter: TypeAdapter[Any] = TypeAdapter(HarnessEvent)
