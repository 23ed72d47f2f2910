"""Raw entries as they arrive on a stream (plain field maps of bytes): validation and encoding.

`Entry.from_fields` (= `parse_fields`) is total: any field map either gives an Entry or raises
`EntryError` with a reason that names the field, never anything else. `Entry.to_fields` is its
inverse, used by everything that writes raw or control entries (tap, worker, importer, bench).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import orjson

from contracts.raw import ABANDON, EOF, INVALID_ENTRY, LINE, MAX_LABEL_CHARS, OVERSIZE, RUN_KEY_PATTERN, stream_id_ms
from services.normalizer.timefmt import MAX_MS, MIN_MS, parse_ts

_RUN_RE = re.compile(RUN_KEY_PATTERN.encode())
# An optional sign and at most 19 digits (a 64-bit integer): never int() of thousands of digits.
_INT_RE = re.compile(rb"\s*(-?[0-9]{1,19})\s*")
MAX_SEQ = 2**53  # beyond what a JSON number holds exactly in every consumer language
MIN_EXIT, MAX_EXIT = -(2**31), 2**31 - 1  # exit codes and signal numbers fit in a C int
MAX_SIGNAL = 127  # an eof's `signal`: a signal number (Linux: 1..64; 128+N exit codes need N < 128)
MAX_MISSING_RANGES = 100_000  # a marker names at most this many gaps (a run holds at most 10k entries)
MAX_MISSING_BYTES = 2_000_000
STDOUT, STDERR = "stdout", "stderr"
_RUN_KEYS: dict[bytes, str] = {}  # run keys already validated (bounded: cleared when full)
MAX_CACHED = 65_536  # bound of each memo of validated field values

SeqRange = tuple[int, int]


class EntryError(ValueError):
    """A raw entry that can never be processed; the message is the dead-letter reason detail.

    `run` and `seq` are set when they were valid before another field failed: the run then knows
    that this seq will never arrive, and reports it as missing.
    """

    def __init__(self, reason: str, run: str | None = None, seq: int | None = None) -> None:
        super().__init__(reason)
        self.run = run
        self.seq = seq


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
    missing: tuple[SeqRange, ...] = ()
    parent: str | None = None  # run key of the parent run (subagent sessions), a label like host
    continues: str | None = None  # run key this run continues (a later part of an imported session)
    format: str | None = None  # the agent's output format label (goose | claude-code | codex | ...)
    signal: int | None = None  # eof only: the signal the tap forwarded to the command, when it did

    # ------------------------------------------------------------------ constructors
    # One per kind, with the fields that kind has: eleven positional fields are easy to misplace.
    @classmethod
    def of_line(cls, run: str, seq: int, ts: int, line: str, *, stream: str = "stdout", sid: str = "",
                host: str | None = None, agent: str | None = None, parent: str | None = None,
                continues: str | None = None, format: str | None = None) -> Entry:
        return cls(run, seq, ts, LINE, stream, line, None, host, agent, sid, -1, (), parent, continues, format)

    @classmethod
    def of_eof(cls, run: str, seq: int, ts: int, exit: int | None = 0, *, stream: str = "stdout", sid: str = "",
               host: str | None = None, agent: str | None = None, parent: str | None = None,
               continues: str | None = None, format: str | None = None, signal: int | None = None) -> Entry:
        return cls(run, seq, ts, EOF, stream, "", exit, host, agent, sid, -1, (), parent, continues, format, signal)

    @classmethod
    def of_abandon(cls, run: str, seq: int, ts: int, through: int, missing: tuple[SeqRange, ...] = (), *,
                   sid: str = "", host: str | None = None, agent: str | None = None) -> Entry:
        return cls(run, seq, ts, ABANDON, "stdout", "", None, host, agent, sid, through, missing)

    # ------------------------------------------------------------------ serialized state
    def to_list(self) -> list[object]:
        return list(self)

    @classmethod
    def from_list(cls, values: list[object]) -> Entry:
        items = list(values)
        items[11] = tuple((int(r[0]), int(r[1])) for r in items[11])  # type: ignore[attr-defined]
        return cls(*items)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ stream fields
    def to_fields(self) -> dict[bytes, bytes]:
        """The entry as stream fields, in the documented order (docs/raw-entries.md)."""
        out: dict[bytes, bytes] = {b"run": self.run.encode(), b"seq": str(self.seq).encode(),
                                   b"ts": str(self.ts).encode(), b"kind": self.kind.encode()}
        if self.kind == LINE:
            out[b"stream"] = self.stream.encode()
            out[b"line"] = self.line.encode("utf-8", "surrogatepass")
        elif self.kind == ABANDON:
            out[b"through"] = str(self.through).encode()
            out[b"missing"] = orjson.dumps([list(r) for r in self.missing])
        if self.exit is not None:
            out[b"exit"] = str(self.exit).encode()
        if self.signal is not None:
            out[b"signal"] = str(self.signal).encode()
        for name, value in ((b"host", self.host), (b"agent", self.agent), (b"format", self.format),
                            (b"parent", self.parent), (b"continues", self.continues)):
            if value:
                out[name] = value.encode("utf-8", "surrogatepass")
        return out

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes], sid: str, control: bool = False) -> Entry:
        return parse_fields(fields, sid, control)


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
    if len(value) <= 19 and value.isdigit():  # the usual form, without the regex (bytes: ASCII digits only)
        return int(value)
    m = _INT_RE.fullmatch(value)
    if m is None:
        raise EntryError(f"{field!r} is not an integer (at most 19 ASCII digits)")
    return int(m.group(1))


def _ts(value: bytes | None, sid: str) -> int:
    if value is None:
        return stream_id_ms(sid)
    if value.isdigit() and len(value) <= 14:  # the taps' form: Unix ms (14 digits stay in range)
        return int(value)
    if len(value) > 64:
        raise EntryError("'ts' is neither Unix ms nor an RFC 3339 time")
    m = _INT_RE.fullmatch(value)
    if m is not None:
        ms = int(m.group(1))
        if MIN_MS <= ms <= MAX_MS:
            return ms
        raise EntryError("'ts' is out of range (years 1..9999)")
    try:
        parsed = parse_ts(value)
    except (ValueError, OverflowError, TypeError):  # exotic digits or dates parse_ts lets through
        parsed = None
    if parsed is None:
        raise EntryError("'ts' is neither Unix ms nor an RFC 3339 time")
    return parsed


def _label_run(value: bytes | None) -> str | None:
    """A run-key label (`parent`, `continues`); anything not a run key is ignored."""
    return value.decode("ascii") if value is not None and _RUN_RE.fullmatch(value) else None


def _missing(value: bytes | None, through: int) -> tuple[SeqRange, ...]:
    bad = EntryError("'missing' is not a JSON list of ascending [first, last] ranges within 0..through")
    if value is None:
        return ()
    if len(value) > MAX_MISSING_BYTES:
        raise bad
    try:
        ranges = orjson.loads(value)
    except orjson.JSONDecodeError:  # also orjson's own recursion limit
        raise bad from None
    if not isinstance(ranges, list) or len(ranges) > MAX_MISSING_RANGES:
        raise bad
    out: list[SeqRange] = []
    last = -1
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)):
            raise bad
        a, b = r
        if not (last < a <= b <= through):
            raise bad
        out.append((a, b))
        last = b
    return tuple(out)


def _run_key(value: bytes | None) -> str:
    if value is None:
        raise EntryError("missing 'run'")
    run = _RUN_KEYS.get(value)
    if run is None:
        if not _RUN_RE.fullmatch(value):
            raise EntryError("'run' is not a run key (1-200 chars of [A-Za-z0-9._:/@-])")
        run = value.decode("ascii")
        if len(_RUN_KEYS) >= MAX_CACHED:
            _RUN_KEYS.clear()
        _RUN_KEYS[value] = run
    return run


def parse_fields(fields: dict[bytes, bytes], sid: str, control: bool = False) -> Entry:
    """An Entry from a stream entry's field map, or EntryError with the reason.

    `control`: the entry comes from a worker-only control stream, where only `kind=abandon` is
    valid; on a raw stream `kind=abandon` is a forgery and rejected.

    A `line` that is not valid UTF-8 is decoded with U+FFFD replacements (the raw log keeps
    the bytes): losing the line would leave a gap, and goose's output is UTF-8 by design.
    A missing `ts` takes the stream id's millisecond part, which is in the log and replays alike.
    """
    if not control and fields.get(b"kind") == b"abandon":
        # A forgery (or a misrouted control entry): it must not even mark a seq of the run lost.
        raise EntryError("kind=abandon on a raw stream (only workers write abandon markers, on the control stream)")
    run = _run_key(fields.get(b"run"))
    seq = _int(fields.get(b"seq"), "seq")
    if seq < 0:
        raise EntryError("'seq' is negative")
    if seq > MAX_SEQ:
        raise EntryError("'seq' is too large")
    try:
        return _parse_rest(fields, sid, control, run, seq)
    except EntryError as exc:
        raise EntryError(str(exc), run, seq) from None


class Rejected(NamedTuple):
    """A raw entry of a batch that is no entry: the dead-letter reason and detail, and the run and
    seq it names when both were valid before another field failed (that seq is lost for the run)."""

    reason: str
    detail: str
    run: str | None = None
    seq: int | None = None


def parse_batch(sids: list[str], fields: list[dict[bytes, bytes]], max_bytes: int,
                control: bool = False) -> list[Entry | Rejected]:
    """Each raw entry of a batch read as ``parse_fields`` reads it, after the size cap (names and
    values over ``max_bytes`` bytes: ``oversize``). Total: anything that is no entry is a
    ``Rejected``. One call a batch, so the loop runs in the core, not once per entry in the shell.
    ``control``: entries of a control stream (``replay`` reads those too, by the same rules)."""
    out: list[Entry | Rejected] = []
    for sid, fmap in zip(sids, fields, strict=True):
        out.append(_capped(sid, fmap, max_bytes, control))
    return out


def _capped(sid: str, fmap: dict[bytes, bytes], max_bytes: int, control: bool) -> Entry | Rejected:
    try:
        size = 0
        for name, value in fmap.items():
            size += len(name) + len(value)
        if size > max_bytes:
            return Rejected(OVERSIZE, f"{size} bytes > {max_bytes}")
        return parse_fields(fmap, sid, control)
    except EntryError as exc:
        if exc.run is not None and exc.seq is not None:
            return Rejected(INVALID_ENTRY, str(exc), exc.run, exc.seq)
        return Rejected(INVALID_ENTRY, str(exc))
    except Exception as other:  # parsing is meant to be total; this is the last line of defence
        # (its own name: compiled code gives one name one type, and `exc` is an EntryError above)
        return Rejected(INVALID_ENTRY, f"unparseable ({type(other).__name__})")


class Labels(NamedTuple):
    """The label fields of an entry, decoded and validated."""

    host: str | None
    agent: str | None
    format: str | None
    parent: str | None
    continues: str | None


LabelFields = tuple[bytes | None, bytes | None, bytes | None, bytes | None, bytes | None]
_LABELS: dict[LabelFields, Labels] = {}  # label fields already decoded (bounded: cleared when full)


def decode_labels(raw: LabelFields) -> Labels:
    """The reference decoding of (host, agent, format, parent, continues) fields."""
    host_b, agent_b, fmt_b, parent_b, continues_b = raw
    host = _text(host_b, "host")
    agent = _text(agent_b, "agent")
    fmt = _text(fmt_b, "format")
    if fmt is not None and (not fmt or len(fmt) > MAX_LABEL_CHARS or not fmt.isprintable()):
        raise EntryError(f"'format' is not a short printable label (1-{MAX_LABEL_CHARS} chars)")
    return Labels(host, agent, fmt, _label_run(parent_b), _label_run(continues_b))


def labels_of(fields: dict[bytes, bytes]) -> Labels:
    """`decode_labels` memoized: a run's entries repeat the same labels, so each distinct set is
    decoded once (a property test checks the memo against the reference). Labels that raise are
    not kept."""
    get = fields.get
    raw = (get(b"host"), get(b"agent"), get(b"format"), get(b"parent"), get(b"continues"))
    labels = _LABELS.get(raw)
    if labels is None:
        labels = decode_labels(raw)
        if len(_LABELS) >= MAX_CACHED:
            _LABELS.clear()
        _LABELS[raw] = labels
    return labels


def _parse_rest(fields: dict[bytes, bytes], sid: str, control: bool, run: str, seq: int) -> Entry:
    get = fields.get
    ts = _ts(get(b"ts"), sid)
    kind_b = get(b"kind", b"line")
    if control:
        if kind_b != b"abandon":
            raise EntryError("a control stream holds only kind=abandon")
    stream_b = get(b"stream", b"stdout")
    if stream_b == b"stdout":
        stream = STDOUT
    elif stream_b == b"stderr":
        stream = STDERR
    else:
        raise EntryError("'stream' is neither stdout nor stderr")
    host, agent, fmt, parent, continues = labels_of(fields)
    if kind_b == b"line":
        line_b = get(b"line")
        if line_b is None:
            raise EntryError("kind=line without 'line'")
        # Positional: a NamedTuple built with keywords costs a third more.
        return Entry(run, seq, ts, LINE, stream, line_b.decode("utf-8", "replace"), None, host, agent, sid,
                     -1, (), parent, continues, fmt)
    if kind_b == b"eof":
        exit_b = get(b"exit")
        exit_code = _int(exit_b, "exit") if exit_b not in (None, b"") else None
        if exit_code is not None and not MIN_EXIT <= exit_code <= MAX_EXIT:
            raise EntryError("'exit' is out of range (a 32-bit exit code)")
        signal_b = get(b"signal")
        signum = _int(signal_b, "signal") if signal_b not in (None, b"") else None
        if signum is not None and not 1 <= signum <= MAX_SIGNAL:
            raise EntryError(f"'signal' is out of range (a signal number, 1-{MAX_SIGNAL})")
        return Entry(run, seq, ts, EOF, stream, "", exit_code, host, agent, sid, -1, (), parent, continues, fmt,
                     signum)
    if kind_b == b"abandon":
        through = _int(fields.get(b"through"), "through")
        if not -1 <= through <= MAX_SEQ:
            raise EntryError("'through' is out of range (-1 .. 2**53)")
        missing = _missing(fields.get(b"missing"), through)
        return Entry(run, seq, ts, ABANDON, STDOUT, "", None, host, agent, sid, through, missing)
    raise EntryError("'kind' is not line, eof or abandon")


class EntryIdentity(NamedTuple):
    run: str
    seq: int


def entry_identity(fields: dict[bytes, bytes]) -> EntryIdentity | None:
    """The run and seq of an entry that cannot be processed (oversize, too many deliveries), when
    both are valid: the run then reports the seq missing instead of waiting for it."""
    try:
        run = _run_key(fields.get(b"run"))
        seq = _int(fields.get(b"seq"), "seq")
    except EntryError:
        return None
    return EntryIdentity(run, seq) if 0 <= seq <= MAX_SEQ else None
