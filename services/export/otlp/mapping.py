"""Pure mapping of harness events and run records to OpenTelemetry spans (no I/O).

One trace per run, following the OpenTelemetry GenAI semantic conventions v1.41.0 (the last
release of the GenAI conventions inside open-telemetry/semantic-conventions; the names used here
are unchanged in semantic-conventions-genai v0.1.0). docs/otel.md has the full table.

- root span ``invoke_agent {agent}``: the run, from its first record/event to its end record;
- child span ``execute_tool {tool}`` per tool event, start = event time − durationMs;
- agent, reasoning, error, warning, unknown (and unknown *types*) events: span events of the root.

Ids are derived from the run key and the event id (truncated SHA-256), so a replay or a re-export
after a crash produces the same trace and span ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from contracts.events import ERROR_CLASSES, TOOL_EVENT_TYPES
from contracts.formats import BY_NAME, DEFAULT_FORMAT

SEMCONV_VERSION = "1.41.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE_NAME = "goose-ingest.export.otlp"

# --- attribute names (GenAI semantic conventions v1.41.0 and general conventions) ------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_AGENT_VERSION = "gen_ai.agent.version"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
ERROR_TYPE = "error.type"
HOST_NAME = "host.name"
FILE_PATH = "file.path"
PROCESS_COMMAND_LINE = "process.command_line"
PROCESS_EXIT_CODE = "process.exit.code"
# goose-ingest's own attributes (no convention covers them)
GI = "goose_ingest."
GI_EVENT_ID = GI + "event.id"
GI_EVENT_TYPE = GI + "event.type"
GI_RUN_STATE = GI + "run.state"
GI_CLOSED_BY = GI + "root.closed_by"
GI_INCOMPLETE = GI + "root.incomplete"
GI_TOTAL_TOKENS = GI + "usage.total_tokens"
GI_COST_USD = GI + "usage.cost_usd"
GI_PARENT_RUN = GI + "parent_run.id"
GI_CONTINUES_RUN = GI + "continues_run.id"
GI_LINK_TYPE = GI + "link.type"
GI_MISSING = GI + "missing_ranges"
GI_EVENT_COUNT = GI + "event_count."
GI_START_LINE = GI + "line.start"
GI_END_LINE = GI + "line.end"
GI_SEARCH_QUERY = GI + "search.query"
GI_SKILL_NAME = GI + "skill.name"
GI_MESSAGE = GI + "message"
GI_CODE = GI + "code"
GI_TRUNCATED = GI + "truncated"
GI_RAW = GI + "raw"
GI_REASON = GI + "reason"

OP_INVOKE_AGENT = "invoke_agent"
OP_EXECUTE_TOOL = "execute_tool"
TOOL_TYPE = "extension"  # goose's tools are MCP extensions (built-in "developer" included)
DEFAULT_AGENT_NAME = BY_NAME[DEFAULT_FORMAT].product

# error.type values (low cardinality, documented in docs/otel.md); an error event's and a failed
# run's error.type is its errorClass (contracts/events.py ErrorClass), "agent_exit" for a run whose
# only error is its non-zero exit
ERR_TOOL = "tool_error"
ERR_EXIT = "agent_exit"
ERR_ABANDONED = "abandoned"
ERR_TIMEOUT = "root_timeout"
_ERROR_CLASSES = frozenset(ERROR_CLASSES)

# span-event names on the root
EVENT_NAMES: Mapping[str, str] = {
    "agent": GI + "agent",
    "reasoning": GI + "reasoning",
    "error": GI + "error",
    "warning": GI + "warning",
    "unknown": GI + "unknown",
}
UNKNOWN_TYPE_EVENT = GI + "unknown_type"
UNMAPPABLE_EVENT = GI + "unmappable"

# When the environment sets no attribute length limit the SDK's is unlimited; traces of agent
# runs carry whole messages and commands, and backends reject huge attributes, so cap them.
DEFAULT_ATTRIBUTE_LENGTH = 16_384

_TOOL_TYPES = frozenset(TOOL_EVENT_TYPES)
_USAGE_ATTRS: tuple[tuple[str, str], ...] = (
    ("inputTokens", GEN_AI_USAGE_INPUT_TOKENS),
    ("outputTokens", GEN_AI_USAGE_OUTPUT_TOKENS),
    ("cacheReadInputTokens", GEN_AI_USAGE_CACHE_READ),
    ("cacheWriteInputTokens", GEN_AI_USAGE_CACHE_CREATION),
    ("totalTokens", GI_TOTAL_TOKENS),
    ("costUsd", GI_COST_USD),
)
TERMINAL_STATES = frozenset({"ended", "abandoned"})


# ------------------------------------------------------------------ ids
def _digest(kind: str, key: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(f"goose-ingest/{kind}/{key}".encode()).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid in OTLP


def trace_id_of(run: str) -> int:
    return _digest("trace", run, 16)


def root_span_id_of(run: str) -> int:
    return _digest("root", run, 8)


def span_id_of(event_id: str) -> int:
    return _digest("span", event_id, 8)


def root_context(run: str) -> SpanContext:
    return SpanContext(trace_id_of(run), root_span_id_of(run), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


# ------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class MappingConfig:
    """What shapes the spans besides the data: content capture, SDK limits, resource."""

    capture_content: bool = False
    limits: SpanLimits = field(default_factory=lambda: SpanLimits(max_attribute_length=DEFAULT_ATTRIBUTE_LENGTH))
    resource: Resource = field(default_factory=lambda: Resource.create({"service.name": "goose-ingest"}))
    scope: InstrumentationScope = field(
        default_factory=lambda: InstrumentationScope(SCOPE_NAME, None, SCHEMA_URL)
    )


@dataclass
class Tally:
    """What the mapping had to cut to stay within the SDK's limits (for metrics)."""

    truncated_attributes: int = 0
    dropped_attributes: int = 0
    dropped_events: int = 0

    def add(self, other: Tally) -> None:
        self.truncated_attributes += other.truncated_attributes
        self.dropped_attributes += other.dropped_attributes
        self.dropped_events += other.dropped_events


_PLAIN_TYPES = (str, bool, int, float)


def _bounded(
    attrs: Mapping[str, Any], max_count: int | None, max_len: int | None, tally: Tally
) -> Mapping[str, Any]:
    """The attributes within the SDK's limits (count, value length), truncations counted.

    The common case (plain values within the limits) is returned as it is: the SDK's
    BoundedAttributes would only copy it, at about a third of the mapping's cost.
    """
    if (max_count is None or len(attrs) <= max_count) and all(
        type(v) in _PLAIN_TYPES and (max_len is None or type(v) is not str or len(v) <= max_len) for v in attrs.values()
    ):
        return attrs
    if max_len is not None:
        for value in attrs.values():
            if isinstance(value, str) and len(value) > max_len:
                tally.truncated_attributes += 1
            elif isinstance(value, (list, tuple)) and any(isinstance(v, str) and len(v) > max_len for v in value):
                tally.truncated_attributes += 1
    bounded = BoundedAttributes(maxlen=max_count, attributes=attrs, immutable=True, max_value_len=max_len)
    tally.dropped_attributes += bounded.dropped
    return bounded


# ------------------------------------------------------------------ time
def ns_of(timestamp: str) -> int:
    """RFC 3339 (`...Z`, milliseconds) to Unix nanoseconds; ValueError when it is not one."""
    dt = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp without zone: {timestamp!r}")
    return int(round(dt.timestamp() * 1000)) * 1_000_000


# ------------------------------------------------------------------ events
def is_tool_span(event: Mapping[str, Any]) -> bool:
    """Tool events, and unknown events built from an answered tool call, become child spans."""
    etype = event.get("type")
    if etype in _TOOL_TYPES:
        return True
    return etype == "unknown" and isinstance(event.get("tool"), str) and isinstance(event.get("durationMs"), int)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _messages(role: str, part_type: str, text: str) -> str:
    # The conventions' structured message format (gen_ai.output.messages), one message.
    return _json([{"role": role, "parts": [{"type": part_type, "content": text}]}])


def tool_span(event: Mapping[str, Any], cfg: MappingConfig, tally: Tally) -> ReadableSpan:
    """The `execute_tool` child span of one tool event (KeyError/ValueError on a malformed one)."""
    run = event["runId"]
    event_id = event["eventId"]
    tool = event.get("tool") or event["type"]
    end = ns_of(event["timestamp"])
    duration = event.get("durationMs")
    start = end - max(int(duration), 0) * 1_000_000 if isinstance(duration, int) else end
    attrs: dict[str, Any] = {
        GEN_AI_OPERATION_NAME: OP_EXECUTE_TOOL,
        GEN_AI_TOOL_NAME: tool,
        GEN_AI_TOOL_TYPE: TOOL_TYPE,
        GEN_AI_CONVERSATION_ID: run,
        GI_EVENT_ID: event_id,
        GI_EVENT_TYPE: event["type"],
    }
    if isinstance(event.get("toolCallId"), str):
        attrs[GEN_AI_TOOL_CALL_ID] = event["toolCallId"]
    etype = event["type"]
    if etype == "command":
        attrs[PROCESS_COMMAND_LINE] = event["command"]
        if isinstance(event.get("exitCode"), int):
            attrs[PROCESS_EXIT_CODE] = event["exitCode"]
    if isinstance(event.get("path"), str):
        attrs[FILE_PATH] = event["path"]
    if isinstance(event.get("startLine"), int):
        attrs[GI_START_LINE] = event["startLine"]
    if isinstance(event.get("endLine"), int):
        attrs[GI_END_LINE] = event["endLine"]
    if etype == "search":
        attrs[GI_SEARCH_QUERY] = event["query"]
    if isinstance(event.get("skillName"), str):
        attrs[GI_SKILL_NAME] = event["skillName"]
    if etype == "unknown" and cfg.capture_content and "raw" in event:
        attrs[GI_RAW] = _json(event["raw"])
    status = Status(StatusCode.UNSET)
    if event.get("isSuccess") is False:
        attrs[ERROR_TYPE] = ERR_TOOL
        status = Status(StatusCode.ERROR, f"{tool} failed")
    elif event.get("isSuccess") is True:
        status = Status(StatusCode.OK)
    limits = cfg.limits
    return ReadableSpan(
        name=f"{OP_EXECUTE_TOOL} {tool}",
        context=SpanContext(trace_id_of(run), span_id_of(event_id), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
        parent=root_context(run),
        resource=cfg.resource,
        attributes=_bounded(attrs, limits.max_span_attributes, limits.max_span_attribute_length, tally),
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=cfg.scope,
    )


def _failure_class(events: Sequence[StoredEvent]) -> str:
    """A failed run's error.type: the class of its last error before the exit (the cause: a rate
    limit, an expired key...), else agent_exit (the exit is all that is known)."""
    cause = ERR_EXIT
    for ev in sorted(events, key=lambda e: e.seq):
        cls = ev.attributes.get(ERROR_TYPE)
        if ev.name == EVENT_NAMES["error"] and isinstance(cls, str) and cls != ERR_EXIT:
            cause = cls
    return cause


@dataclass(frozen=True)
class StoredEvent:
    """A span event of the root, kept in the broker until the root is exported."""

    seq: int
    name: str
    time_ns: int
    attributes: dict[str, Any]

    def dumps(self) -> bytes:
        return orjson.dumps({"q": self.seq, "n": self.name, "t": self.time_ns, "a": self.attributes})

    @classmethod
    def loads(cls, raw: bytes | str) -> StoredEvent:
        d = orjson.loads(raw)
        return cls(int(d["q"]), str(d["n"]), int(d["t"]), dict(d["a"]))


def span_event(event: Mapping[str, Any], cfg: MappingConfig) -> StoredEvent:
    """The root's span event for a non-tool event; never raises on a well-formed envelope."""
    etype = event.get("type")
    attrs: dict[str, Any] = {GI_EVENT_ID: event["eventId"], GI_EVENT_TYPE: str(etype)}
    name = EVENT_NAMES.get(etype) if isinstance(etype, str) else None
    if name is None:
        name = UNKNOWN_TYPE_EVENT
    message = event.get("message")
    if etype in ("agent", "reasoning"):
        if cfg.capture_content and isinstance(message, str):
            attrs[GEN_AI_OUTPUT_MESSAGES] = _messages("assistant", "text" if etype == "agent" else "reasoning", message)
        if event.get("truncated") is True:
            attrs[GI_TRUNCATED] = True
    elif etype in ("error", "warning"):
        # Diagnostics of goose and the harness, already redacted: not conversation content.
        if isinstance(message, str):
            attrs[GI_MESSAGE] = message
        if isinstance(event.get("code"), str):
            attrs[GI_CODE] = event["code"]
        error_class = event.get("errorClass")
        if error_class in _ERROR_CLASSES:
            attrs[ERROR_TYPE] = error_class
    elif etype == "unknown":
        for key, attr in (("tool", GEN_AI_TOOL_NAME), ("toolCallId", GEN_AI_TOOL_CALL_ID)):
            if isinstance(event.get(key), str):
                attrs[attr] = event[key]
        if cfg.capture_content and "raw" in event:
            attrs[GI_RAW] = _json(event["raw"])
    elif cfg.capture_content:
        # A type from a newer contract: keep it whole, it may be content.
        attrs[GI_RAW] = _json(dict(event))
    return StoredEvent(int(event["seq"]), name, ns_of(event["timestamp"]), attrs)


def bounded_event(event: StoredEvent, cfg: MappingConfig, tally: Tally) -> StoredEvent:
    """The event within the SDK's per-event limits, as the root would carry it: what is stored
    until the root is out is no larger than what is sent."""
    limits = cfg.limits
    attrs = _bounded(event.attributes, limits.max_event_attributes, limits.max_attribute_length, tally)
    return event if attrs is event.attributes else StoredEvent(event.seq, event.name, event.time_ns, dict(attrs))


def unmappable_event(seq: int, time_ns: int, reason: str) -> StoredEvent:
    """A root span event for an entry of this run whose event could not be read."""
    return StoredEvent(seq, UNMAPPABLE_EVENT, time_ns, {GI_REASON: reason})


# ------------------------------------------------------------------ the root
@dataclass
class RootFacts:
    """What the run records say about a run, folded in record order (pure, re-deliverable)."""

    run: str
    start_ns: int | None = None
    end_ns: int | None = None
    state: str | None = None  # the terminal record's state
    last_k: int = -1
    exit_code: int | None = None
    host: str | None = None
    agent: str | None = None
    format: str | None = None  # the run's input format (record label `format`)
    parent: str | None = None
    continues: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    missing: list[Any] | None = None

    @property
    def expected_events(self) -> int | None:
        """How many events the run has, once its terminal record is known."""
        return sum(v for v in self.counts.values() if isinstance(v, int)) if self.state in TERMINAL_STATES else None


def record_index(record: Mapping[str, Any]) -> int:
    """k of a record id `<run>:run:<k>`."""
    return int(str(record["recordId"]).rsplit(":", 1)[1])


def fold_records(run: str, records: Iterable[Mapping[str, Any]]) -> RootFacts:
    facts = RootFacts(run)
    for rec in sorted(records, key=record_index):
        k = record_index(rec)
        ts = ns_of(rec["timestamp"])
        facts.start_ns = ts if facts.start_ns is None else min(facts.start_ns, ts)
        facts.last_k = max(facts.last_k, k)
        for key in ("host", "agent", "format"):
            if isinstance(rec.get(key), str):
                setattr(facts, key, rec[key])
        if isinstance(rec.get("parentRunId"), str):
            facts.parent = rec["parentRunId"]
        if isinstance(rec.get("continuesRunId"), str):
            facts.continues = rec["continuesRunId"]
        usage = {key: rec[key] for key, _ in _USAGE_ATTRS if isinstance(rec.get(key), (int, float))}
        if usage:
            facts.usage = usage  # a later record supersedes an earlier one
        if isinstance(rec.get("counts"), dict):
            facts.counts = dict(rec["counts"])
        state = rec.get("state")
        if state in TERMINAL_STATES:
            facts.state = str(state)
            facts.end_ns = ts
            if isinstance(rec.get("exitCode"), int):
                facts.exit_code = rec["exitCode"]
            if rec.get("missing"):
                facts.missing = list(rec["missing"])
    return facts


def agent_name(label: str | None, fmt: str | None = None) -> tuple[str, str | None]:
    """`goose/1.56.0` -> ("goose", "1.56.0"); no label -> the product of the run's format
    (contracts/formats.py: `gemini` for a gemini-cli run), else goose."""
    spec = BY_NAME.get(fmt) if fmt else None
    default = spec.product if spec is not None else DEFAULT_AGENT_NAME
    if not label:
        return default, None
    name, sep, version = label.partition("/")
    return (name or default), (version if sep and version else None)


def provider_name(fmt: str | None) -> str | None:
    """`gen_ai.provider.name` of a run: its format's provider when the CLI talks to one only
    (contracts/formats.py: Claude Code anthropic, Codex openai, Gemini CLI gcp.gemini), else none."""
    spec = BY_NAME.get(fmt) if fmt else None
    return spec.provider if spec is not None and spec.provider else None


def root_span(
    facts: RootFacts,
    events: Sequence[StoredEvent],
    cfg: MappingConfig,
    tally: Tally,
    *,
    first_ns: int | None = None,
    last_ns: int | None = None,
    closed_by_timeout: bool = False,
) -> ReadableSpan:
    """The run's `invoke_agent` span with its span events.

    `first_ns`/`last_ns` are the earliest/latest event times seen (used when records are missing);
    `closed_by_timeout` marks a root whose run never ended (or whose events never all arrived).
    """
    run = facts.run
    name, version = agent_name(facts.agent, facts.format)
    candidates = [t for t in (facts.start_ns, first_ns) if t is not None]
    start = min(candidates) if candidates else (last_ns or 0)
    if facts.end_ns is not None and not closed_by_timeout:
        end = facts.end_ns
    else:
        end = max(t for t in (facts.end_ns, last_ns, start) if t is not None)
    end = max(end, start)
    attrs: dict[str, Any] = {
        GEN_AI_OPERATION_NAME: OP_INVOKE_AGENT,
        GEN_AI_AGENT_NAME: name,
        GEN_AI_CONVERSATION_ID: run,
    }
    if version:
        attrs[GEN_AI_AGENT_VERSION] = version
    provider = provider_name(facts.format)
    if provider:
        attrs[GEN_AI_PROVIDER_NAME] = provider
    if facts.host:
        attrs[HOST_NAME] = facts.host
    for key, attr in _USAGE_ATTRS:
        if key in facts.usage:
            attrs[attr] = facts.usage[key]
    for etype, n in sorted(facts.counts.items()):
        if isinstance(n, int):
            attrs[GI_EVENT_COUNT + etype] = n
    if facts.missing:
        attrs[GI_MISSING] = _json(facts.missing)
    if facts.parent:
        attrs[GI_PARENT_RUN] = facts.parent
    if facts.continues:
        attrs[GI_CONTINUES_RUN] = facts.continues
    status = Status(StatusCode.UNSET)
    if closed_by_timeout:
        attrs[GI_CLOSED_BY] = "timeout"
        if facts.state is not None:
            attrs[GI_INCOMPLETE] = True  # ended, but not every event arrived before the timeout
    if facts.state is not None:
        attrs[GI_RUN_STATE] = facts.state
    if facts.exit_code is not None:
        attrs[PROCESS_EXIT_CODE] = facts.exit_code
    if facts.state == "ended" and facts.exit_code not in (None, 0):
        attrs[ERROR_TYPE] = _failure_class(events)
        status = Status(StatusCode.ERROR, f"goose exited with code {facts.exit_code}")
    elif facts.state == "abandoned":
        attrs[ERROR_TYPE] = ERR_ABANDONED
        status = Status(StatusCode.ERROR, "run abandoned (no input for the idle timeout)")
    elif facts.state is None and closed_by_timeout:
        attrs[ERROR_TYPE] = ERR_TIMEOUT
        status = Status(StatusCode.ERROR, "run never ended; root closed by the exporter's timeout")
    elif facts.state == "ended":
        status = Status(StatusCode.OK)
    limits = cfg.limits
    span_events: BoundedList[Event] = BoundedList(limits.max_events)
    for ev in sorted(events, key=lambda e: e.seq):
        span_events.append(
            Event(
                ev.name,
                _bounded(ev.attributes, limits.max_event_attributes, limits.max_attribute_length, tally),
                ev.time_ns,
            )
        )
    tally.dropped_events += span_events.dropped
    links: list[Link] = []
    for other, kind in ((facts.parent, "parent_run"), (facts.continues, "continues")):
        if other:
            links.append(Link(root_context(other), BoundedAttributes(attributes={GI_LINK_TYPE: kind, GEN_AI_CONVERSATION_ID: other})))
    return ReadableSpan(
        name=f"{OP_INVOKE_AGENT} {name}",
        context=root_context(run),
        parent=None,
        resource=cfg.resource,
        attributes=_bounded(attrs, limits.max_span_attributes, limits.max_span_attribute_length, tally),
        events=span_events,
        links=links,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=cfg.scope,
    )
