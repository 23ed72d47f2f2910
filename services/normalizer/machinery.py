"""One run's normaliser machinery: the parts of the contract every input format shares.

Input: one call per raw entry (``line`` or ``end``) with its seq and ts (Unix ms), or many at
once (``lines``). Output: harness events as plain dicts, keys in contract order, ready for orjson.

What is shared (written once, here): line handling (contract 3.1), the envelope and
``sessionId``, span accumulation and flushing (3.3, ``join_fragment`` and ``extend_span``), pending
tool calls (recording, pairing oldest first, eviction, draining), tool events with their extras,
caps and ``truncated``, usage and error bookkeeping, and the serialisable state. What differs per
format is one ``FormatRules`` record per module of ``services/normalizer/formats/``: how a parsed
JSON object is mapped.

This module knows no format: the format modules import it (and only it, ``tools``, ``shell``,
``paths``, ``timefmt`` and the class names of ``error_classes``), and ``run_normalizer`` puts the
two together (the format decision, F1-F4, and the registry of ``FormatRules``) in
``RunNormalizer``, a subclass of ``Machinery``. So the imports go
one way: machinery <- formats <- run_normalizer, with no circle.

Everything kept is plain data so ``to_bytes``/``from_bytes`` round-trip exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeGuard

import orjson

from contracts.events import EVENT_TYPES
from contracts.formats import BY_NAME, DEFAULT_FORMAT
from contracts.raw import DEFAULT_MAX_PENDING_TOOL_BYTES, PENDING_TOOL_CAPS
from services.normalizer.error_classes import CANCELLED, event_class
from services.normalizer.timefmt import format_ms

STATE_VERSION = 1

# Deepest JSON nesting a line may have to be mapped: an event wraps a record one or two levels
# deeper, and orjson cannot serialise beyond 254 levels (nor should the redactor recurse that far).
MAX_JSON_DEPTH = 200
# Errors remembered for the "not reported twice" rules (C-F4, X-E3) between two turn ends: a
# bound on state, far above what one turn reports.
MAX_RECENT_ERRORS = 64

# The exit error's product of a run whose format was never decided and that has no agent label.
DEFAULT_PRODUCT = BY_NAME[DEFAULT_FORMAT].product

JSON_ERRORS = (orjson.JSONDecodeError, ValueError)
_loads = orjson.loads
_NOT_JSON = object()

# A pending span is the list [kind, message id, text, first seq, last seq, truncated] (plain, as it is
# serialized); SPAN_* name its fields. `Final`: the compiled core inlines them as constants.
SPAN_KIND: Final = 0
SPAN_ID: Final = 1
SPAN_TEXT: Final = 2
SPAN_FIRST: Final = 3
SPAN_LAST: Final = 4
SPAN_TRUNCATED: Final = 5
# A pending tool call is [call id, tool name, input, raw block, seq, ts, key, size, where]:
# the format modules build and read the first six (``add_call``, ``take_call``); the last three are
# this module's bookkeeping: the call's key (``k``, its hash field ``c:<k>`` where the worker stores
# the block apart), the bytes it counts against MAX_PENDING_TOOL_BYTES, and where its input lies in
# its block (so the input, a part of the block, is stored once).
CALL_ID: Final = 0
CALL_NAME: Final = 1
CALL_INPUT: Final = 2
CALL_RAW: Final = 3
CALL_SEQ: Final = 4
CALL_TS: Final = 5
CALL_KEY: Final = 6
CALL_SIZE: Final = 7
CALL_WHERE: Final = 8
CALL_FIELDS: Final = 6  # what a format module sees of a call
# Bytes counted per pending call besides its block's JSON (its id, name, seq, ts, key in the state):
# a flood of tiny calls is bounded by the count cap, this keeps the byte count honest for them.
PENDING_CALL_OVERHEAD = 64
# How deep in a block the input is looked for (goose: toolCall.value.arguments).
INPUT_SEARCH_DEPTH = 4
# `where` of a call whose input is not a part of its block (no format does that): the block is
# stored as [block, input].
INPUT_BESIDE = True
# `code` of the end error of a run the tap stopped with a signal (class `cancelled`).
SIGNALLED: Final = "signalled"
# Which cap surfaced a call early (the `cap` label of goose_ingest_pending_tool_evictions).
EVICT_COUNT, EVICT_BYTES = PENDING_TOOL_CAPS


class Limits(NamedTuple):
    max_span_chars: int = 262_144
    max_pending_tools: int = 256
    max_pending_tool_bytes: int = DEFAULT_MAX_PENDING_TOOL_BYTES


DEFAULT_LIMITS = Limits()


class RawLine(NamedTuple):
    """One raw `line` entry, for the batch API ``RunNormalizer.lines``."""

    seq: int
    ts: int
    line: str
    stream: str = "stdout"


Event = dict[str, Any]
Record = dict[str, Any]


class FormatRules(NamedTuple):
    """What one input format adds to the shared machinery (built by ``format_rules``)."""

    name: str
    # The CLI's name in "<product> exited with code N" (contracts/formats.py).
    product: str
    # Maps one parsed JSON object of a stdout line (session id, dispatch, events).
    record: Callable[[Machinery, list[Event], int, int, Record], None]
    # True when a tool of this name is consumed (no event, even when unanswered or evicted).
    consumed: Callable[[str], bool]
    # Maps many entries of a run whose format is decided (same events as one `line` call each).
    batch: Callable[[Machinery, list[Event], Iterator[tuple[int, int, str, str]]], None]
    # At the run's end, after the flush and drain, before the exit error: the format's own end rules
    # (seq, ts, exit code or None). True: the format has reported the exit itself (no exit error).
    finish: Callable[[Machinery, list[Event], int, int, int | None], bool] | None = None


def format_rules(
    name: str,
    record: Callable[[Machinery, list[Event], int, int, Record], None],
    consumed: Callable[[str], bool],
    batch: Callable[[Machinery, list[Event], Iterator[tuple[int, int, str, str]]], None] | None = None,
    finish: Callable[[Machinery, list[Event], int, int, int | None], bool] | None = None,
) -> FormatRules:
    """A format module's ``RULES``: its functions, with its name and product from its row of
    contracts/formats.py (a KeyError at import for a module whose format has no row)."""
    spec = BY_NAME[name]
    return FormatRules(spec.name, spec.product, record, consumed, generic_batch if batch is None else batch, finish)


def generic_batch(norm: Machinery, out: list[Event], entries: Iterator[tuple[int, int, str, str]]) -> None:
    """The batch loop of a format without a faster one: JSON objects go straight to its mapping,
    everything else (stderr, non-JSON, non-objects) the reference way."""
    loads = _loads
    rules = norm._rules
    assert rules is not None
    record = rules.record
    line = norm._line
    for seq, ts_ms, text, stream in entries:
        if stream == "stdout":
            try:
                parsed = loads(text)
            except JSON_ERRORS:
                line(out, seq, ts_ms, text, stream)
                continue
            norm._text = text
            if type(parsed) is dict:
                record(norm, out, seq, ts_ms, parsed)
            else:
                norm.parsed(out, seq, ts_ms, parsed)
        else:
            line(out, seq, ts_ms, text, stream)


def is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int


def is_number(value: Any) -> TypeGuard[int | float]:
    return type(value) is int or type(value) is float


def fits_int64(value: int) -> bool:
    return -(2**63) <= value < 2**63


def nonempty_str(value: Any) -> TypeGuard[str]:
    return type(value) is str and value != ""


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: never recurses)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            if depth > deepest:
                deepest = depth
            stack.extend((child, depth + 1) for child in node.values())
        elif type(node) is list:
            if depth > deepest:
                deepest = depth
            stack.extend((child, depth + 1) for child in node)
    return deepest


def locate_input(block: Any, value: Any, equal: bool = False) -> Any:
    """Where ``value`` (a call's input, taken from ``block``) lies in ``block``: the list of object
    keys leading to it (found by identity, or with ``equal`` by equal value and type, breadth first,
    at most INPUT_SEARCH_DEPTH deep), None for no input, INPUT_BESIDE when it is not a part of the
    block."""
    if value is None:
        return None
    if value is block or (equal and type(block) is type(value) and block == value):
        return []
    level: list[tuple[dict[str, Any], list[str]]] = [(block, [])] if type(block) is dict else []
    for _ in range(INPUT_SEARCH_DEPTH):
        deeper: list[tuple[dict[str, Any], list[str]]] = []
        for node, path in level:
            for key, child in node.items():
                if child is value or (equal and type(child) is type(value) and child == value):
                    return [*path, key]
                if type(child) is dict:
                    deeper.append((child, [*path, key]))
        level = deeper
    return INPUT_BESIDE


def input_at(stored: Any, where: Any) -> tuple[Any, Any]:
    """(block, input) of a call stored as ``stored`` with its input at ``where`` (``locate_input``)."""
    if where is None:
        return stored, None
    if where is INPUT_BESIDE:
        return stored[0], stored[1]
    node = stored
    for key in where:
        node = node[key]
    return stored, node


def join_fragment(pending: str, text: str) -> str:
    """Contract 3.3, written once: a fragment of the pending span restates it (starts with its
    text, and replaces it) or extends it (appended)."""
    return text if text.startswith(pending) else pending + text


class Machinery:
    """One run's shared machinery; ``run_normalizer.RunNormalizer`` adds the format decision."""

    __slots__ = (
        "run",
        "limits",
        "next_event",
        "counts",
        "span",
        "pending",
        "usage",
        "format",
        "session",
        "errors",
        "local",
        "_rules",
        "_ts_ms",
        "_ts_text",
        "_text",
        "_counted_text",
        "_bracket_heavy",
        "pending_bytes",
        "calls_made",
        "evictions",
        "_calls_added",
        "_calls_removed",
    )

    def __init__(self, run: str, limits: Limits = DEFAULT_LIMITS) -> None:
        self.run = run
        self.limits = limits
        self.next_event = 0  # index of the next event
        self.counts: dict[str, int] = {}
        self.span: list[Any] | None = None  # [kind, message id, text, first seq, last seq, truncated]
        self.pending: list[list[Any]] = []  # unanswered tool calls, oldest first; see CALL_*
        self.pending_bytes = 0  # their CALL_SIZEs
        self.calls_made = 0  # the key of the next call kept
        # Pending calls surfaced early, by cap (EVICT_*): counted by the shell, not part of the state.
        self.evictions: dict[str, int] = {}
        # Calls kept / given up since the last `take_call_changes` (for storage apart from the state).
        self._calls_added: dict[int, bytes] = {}
        self._calls_removed: set[int] = set()
        self.usage: dict[str, Any] | None = None  # a new object at each completion (the sequencer checks identity)
        # The run's input format; None until decided (F1, F2 by apply_labels, F3 by the first JSON object).
        self.format: str | None = None
        self.session: str | None = None  # current sessionId (extension section 3)
        self.errors: list[str] = []  # error messages emitted since the last turn end (C-F4, X-E3)
        # A format's own small counters and flags (plain JSON, bounded by the format: a few keys).
        self.local: dict[str, Any] = {}
        self._rules: FormatRules | None = None
        self._ts_ms = -1
        self._ts_text = ""
        self._text = ""  # the stdout line being mapped (for the depth guard)
        self._counted_text = ""  # the last line whose brackets `_too_deep` counted, and the verdict
        self._bracket_heavy = False

    # ------------------------------------------------------------------ state
    def to_state(self, include_calls: bool = True) -> dict[str, Any]:
        """The run as JSON-able data. Pending calls are ``calls``: [key, id, name, seq, ts, size,
        where] and, unless ``include_calls`` is False, the block (the worker stores each block once,
        apart, as ``take_call_changes`` tells it; ``from_state(..., calls=...)`` puts them back).

        ``pending`` (the old form of the calls: [id, name, input, block, seq, ts]) is written, empty,
        only when there are no calls: a run without calls has the state it always had, and a worker
        older than ``calls`` cannot read a state that has calls (it dead-letters that run's entries
        with a reason instead of dropping its calls unseen).
        """
        state: dict[str, Any] = {
            "v": STATE_VERSION,
            "run": self.run,
            "n": self.next_event,
            "counts": self.counts,
            "span": self.span,
        }
        pending = self.pending
        if pending:
            if include_calls:
                state["calls"] = [[c[CALL_KEY], c[CALL_ID], c[CALL_NAME], c[CALL_SEQ], c[CALL_TS], c[CALL_SIZE],
                                   c[CALL_WHERE], _stored(c)] for c in pending]
            else:
                state["calls"] = [[c[CALL_KEY], c[CALL_ID], c[CALL_NAME], c[CALL_SEQ], c[CALL_TS], c[CALL_SIZE],
                                   c[CALL_WHERE]] for c in pending]
        else:
            state["pending"] = []
        state["usage"] = self.usage
        state["format"] = self.format
        if self.calls_made:
            state["callsMade"] = self.calls_made
        # Written only when set, so a goose run's state stays as it was.
        if self.session is not None:
            state["session"] = self.session
        if self.errors:
            state["errors"] = self.errors
        if self.local:
            state["local"] = self.local
        return state

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_state())

    def load_state(self, state: dict[str, Any], calls: dict[int, Any] | None = None) -> None:
        """Everything of ``to_state``'s data but the format (``RunNormalizer.from_state`` decides
        that). ``calls``: the blocks stored apart, by key (as stored: ``[block, input]`` for a call
        whose input is not part of its block); given (even empty), calls found whole in the state
        are reported by ``take_call_changes`` as added, so a worker stores them apart from then on."""
        self.next_event = state["n"]
        self.counts = state["counts"]
        self.span = state["span"]
        self.calls_made = state.get("callsMade", 0)
        if "calls" in state:
            for meta in state["calls"]:
                key, size, where = meta[0], meta[5], meta[6]
                if len(meta) > 7:
                    stored = meta[7]
                    if calls is not None:
                        self._calls_added[key] = orjson.dumps(stored)
                elif calls is not None and key in calls:
                    stored = calls[key]
                else:
                    raise ValueError(f"pending call {key!r} is not in the state nor stored apart")
                block, args = input_at(stored, where)
                self.pending.append([meta[1], meta[2], args, block, meta[3], meta[4], key, size, where])
                self.pending_bytes += size
        else:
            # Written before calls were stored apart: each call whole, its input a second time (a
            # copy now, found again in the block by its value).
            for old in state["pending"]:
                self._keep([*old[:CALL_FIELDS]], calls is not None, equal=True)
        self.usage = state["usage"]
        self.session = state.get("session")
        self.errors = state.get("errors", [])
        self.local = state.get("local", {})

    # ----------------------------------------------------------------- format
    def use_rules(self, rules: FormatRules) -> None:
        """The run's format is decided: its rules map every JSON object from now on."""
        self.format = rules.name
        self._rules = rules

    def decide_format(self, record: Record) -> None:
        """F3 at a run's first JSON object (``RunNormalizer`` knows the formats; this does not)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- inputs
    def line(self, seq: int, ts_ms: int, text: str, stream: str = "stdout") -> list[Event]:
        """Events emitted by one raw `line` entry (contract 3.1)."""
        out: list[Event] = []
        self._line(out, seq, ts_ms, text, stream)
        return out

    def lines(self, entries: Iterable[tuple[int, int, str, str]]) -> list[Event]:
        """Events emitted by many raw `line` entries (``RawLine`` or plain 4-tuples) of this run.

        The same events as one ``line`` call per entry (a property test checks it), without a
        call and a list per entry: once the format is decided, its own batch loop takes over.
        """
        out: list[Event] = []
        rest = iter(entries)
        rules = self._rules
        if rules is None:
            # Tested on a local, not on the attribute: a type checker (and the compiled code,
            # which enforces its types) would take the attribute as still None after `_line`.
            for seq, ts_ms, text, stream in rest:
                self._line(out, seq, ts_ms, text, stream)
                rules = self._rules
                if rules is not None:
                    break
        if rules is not None:
            rules.batch(self, out, rest)
        return out

    def _line(self, out: list[Event], seq: int, ts_ms: int, text: str, stream: str) -> None:
        self._text = text
        if stream == "stderr":
            text = text.strip()
            if text:
                self.emit(out, ts_ms, "warning", {"message": text}, seq, seq)
            return
        try:
            # orjson skips surrounding whitespace itself; stripping is only needed on failure.
            record = _loads(text)
        except JSON_ERRORS:
            stripped = text.strip()  # Unicode whitespace JSON itself does not skip (\f, \v, NBSP)
            record = _NOT_JSON
            if stripped and stripped != text:
                try:
                    record = _loads(stripped)
                except JSON_ERRORS:
                    pass
            if record is _NOT_JSON:
                if stripped:
                    self.emit(out, ts_ms, "warning", {"message": stripped}, seq, seq)
                return
        rules = self._rules
        if rules is not None and type(record) is dict:
            rules.record(self, out, seq, ts_ms, record)  # the common case, one call shorter
        else:
            self.parsed(out, seq, ts_ms, record)

    # For format modules' batch loops: the reference path of one line, and the current line's text.
    def line_into(self, out: list[Event], seq: int, ts_ms: int, text: str, stream: str) -> None:
        self._line(out, seq, ts_ms, text, stream)

    def set_text(self, text: str) -> None:
        self._text = text

    def parsed(self, out: list[Event], seq: int, ts_ms: int, record: Any) -> None:
        """A stdout line that parsed as JSON (after ``set_text`` with the line)."""
        if type(record) is not dict:
            self.flush(out, ts_ms)
            self.unknown(out, ts_ms, record, seq, seq)
            return
        rules = self._rules
        if rules is None:
            self.decide_format(record)
            rules = self._rules
            assert rules is not None
        rules.record(self, out, seq, ts_ms, record)

    def end(self, seq: int, ts_ms: int, exit_code: int | None = None, agent: str | None = None,
            signal: int | None = None) -> list[Event]:
        """End of the run's input (eof, or the run declared abandoned): flush and drain. `agent`: the
        run's agent label, named in the exit error of a run whose format was never decided (the tap
        sets it to the command's name), so a command that is not goose is not called goose.
        `signal`: the signal the tap forwarded to the command (eof `signal`), if any: a run it stopped
        (a non-zero exit, or no `completed` record) ends with a `cancelled` error instead of the exit
        error, whatever the exit code (Gemini CLI exits 0 on SIGINT)."""
        out: list[Event] = []
        self._text = ""
        self.flush(out, ts_ms)
        self.drain(out, ts_ms)
        rules = self._rules
        product = rules.product if rules is not None else (agent.split("/", 1)[0] if agent else DEFAULT_PRODUCT)
        if signal is not None and (exit_code != 0 or self.usage is None):
            exited = "" if exit_code is None else f"; it exited with code {exit_code}"
            message = f"{product} was stopped by signal {signal} (forwarded by the tap){exited}"
            self.emit(out, ts_ms, "error", {"message": message, "code": SIGNALLED, "errorClass": CANCELLED}, seq, seq)
            return out
        if rules is not None and rules.finish is not None and rules.finish(self, out, seq, ts_ms, exit_code):
            return out
        if exit_code is not None and exit_code != 0:
            self.emit(out, ts_ms, "error", {"message": f"{product} exited with code {exit_code}"}, seq, seq)
        return out

    def warn(self, seq: int, ts_ms: int, message: str, code: str, lines: tuple[int, int]) -> list[Event]:
        """A warning of the service itself (e.g. raw entries that never arrived); does not flush."""
        out: list[Event] = []
        self.emit(out, ts_ms, "warning", {"message": message, "code": code}, lines[0], lines[1])
        return out

    # ------------------------------------------------------------------- spans
    def extend_span(self, kind: str, mid: object, text: str, seq: int) -> bool:
        """The common case of ``accumulate``, for a format's fast path: a fragment of the pending
        span's kind and id (``mid`` as read from the record: a non-string matches no span) that
        leaves it within the cap is joined in place. False: nothing done, take ``accumulate``."""
        span = self.span
        if span is None or span[SPAN_KIND] != kind or span[SPAN_ID] != mid or span[SPAN_TRUNCATED]:
            return False
        joined = join_fragment(span[SPAN_TEXT], text)
        if len(joined) > self.limits.max_span_chars:
            return False
        span[SPAN_TEXT] = joined
        span[SPAN_LAST] = seq
        return True

    def accumulate(self, out: list[Event], ts_ms: int, kind: str, mid: str, text: str, seq: int) -> None:
        """Contract 3.3: a fragment of the same kind and id restates or extends the span; any other
        flushes it and starts the next. Beyond the cap the text is cut and marked truncated."""
        span = self.span
        if span is not None and span[SPAN_KIND] == kind and span[SPAN_ID] == mid:
            span[SPAN_TEXT] = join_fragment(span[SPAN_TEXT], text)
            span[SPAN_LAST] = seq
        else:
            if span is not None:
                self.flush(out, ts_ms)
            span = self.span = [kind, mid, text, seq, seq, False]
        cap = self.limits.max_span_chars
        if len(span[SPAN_TEXT]) > cap:
            span[SPAN_TEXT] = span[SPAN_TEXT][:cap]
            span[SPAN_TRUNCATED] = True

    def flush(self, out: list[Event], ts_ms: int) -> None:
        span = self.span
        if span is None:
            return
        self.span = None
        fields: dict[str, Any] = {"message": span[SPAN_TEXT]}
        if span[SPAN_TRUNCATED]:
            fields["truncated"] = True
        self.emit(out, ts_ms, span[SPAN_KIND], fields, span[SPAN_FIRST], span[SPAN_LAST])

    def whole_text(self, out: list[Event], ts_ms: int, kind: str, text: str, seq: int) -> None:
        """An agent/reasoning text that arrives whole (no span), under the same cap."""
        fields: dict[str, Any] = {"message": text}
        cap = self.limits.max_span_chars
        if len(text) > cap:
            fields = {"message": text[:cap], "truncated": True}
        self.emit(out, ts_ms, kind, fields, seq, seq)

    # ------------------------------------------------------------------ tools
    def add_call(self, out: list[Event], ts_ms: int, call: list[Any]) -> None:
        """Record an unanswered call ([id, name, input, block, seq, ts]); beyond either cap
        (MAX_PENDING_TOOLS calls, MAX_PENDING_TOOL_BYTES of them) the oldest is surfaced as
        `unknown`, until both hold. A call larger than the byte cap by itself is surfaced at once
        instead (making room for it would surface every other call and still not be enough)."""
        if self._too_deep(call[CALL_RAW]):
            # Never kept in the state (which could not be serialized): surfaced at once.
            self.unknown(out, ts_ms, call[CALL_RAW], call[CALL_SEQ], call[CALL_SEQ], tool=call[CALL_NAME], call_id=call[CALL_ID])
            return
        self._keep(call, True)
        pending = self.pending
        limits = self.limits
        if len(pending) > limits.max_pending_tools:
            self._evict(out, ts_ms, EVICT_COUNT, 0)
        if call[CALL_SIZE] > limits.max_pending_tool_bytes:
            self._evict(out, ts_ms, EVICT_BYTES, len(pending) - 1)
        while self.pending_bytes > limits.max_pending_tool_bytes:
            self._evict(out, ts_ms, EVICT_BYTES, 0)

    def _keep(self, call: list[Any], tracked: bool, equal: bool = False) -> None:
        """Append a call with its key, size and input's place; ``tracked``: reported as added."""
        block, args = call[CALL_RAW], call[CALL_INPUT]
        where = locate_input(block, args, equal)
        if type(where) is list:
            block, args = input_at(block, where)  # the block's own part from now on, as after a reload
            call[CALL_INPUT] = args
        data = orjson.dumps([block, args] if where is INPUT_BESIDE else block)
        size = len(data) + PENDING_CALL_OVERHEAD
        key = self.calls_made
        self.calls_made = key + 1
        call.extend((key, size, where))
        self.pending.append(call)
        self.pending_bytes += size
        if tracked:
            self._calls_added[key] = data

    def _drop(self, call: list[Any]) -> list[Any]:
        """A call leaves the pending list: its bytes and storage go; its first six fields stay."""
        self.pending_bytes -= call[CALL_SIZE]
        key = call[CALL_KEY]
        if self._calls_added.pop(key, None) is None:
            self._calls_removed.add(key)
        del call[CALL_FIELDS:]
        return call

    def _evict(self, out: list[Event], ts_ms: int, cap: str, index: int) -> None:
        oldest = self._drop(self.pending.pop(index))
        self.evictions[cap] = self.evictions.get(cap, 0) + 1
        rules = self._rules
        if rules is not None and rules.consumed(oldest[CALL_NAME]):
            return  # consumed calls stay silent, even when evicted
        self.unknown(out, ts_ms, oldest[CALL_RAW], oldest[CALL_SEQ], oldest[CALL_SEQ], tool=oldest[CALL_NAME],
                     call_id=oldest[CALL_ID])

    def take_call(self, call_id: Any) -> list[Any] | None:
        """The oldest pending call with this id (removed: [id, name, input, block, seq, ts]), or None."""
        if type(call_id) is str:
            for i, pending in enumerate(self.pending):
                if pending[CALL_ID] == call_id:
                    return self._drop(self.pending.pop(i))
        return None

    def drain(self, out: list[Event], ts_ms: int) -> None:
        """Unanswered calls at a turn's or the input's end become `unknown{raw: request}`."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        rules = self._rules
        for call in pending:
            call_id, name, block, req_seq = call[CALL_ID], call[CALL_NAME], call[CALL_RAW], call[CALL_SEQ]
            self._drop(call)
            if rules is not None and rules.consumed(name):
                continue
            self.unknown(out, ts_ms, block, req_seq, req_seq, tool=name, call_id=call_id)

    def take_call_changes(self) -> tuple[list[tuple[int, bytes]], list[int]]:
        """Calls kept (key, stored JSON) and given up (key) since the last call or since the state
        was loaded: what a worker writes and deletes beside the state."""
        if not self._calls_added and not self._calls_removed:
            return [], []
        added = sorted(self._calls_added.items())
        removed = sorted(self._calls_removed)
        self._calls_added = {}
        self._calls_removed = set()
        return added, removed

    def take_evictions(self) -> dict[str, int]:
        """Calls surfaced early by each cap since the last call (for the shell's counter)."""
        evictions = self.evictions
        if evictions:
            self.evictions = {}
        return evictions

    def side_snapshot(self) -> tuple[dict[int, Any], dict[int, bytes], set[int]]:
        """What ``to_state(include_calls=False)`` leaves out, for a guarded step's restore."""
        return ({c[CALL_KEY]: _stored(c) for c in self.pending}, dict(self._calls_added), set(self._calls_removed))

    def side_restore(self, snapshot: tuple[dict[int, Any], dict[int, bytes], set[int]]) -> None:
        self._calls_added, self._calls_removed = dict(snapshot[1]), set(snapshot[2])

    def tool_events(
        self,
        out: list[Event],
        ts_ms: int,
        kinds: Sequence[Mapping[str, Any]] | None,
        raw: Any,
        tail: dict[str, Any],
        first: int,
        last: int,
        success: bool | None,
        exit_code: Any = None,
    ) -> None:
        """The events of one classified tool call: kind fields, exit code, success, extras.

        ``kinds`` None: unmapped, one ``unknown{raw}`` with the extras; ``[]``: consumed.
        """
        if kinds is None:
            if self._too_deep(raw):
                # As ``unknown``: a record kept whole that no consumer can take is kept as its line's text
                # (a format whose call and result come in one record, opencode's, never stores it first).
                raw = self._text.strip()
            self.emit(out, ts_ms, "unknown", {"raw": raw, **tail}, first, last)
            return
        for kind in kinds:
            etype = kind["type"]
            event = self.emit(out, ts_ms, etype, kind, first, last)
            if etype == "command" and is_int(exit_code):
                event["exitCode"] = exit_code
            if success is not None:
                event["isSuccess"] = success
            event.update(tail)

    # ------------------------------------------------------------------ errors
    def error(self, out: list[Event], ts_ms: int, message: str, code: str | None, seq: int,
              error_class: str | None = None) -> None:
        """An `error` event, remembered for the not-reported-twice rules. ``error_class``: the class
        the format's own rules gave (None: the shared rules of error_classes.py decide)."""
        fields: dict[str, Any] = {"message": message}
        if code is not None:
            fields["code"] = code
        if error_class is not None:
            fields["errorClass"] = error_class
        self.emit(out, ts_ms, "error", fields, seq, seq)
        errors = self.errors
        if message not in errors:
            errors.append(message)
            if len(errors) > MAX_RECENT_ERRORS:
                del errors[0]

    def turn_ended(self, usage: dict[str, Any] | None) -> None:
        """A turn ended: forget its errors; a usage (a new object) makes a `completed` record."""
        self.errors = []
        if usage is not None:
            self.usage = usage

    # ---------------------------------------------------------------- emitting
    def unknown(
        self,
        out: list[Event],
        ts_ms: int,
        raw: Any,
        first: int,
        last: int,
        tool: Any = None,
        call_id: Any = None,
    ) -> None:
        # `raw` is never null: a JSON null record or block is kept as its JSON text; so is a value
        # nested too deep for any consumer (orjson writes 254 levels at most): the line's text.
        if raw is None:
            raw = "null"
        elif self._too_deep(raw):
            raw = self._text.strip()
        fields: dict[str, Any] = {"raw": raw}
        if type(tool) is str:
            fields["tool"] = tool
        if type(call_id) is str:
            fields["toolCallId"] = call_id
        self.emit(out, ts_ms, "unknown", fields, first, last)

    def _too_deep(self, value: Any) -> bool:
        """Is a value of the current line nested deeper than MAX_JSON_DEPTH? Counting the line's
        brackets is a cheap bound; only a line that could be that deep is walked."""
        text = self._text
        if len(text) <= 2 * MAX_JSON_DEPTH:
            return False
        if text is not self._counted_text:  # counted once per line, however many values it has
            self._counted_text = text
            self._bracket_heavy = text.count("[") + text.count("{") > MAX_JSON_DEPTH
        return self._bracket_heavy and json_depth(value) > MAX_JSON_DEPTH

    def emit(self, out: list[Event], ts_ms: int, etype: str, fields: Mapping[str, Any], first: int, last: int) -> Event:
        """Append the next event, counted, and return it: the envelope (contract section 2)
        then the kind's fields, built as one dict display (a "type" among the fields lands on
        the envelope's, same value, same place). The caller may add fields after these."""
        n = self.next_event
        self.next_event = n + 1
        counts = self.counts
        counts[etype] = counts.get(etype, 0) + 1
        if ts_ms != self._ts_ms:
            self._ts_ms = ts_ms
            self._ts_text = format_ms(ts_ms)
        session = self.session
        if session is None:
            event = {
                "eventId": f"{self.run}:{n}",
                "runId": self.run,
                "seq": n,
                "type": etype,
                "timestamp": self._ts_text,
                "lines": [first, last],
                **fields,
            }
        else:
            event = {
                "eventId": f"{self.run}:{n}",
                "runId": self.run,
                "seq": n,
                "type": etype,
                "timestamp": self._ts_text,
                "lines": [first, last],
                "sessionId": session,
                **fields,
            }
        # errorClass (services/normalizer/error_classes.py), unless the format set it from its own
        # texts (fields with "errorClass": a format module's table, read before the shared rules).
        if (etype == "error" or etype == "warning") and "errorClass" not in fields:
            error_class = event_class(etype, fields.get("code"), fields.get("message"))
            if error_class is not None:
                event["errorClass"] = error_class
        out.append(event)
        return event

    def counts_by_type(self) -> dict[str, int]:
        return {t: self.counts.get(t, 0) for t in EVENT_TYPES}


def _stored(call: list[Any]) -> Any:
    """A pending call's block as stored: with its input beside it when the input is not part of it."""
    if call[CALL_WHERE] is INPUT_BESIDE:
        return [call[CALL_RAW], call[CALL_INPUT]]
    return call[CALL_RAW]
