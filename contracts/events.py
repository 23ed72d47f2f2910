"""Harness events: what goose-ingest republishes (contract section 2).

Every event is one flat JSON object: envelope fields, then the kind's fields. Optional fields
without a value are omitted, never null: the models give them no `None` in their JSON type,
and producers serialise with ``exclude_none``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

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

Line = Annotated[int, Field(ge=1)]


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


class ToolFields(BaseModel):
    """Carried by events built from a tool call."""

    tool: str = Field(default=None, description="The tool name exactly as goose sent it.")  # type: ignore[assignment]
    toolCallId: str = Field(default=None, description="goose's tool call id.")  # type: ignore[assignment]
    durationMs: int = Field(default=None, description="Response ts minus request ts.")  # type: ignore[assignment]


class AgentEvent(Envelope):
    type: Literal["agent"]
    message: str
    truncated: Literal[True] = Field(default=None, description="Present when the text was cut at the span cap.")  # type: ignore[assignment]


class ReasoningEvent(Envelope):
    type: Literal["reasoning"]
    message: str
    truncated: Literal[True] = Field(default=None, description="Present when the text was cut at the span cap.")  # type: ignore[assignment]


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


class WarningEvent(Envelope):
    type: Literal["warning"]
    message: str
    code: str = None  # type: ignore[assignment]


class UnknownEvent(Envelope, ToolFields):
    type: Literal["unknown"]
    raw: Any = Field(description="The unclassifiable record or block, kept whole (goose's own nulls included).")


HarnessEvent = Annotated[
    Union[
        AgentEvent,
        ReasoningEvent,
        CommandEvent,
        ReadEvent,
        WriteEvent,
        SearchEvent,
        ListEvent,
        SkillEvent,
        ErrorEvent,
        WarningEvent,
        UnknownEvent,
    ],
    Field(discriminator="type"),
]

harness_event_adapter: TypeAdapter[Any] = TypeAdapter(HarnessEvent)
