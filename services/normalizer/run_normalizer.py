"""``RunNormalizer``: the shared machinery plus the run's format decision (extension section 1).

``machinery.Machinery`` maps lines once a format's rules are in place and knows no format; the
format modules (``services/normalizer/formats/``) import only it. This module is the one that
knows them all: the registry (``formats.RULES``) and the rules F1-F4 that pick one, both read from
the table of contracts/formats.py. The imports go one way, machinery <- formats <- here.
"""

from __future__ import annotations

from typing import Any

import orjson

from contracts.formats import AGENT_FORMATS, BY_AGENT_PRODUCT, DEFAULT_FORMAT, FORMAT_NAMES
from services.normalizer.formats import RULES
from services.normalizer.machinery import DEFAULT_LIMITS, STATE_VERSION, Event, Limits, Machinery, Record

# F3, from the table: record type -> format, record types that need a string subtype -> format,
# and (type prefix, format) in the table's order.
_BY_RECORD_TYPE = {t: f.name for f in AGENT_FORMATS for t in f.record_types}
_BY_SUBTYPED_RECORD_TYPE = {t: f.name for f in AGENT_FORMATS for t in f.subtyped_record_types}
_TYPE_PREFIXES = tuple((p, f.name) for f in AGENT_FORMATS for p in f.type_prefixes)
# Record type -> (key whose string value it needs, format): checked first, the most specific rule.
_BY_KEYED_RECORD_TYPE = {t: (f.record_key, f.name) for f in AGENT_FORMATS for t in f.keyed_record_types}


def detect_format(record: Record) -> str:
    """F3: the format named by the first JSON object of a run's stdout."""
    rtype = record.get("type")
    if type(rtype) is not str:
        return DEFAULT_FORMAT
    keyed = _BY_KEYED_RECORD_TYPE.get(rtype)
    if keyed is not None and type(record.get(keyed[0])) is str:
        return keyed[1]
    fmt = _BY_RECORD_TYPE.get(rtype)
    if fmt is not None:
        return fmt
    fmt = _BY_SUBTYPED_RECORD_TYPE.get(rtype)
    if fmt is not None and type(record.get("subtype")) is str:
        return fmt
    for prefix, name in _TYPE_PREFIXES:
        if rtype.startswith(prefix):
            return name
    return DEFAULT_FORMAT


def format_from_agent(agent: str | None) -> str | None:
    """F2: the format named by an `agent` label's product part, if any."""
    if not agent:
        return None
    return BY_AGENT_PRODUCT.get(agent.split("/", 1)[0].lower())


class RunNormalizer(Machinery):
    """One run's normaliser: ``Machinery`` with the format decided by F1, F2 (``apply_labels``),
    F3 (the first JSON object) or given (``fmt``)."""

    def __init__(self, run: str, limits: Limits = DEFAULT_LIMITS, fmt: str | None = None) -> None:
        super().__init__(run, limits)
        if fmt is not None:
            self.set_format(fmt)

    @classmethod
    def from_bytes(cls, data: bytes, limits: Limits = DEFAULT_LIMITS) -> RunNormalizer:
        return cls.from_state(orjson.loads(data), limits)

    @classmethod
    def from_state(cls, state: dict[str, Any], limits: Limits = DEFAULT_LIMITS,
                   calls: dict[int, Any] | None = None) -> RunNormalizer:
        """A normalizer from ``to_state``'s data (``Machinery.load_state`` says what ``calls`` is)."""
        if state.get("v") != STATE_VERSION:
            raise ValueError(f"normalizer state version {state.get('v')!r} is not {STATE_VERSION}")
        self = cls(state["run"], limits)
        self.load_state(state, calls)
        # States written before formats existed have no key: those runs were goose runs.
        fmt = state.get("format", DEFAULT_FORMAT)
        if fmt is not None:
            self.set_format(fmt)
        return self

    def set_format(self, fmt: str) -> None:
        rules = RULES.get(fmt) if type(fmt) is str else None  # a state's format may be any JSON value
        if rules is None:
            raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMAT_NAMES)}")
        self.use_rules(rules)

    def decide_format(self, record: Record) -> None:
        self.set_format(detect_format(record))

    def apply_labels(self, format_label: str | None, agent_label: str | None, seq: int, ts: int) -> list[Event]:
        """F1, F2 and F4 of the extension, called when the run's seq-0 entry is processed,
        before that entry's ``line`` (F3 decides at the first JSON object otherwise).

        Returns the F4 warning when the `format` label names no format. A run whose format is
        already decided keeps it (a format is fixed once). An empty label counts as absent.
        """
        out: list[Event] = []
        if self.format is not None:
            return out
        if format_label:
            if format_label in RULES:
                self.set_format(format_label)
                return out
            self.emit(out, ts, "warning", {"message": f"unknown format label: {format_label}", "code": "format"}, seq, seq)
        fmt = format_from_agent(agent_label)
        if fmt is not None:
            self.set_format(fmt)
        return out
