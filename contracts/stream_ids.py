"""Redis stream entry ids (`<ms>-<seq>`) as one type: parsed in one place, ordered like the ids.

Every module that orders, compares or dates stream ids (the replay's merge, housekeeping's trim
bounds, the damage check, the PostgreSQL sink's positions, `tail`'s order, `runs`, the archive's
segment names, the JSON-lines sink's day) reads them with `StreamId.parse`, so what counts as an id
is decided once (tests/core/test_architecture.py holds the tree to it).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class StreamId(NamedTuple):
    """An entry id as two integers; a tuple, so ids compare and sort as Redis orders them."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, value: Any) -> StreamId:
        """`<ms>-<seq>` or `<ms>` (str or bytes); ValueError if it is not an id."""
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        ms, sep, seq = text.partition("-")
        if not ms.isdigit() or (sep and not seq.isdigit()):
            raise ValueError(f"not a stream id: {text[:60]!r}")
        return cls(int(ms), int(seq or 0))

    @classmethod
    def ms_of(cls, value: Any) -> int | None:
        """The id's milliseconds, or None when `value` is not an id (absent, a placeholder)."""
        try:
            return cls.parse(value or "").ms
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"
