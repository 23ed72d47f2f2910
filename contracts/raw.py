"""Raw entries: what a tap publishes for every line goose prints (contract section 1)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RUN_KEY_PATTERN = r"^[A-Za-z0-9._:/@-]{1,200}$"


class RawEntry(BaseModel):
    """One stdout/stderr line of a goose run, or its end (`kind=eof`).

    On a Redis stream every field is a plain string field of the entry (see docs/raw-entries.md).
    """

    model_config = ConfigDict(extra="forbid", title="RawEntry")

    run: str = Field(pattern=RUN_KEY_PATTERN, description="Run key, globally unique (prefix an installation namespace).")
    seq: int = Field(ge=0, description="0 for the run's first entry, then +1 per entry, no gaps; assigned by the tap.")
    ts: int | str = Field(description="When the tap read the line: Unix milliseconds or an RFC 3339 UTC string.")
    kind: Literal["line", "eof"] = Field(default="line", description="`eof`: the run's input ended.")
    stream: Literal["stdout", "stderr"] = Field(default="stdout")
    line: str = Field(default=None, description="The raw line without its newline; required for kind=line.")  # type: ignore[assignment]
    exit: int = Field(default=None, description="goose's exit code, on eof entries when known.")  # type: ignore[assignment]
    host: str = Field(default=None, description="Label copied into run lifecycle records.")  # type: ignore[assignment]
    agent: str = Field(default=None, description="Label copied into run lifecycle records, e.g. goose/1.56.0.")  # type: ignore[assignment]

    @model_validator(mode="after")
    def _line_for_lines(self) -> "RawEntry":
        if self.kind == "line" and self.line is None:
            raise ValueError("kind=line needs a `line` field")
        return self
