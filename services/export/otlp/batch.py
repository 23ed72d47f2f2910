"""What one batch of topic entries brings to the OTLP exporter, per run: the entries decoded by the
topic codec (`decode_entry`), what a batch adds to a run (`RunWork`: records, ring events, tool
spans, the first entry's fields for a dead letter) and what the run's state says before the batch
is finished (`RunFlags`). Plain data, no broker: the glue between the topic entries and
services/export/otlp/mapping.py, split out of processor.py (issue 33 item 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from opentelemetry.sdk.trace import ReadableSpan

from contracts.topics import TopicEntry, TopicEntryError, as_text


@dataclass
class Decoded:
    entry_id: str
    run: str | None
    seq: int | None
    body: dict[str, Any] | None
    error: str | None = None


@dataclass
class RunWork:
    """What one batch brings for one run."""

    entry_ids: list[str] = field(default_factory=list)
    records: dict[int, bytes] = field(default_factory=dict)  # k -> record JSON
    events: dict[int, bytes | None] = field(default_factory=dict)  # seq -> its ring value; None: a tool span
    tool_spans: list[tuple[int, ReadableSpan]] = field(default_factory=list)
    min_ns: int | None = None
    max_ns: int | None = None
    exp: int | None = None
    span_events: int = 0
    unmappable: int = 0
    raw: dict[Any, Any] | None = None  # the fields of its first entry: a dead letter's raw.* (a resend after a fix)

    def note_entry(self, entry_id: str, fields: dict[Any, Any]) -> None:
        self.entry_ids.append(entry_id)
        if self.raw is None:
            self.raw = fields

    def saw(self, ns: int) -> None:
        self.min_ns = ns if self.min_ns is None else min(self.min_ns, ns)
        self.max_ns = ns if self.max_ns is None else max(self.max_ns, ns)


def decode_entry(entry_id: Any, fmap: dict[Any, Any]) -> Decoded:
    """A topic entry (event or run record), decoded by the one topic codec (contracts/topics.py):
    the envelope says whose it is, `data` is the JSON body; the body's runId and seq win over the
    envelope's when they are there (they are what the spans are built from)."""
    sid = as_text(entry_id) or str(entry_id)
    entry = TopicEntry.from_fields(fmap)
    run, seq = entry.run, entry.seq
    try:
        body = entry.document()
    except TopicEntryError as exc:
        return Decoded(sid, run or None, seq, None, str(exc).split(" (", 1)[0])
    body_run = body.get("runId")
    if isinstance(body_run, str) and body_run:
        run = body_run
    if isinstance(body.get("seq"), int) and not isinstance(body.get("seq"), bool):
        seq = body["seq"]
    return Decoded(sid, run or None, seq, body)


class RunFlags(NamedTuple):
    """What a run's export state says before a batch is finished (`TraceExporter._flags`)."""

    done: bool  # its root went out
    dead: bool  # it was dead-lettered
    complete: bool  # done, and not by timeout: every event its terminal record counts was seen
    sent: set[int]  # seqs of this batch's tool events already seen (their spans are out)
