"""Validation of raw entries as they arrive on a stream (plain field maps of bytes)."""

from __future__ import annotations

import re
from typing import NamedTuple

import orjson

from contracts.raw import RUN_KEY_PATTERN
from services.normalizer.timefmt import parse_ts

_RUN_RE = re.compile(RUN_KEY_PATTERN.encode())
MAX_SEQ = 2**53  # beyond what a JSON number holds exactly in every consumer language
_RUN_KEYS: dict[bytes, str] = {}  # run keys already validated (bounded: cleared when full)


class EntryError(ValueError):
    """A raw entry that can never be processed; the message is the dead-letter reason detail."""


class Entry(NamedTuple):
    run: str
    seq: int
    ts: int  # Unix ms
    kind: str  # line | eof | abandon
    stream: str  # stdout | stderr
    line: str
    exit: int | None
    host: str | None
    agent: str | None
    sid: str  # stream entry id, for dead letters and latency
    # abandon markers only: the last seq the run consists of, and ranges that never arrived
    through: int = -1
    missing: tuple = ()
    parent: str | None = None  # run key of the parent run (subagent sessions), a label like host
    continues: str | None = None  # run key this run continues (a later part of an imported session)

    def to_list(self) -> list:
        return list(self)

    @classmethod
    def from_list(cls, values: list) -> "Entry":
        values = list(values)
        values[11] = tuple(tuple(r) for r in values[11])
        return cls(*values)


def _text(value: bytes | None, field: str) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise EntryError(f"field {field!r} is not UTF-8") from None


def _int(value: bytes | None, field: str) -> int:
    if value is None:
        raise EntryError(f"missing {field!r}")
    text = value.strip()
    if not text or not text.lstrip(b"-").isdigit():
        raise EntryError(f"{field!r} is not an integer")
    return int(text)


def _label_run(value: bytes | None) -> str | None:
    """A run-key label (`parent`, `continues`); anything not a run key is ignored."""
    return value.decode("ascii") if value is not None and _RUN_RE.fullmatch(value) else None


def parse_fields(fields: dict[bytes, bytes], sid: str) -> Entry:
    """An Entry from a stream entry's field map, or EntryError with the reason.

    A `line` that is not valid UTF-8 is decoded with U+FFFD replacements (the raw log keeps
    the bytes): losing the line would leave a gap, and goose's output is UTF-8 by design.
    A missing `ts` takes the stream id's millisecond part, which is in the log and replays alike.
    """
    run_b = fields.get(b"run")
    if run_b is None:
        raise EntryError("missing 'run'")
    run = _RUN_KEYS.get(run_b)
    if run is None:
        if not _RUN_RE.fullmatch(run_b):
            raise EntryError("'run' is not a run key (1-200 chars of [A-Za-z0-9._:/@-])")
        run = run_b.decode("ascii")
        if len(_RUN_KEYS) >= 65_536:
            _RUN_KEYS.clear()
        _RUN_KEYS[run_b] = run
    seq = _int(fields.get(b"seq"), "seq")
    if seq < 0:
        raise EntryError("'seq' is negative")
    if seq > MAX_SEQ:
        raise EntryError("'seq' is too large")
    ts_b = fields.get(b"ts")
    if ts_b is None:
        ts = int(sid.split("-", 1)[0])
    elif ts_b.isdigit() and len(ts_b) <= 14:  # the taps' form: Unix ms (14 digits stay in range)
        ts = int(ts_b)
    else:
        parsed = parse_ts(ts_b)
        if parsed is None:
            raise EntryError("'ts' is neither Unix ms nor an RFC 3339 time")
        ts = parsed
    kind_b = fields.get(b"kind", b"line")
    stream_b = fields.get(b"stream", b"stdout")
    if stream_b not in (b"stdout", b"stderr"):
        raise EntryError("'stream' is neither stdout nor stderr")
    host = _text(fields.get(b"host"), "host")
    agent = _text(fields.get(b"agent"), "agent")
    parent = _label_run(fields.get(b"parent"))
    continues = _label_run(fields.get(b"continues"))
    if kind_b == b"line":
        line_b = fields.get(b"line")
        if line_b is None:
            raise EntryError("kind=line without 'line'")
        return Entry(run, seq, ts, "line", stream_b.decode(), line_b.decode("utf-8", "replace"), None, host, agent, sid,
                     parent=parent, continues=continues)
    if kind_b == b"eof":
        exit_b = fields.get(b"exit")
        exit_code = _int(exit_b, "exit") if exit_b not in (None, b"") else None
        return Entry(run, seq, ts, "eof", stream_b.decode(), "", exit_code, host, agent, sid,
                     parent=parent, continues=continues)
    if kind_b == b"abandon":
        through = _int(fields.get(b"through"), "through")
        try:
            missing = tuple(tuple(int(x) for x in r) for r in orjson.loads(fields.get(b"missing", b"[]")))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            raise EntryError("'missing' is not a JSON list of [first, last] ranges") from None
        return Entry(run, seq, ts, "abandon", "stdout", "", None, host, agent, sid, through, missing)
    raise EntryError("'kind' is not line, eof or abandon")
