"""Dead letters: ONE record and ONE reason vocabulary for every consumer (the worker, `export otlp`,
`export postgres`, and every later one).

Each consumer writes its dead letters to its OWN stream, the only one its least-privilege ACL user
may append to (deploy/redis/users.acl): the worker to `goose.deadletter[.<shard>]`
(`layout.deadletter_partition`), an exporter to `goose.deadletter.<exporter>[.<shard>]`
(`layout.export_deadletter_partition`). One reader (an operator, a replay command) reads any of
them with `DeadLetter.from_fields`.

Fields of a dead-letter entry (all plain string fields, docs/consumers.md):

    reason      one of DEAD_LETTER_REASONS (bounded: it is a metric label too)
    detail      why, for a human, at most MAX_DETAIL_CHARS characters
    source      the stream the entry was read from
    sourceId    its entry id there
    exporter    which exporter wrote it (absent: the worker)
    group       the consumer group it was read with (exporters)
    runId       the run it belongs to, when known
    raw.<name>  the refused entry's own fields, as they were (so it can be resent after a fix)
    otlp, contentType   the OTLP exporter: the refused spans as the request body it sent

Why the worker's reasons stay in contracts/raw.py (re-exported here): they name what happens to a
raw entry, beside the raw entry's other outcomes; the exporters' reasons are prefixed with the
exporter's name where the same word would mean a different check (`postgres-invalid-entry` checks
the columns' types, the OTLP exporter's `invalid-entry` only the envelope).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.consumers import (
    JSONL_INVALID_ENTRY,
    OTLP_REJECTED,
    POSTGRES_INVALID_ENTRY,
    POSTGRES_REJECTED,
    REASONS_BY_CONSUMER,
    WORKER_REASONS,
)
from contracts.raw import (
    AFTER_END,
    HOLD_LIMIT,
    INVALID_ENTRY,
    MAX_DELIVERIES,
    OUT_OF_WINDOW,
    OVERSIZE,
    PROCESSING_ERROR,
)

MAX_DETAIL_CHARS = 1000
RAW_PREFIX = b"raw."

# The exporters' reasons and which reasons each consumer may write: columns of the consumer
# registry (contracts/consumers.py), re-exported here beside the record they go in.
DEAD_LETTER_REASONS: tuple[str, ...] = tuple(dict.fromkeys(r for rs in REASONS_BY_CONSUMER.values() for r in rs))


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered entry, as every consumer writes it (see the module docstring)."""

    reason: str
    detail: str
    source: str
    source_id: str
    exporter: str | None = None
    group: str | None = None
    run: str | None = None
    raw: Mapping[bytes, Any] | Mapping[str, Any] = field(default_factory=dict)  # the entry's fields
    payload: bytes | None = None  # e.g. the OTLP request body of the refused spans
    content_type: str | None = None

    def to_fields(self) -> dict[bytes, Any]:
        """The field map to XADD (values str or bytes; redis-py encodes them)."""
        fields: dict[bytes, Any] = {b"reason": self.reason, b"detail": self.detail[:MAX_DETAIL_CHARS],
                                    b"source": self.source, b"sourceId": self.source_id}
        if self.exporter is not None:
            fields[b"exporter"] = self.exporter
        if self.group is not None:
            fields[b"group"] = self.group
        if self.run is not None:
            fields[b"runId"] = self.run
        if self.payload is not None:
            fields[b"otlp"] = self.payload
            fields[b"contentType"] = self.content_type or "application/x-protobuf"
        for name, value in self.raw.items():
            fields[RAW_PREFIX + (name if isinstance(name, bytes) else str(name).encode())] = value
        return fields

    def flat(self) -> tuple[Any, ...]:
        """`to_fields` as a flat (name, value, ...) tuple: the worker's commit script takes that."""
        return tuple(item for pair in self.to_fields().items() for item in pair)

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> DeadLetter:
        """Read a dead-letter entry back (bytes or str keys); absent fields read empty or None."""
        by_name = {(k if isinstance(k, bytes) else str(k).encode()): v for k, v in fields.items()}
        raw = {k[len(RAW_PREFIX):]: v for k, v in by_name.items() if k.startswith(RAW_PREFIX)}
        payload = by_name.get(b"otlp")
        return cls(
            reason=_text(by_name.get(b"reason")) or "",
            detail=_text(by_name.get(b"detail")) or "",
            source=_text(by_name.get(b"source")) or "",
            source_id=_text(by_name.get(b"sourceId")) or "",
            exporter=_text(by_name.get(b"exporter")),
            group=_text(by_name.get(b"group")),
            run=_text(by_name.get(b"runId")),
            raw=raw,
            payload=payload.encode() if isinstance(payload, str) else payload,
            content_type=_text(by_name.get(b"contentType")),
        )


__all__ = [
    "AFTER_END", "DEAD_LETTER_REASONS", "HOLD_LIMIT", "INVALID_ENTRY", "JSONL_INVALID_ENTRY", "MAX_DELIVERIES",
    "MAX_DETAIL_CHARS",
    "OTLP_REJECTED", "OUT_OF_WINDOW", "OVERSIZE", "POSTGRES_INVALID_ENTRY", "POSTGRES_REJECTED", "PROCESSING_ERROR",
    "REASONS_BY_CONSUMER", "DeadLetter", "WORKER_REASONS",
]  # fmt: skip
