"""Topic entries: how a harness event or a run lifecycle record sits on its topic stream
(`harness.events*`, `harness.runs*`; contract section 4, docs/asyncapi). ONE encoder and ONE decoder
for every writer and reader (the worker's commit, both exporters, `tail`, bench, test helpers), as
`contracts.raw.RawEntry` / `services.sequencer.Entry.to_fields` are for raw entries.

An entry is a flat field map: a few plain envelope fields that say whose it is (so a reader can route
or filter without parsing JSON), and `data`, the whole event or record as compact JSON, which is the
payload every reader stores or maps:

    event:  eventId, runId, seq, type,  data
    record: recordId, runId, seq, state, data

Why the decoder does not validate the payload: what a malformed entry means differs by reader (the
OTLP exporter turns an unparsable event into an "unmappable" span event of its run, the PostgreSQL
sink dead-letters it, `tail` skips it). So `TopicEntry.from_fields` never raises: an envelope field
that is absent or undecodable reads `None`, `data` stays the bytes as published, and `document()` is
the one place that parses it (raising `TopicEntryError` with the reason every reader reports).
The encoder (`event_fields`/`record_fields`, and `TopicEntry.to_fields`) is the worker's hot path:
it builds the field tuple commit.lua appends, with no intermediate objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

# Kinds of topic entry: which topic it is on (and so which id and label field it has).
EVENT: Final = "event"
RECORD: Final = "record"
TopicKind = Literal["event", "record"]
TOPIC_KINDS: tuple[str, ...] = (EVENT, RECORD)

# Field names, as bytes (what redis-py returns) and in the order the worker writes them.
EVENT_ID, RECORD_ID, RUN_ID, SEQ, TYPE, STATE, DATA = b"eventId", b"recordId", b"runId", b"seq", b"type", b"state", b"data"
EVENT_FIELDS: tuple[bytes, ...] = (EVENT_ID, RUN_ID, SEQ, TYPE, DATA)
RECORD_FIELDS: tuple[bytes, ...] = (RECORD_ID, RUN_ID, SEQ, STATE, DATA)
MAX_SEQ = 2**53  # as for raw entries: a JSON-safe integer


class TopicEntryError(ValueError):
    """A topic entry's payload cannot be read; the message is the reason a reader reports."""


def event_fields(event: Mapping[str, Any]) -> tuple[bytes | str, ...]:
    """The flat field tuple (name, value, ...) of a harness event's topic entry (commit.lua's
    argument format). `event` is the event as the normalizer built it (contracts/events.py)."""
    return (EVENT_ID, event["eventId"], RUN_ID, event["runId"], SEQ, str(event["seq"]),
            TYPE, event["type"], DATA, orjson.dumps(event))


def record_fields(record: Mapping[str, Any]) -> tuple[bytes | str, ...]:
    """The flat field tuple of a run lifecycle record's topic entry (contracts/runs.py)."""
    return (RECORD_ID, record["recordId"], RUN_ID, record["runId"], SEQ, str(record["seq"]),
            STATE, record["state"], DATA, orjson.dumps(record))


def as_text(value: Any) -> str | None:
    """A field value as text: str as is, UTF-8 bytes decoded, anything else (or bad UTF-8) None."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _get(fields: Mapping[Any, Any], name: bytes) -> Any:
    # redis-py gives bytes keys; a client with decode_responses (or a hand-built map) gives str
    value = fields.get(name)
    return fields.get(name.decode()) if value is None else value


def _seq(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 16:
        return None
    value = int(text)
    return value if value <= MAX_SEQ else None


@dataclass(frozen=True, slots=True)
class TopicEntry:
    """One topic entry, decoded. Envelope fields read `None` when absent or not decodable (not
    UTF-8; `seq` not a non-negative integer); `data` is the payload as published, or None."""

    kind: TopicKind
    id: str | None  # eventId (events) or recordId (records)
    run: str | None  # runId
    seq: int | None
    label: str | None  # the event's type (events) or the record's state (records)
    data: bytes | None

    @classmethod
    def of_event(cls, event: Mapping[str, Any]) -> TopicEntry:
        return cls(EVENT, event["eventId"], event["runId"], event["seq"], event["type"], orjson.dumps(event))

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> TopicEntry:
        return cls(RECORD, record["recordId"], record["runId"], record["seq"], record["state"], orjson.dumps(record))

    @property
    def complete(self) -> bool:
        """Every envelope field is there: what the worker writes, and what `to_fields` needs."""
        return None not in (self.id, self.run, self.seq, self.label, self.data)

    def to_fields(self) -> dict[bytes, bytes]:
        """The entry's field map (for XADD); raises TopicEntryError when it is not `complete`."""
        if not self.complete:
            raise TopicEntryError(f"incomplete {self.kind} entry: every envelope field is required to write one")
        names = EVENT_FIELDS if self.kind == EVENT else RECORD_FIELDS
        values = (str(self.id).encode(), str(self.run).encode(), str(self.seq).encode(), str(self.label).encode(),
                  self.data)
        return dict(zip(names, values, strict=True))  # type: ignore[arg-type]

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any], kind: TopicKind | None = None) -> TopicEntry:
        """Decode a stream entry's field map (bytes or str keys). `kind`: the topic it was read
        from; None: a record when it has a `recordId`, else an event. Never raises."""
        if kind is None:
            kind = RECORD if _get(fields, RECORD_ID) is not None else EVENT
        id_name, label_name = (EVENT_ID, TYPE) if kind == EVENT else (RECORD_ID, STATE)
        data = _get(fields, DATA)
        if isinstance(data, str):
            data = data.encode()
        return cls(kind, as_text(_get(fields, id_name)), as_text(_get(fields, RUN_ID)), _seq(as_text(_get(fields, SEQ))),
                   as_text(_get(fields, label_name)), data if isinstance(data, bytes) else None)

    def document(self) -> dict[str, Any]:
        """`data` parsed: the event or record as a JSON object, or TopicEntryError saying why not."""
        if self.data is None:
            raise TopicEntryError("missing field data")
        try:
            doc = orjson.loads(self.data)
        except orjson.JSONDecodeError as exc:
            raise TopicEntryError(f"data is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise TopicEntryError("data is not a JSON object")
        return doc


__all__ = [
    "DATA", "EVENT", "EVENT_FIELDS", "EVENT_ID", "RECORD", "RECORD_FIELDS", "RECORD_ID", "RUN_ID", "SEQ", "STATE",
    "TOPIC_KINDS", "TYPE", "TopicEntry", "TopicEntryError", "TopicKind", "event_fields", "record_fields",
]  # fmt: skip
