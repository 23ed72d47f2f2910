"""A request body of the gateway: decompressed within a bound, parsed, each entry checked (pure, no I/O).

Every function here is total over bytes: it returns a result or raises ``BodyError`` (which says the
HTTP status and a reason that names no token and quotes no line), never anything else.

Entries are the raw-entry fields of the contract (contracts/raw.py, docs/raw-entries.md) as a JSON
object each: string values, or integers for ``seq``, ``ts``, ``exit``; ``line_b64`` carries a line
that is not UTF-8 (the tap's spool records are exactly this). Each one is validated by the one
decoder, ``Entry.from_fields``, and written as the fields it validated, in the documented order.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass

import orjson

from contracts.gateway import REFUSAL_REASONS as REFUSAL_REASONS
from contracts.gateway import REFUSED_INVALID as INVALID
from contracts.gateway import REFUSED_OUTSIDE_PREFIX as OUTSIDE_PREFIX
from contracts.gateway import REFUSED_OVERSIZE as OVERSIZE
from services.sequencer.entries import EntryError, parse_fields

# The order of the contract's fields (Entry.to_fields); other fields a shipper adds follow them.
FIELD_ORDER = (b"run", b"seq", b"ts", b"kind", b"stream", b"line", b"exit", b"signal", b"host", b"agent", b"format",
               b"parent", b"continues")
# Fields only a worker writes (abandon markers, on the control streams) and the spool's local tag.
FORBIDDEN = frozenset({"through", "missing"})
DROPPED = frozenset({"_src"})
MAX_FIELD_NAME = 64
MAX_FIELDS = 64
ZSTD_STEP = 512  # compressed bytes fed to zstd between two checks of the output size
DECODE_STEP = 65536  # compressed bytes fed to zlib at once (what a member's end may copy as unused data)
# Gzip members or zstd frames in one body: a client sends one; each costs a decoder and a step.
MAX_PARTS = 64
# Entries in one body, counted before parsing (the tap sends PUBLISH_BATCH, 256, at most): what parsing
# and checking build is bounded by it as well as by the bytes.
MAX_ENTRIES = 10_000
# A JSON array (which cannot be counted without parsing it) larger than this must have fewer commas
# than MAX_ENTRIES; NDJSON, whose lines are counted, has no such rule.
ARRAY_UNCOUNTED_BYTES = 1 << 20
# NDJSON lines longer than this are checked to be flat objects before they are parsed (_flat); a
# shorter one builds at most a few dozen objects, ~MAX_ENTRIES x that in all.
FLAT_CHECK_FROM = 256



class BodyError(Exception):
    """The whole request is refused: ``status`` (400, 413, 415) and a reason safe to return and log."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class TooLarge(BodyError):
    """413: the body decompresses to more than the limit it was given."""


def decompress(body: bytes, encoding: str, limit: int, max_parts: int = MAX_PARTS) -> bytes:
    """The body as sent, decoded per Content-Encoding, never inflating past ``limit`` bytes.

    Linear in the body and bounded: the input goes to the decoder in steps of at most
    ``DECODE_STEP`` bytes from an offset (never a copy of the rest per gzip member or zstd frame),
    the output stops at limit + 1 bytes (a gzip bomb's ``max_length``; zstd is checked between
    steps), and a body of more than ``max_parts`` members or frames is refused (413): each costs a
    decoder and a step however little it holds (4 MiB of empty gzip members are 200,000 of them)."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc in ("gzip", "x-gzip", "deflate"):
        return _inflate(body, enc, limit, max_parts)
    if enc == "zstd":
        return _unzstd(body, limit, max_parts)
    raise BodyError(415, f"Content-Encoding {enc[:40]!r} is not supported (gzip, zstd, identity)")


def _inflate(body: bytes, enc: str, limit: int, max_parts: int) -> bytes:
    view = memoryview(body)
    out = bytearray()
    pos, parts = 0, 0
    while True:  # a gzip body may be several members one after the other (RFC 1952)
        parts += 1
        if parts > max_parts:
            raise BodyError(413, f"the {enc} body has more than {max_parts} members")
        d = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
        while not d.eof:
            if pos >= len(body):
                raise BodyError(400, f"the {enc} body is truncated")
            step = view[pos:pos + DECODE_STEP]
            try:
                out += d.decompress(step, limit + 1 - len(out))
            except zlib.error:
                raise BodyError(400, f"the body is not valid {enc}") from None
            if len(out) > limit:  # also whenever input was left unconsumed: the output reached max_length
                raise TooLarge(413, f"the decompressed body exceeds {limit} bytes")
            pos += len(step) - len(d.unused_data)
        if pos >= len(body):
            return bytes(out)


def _unzstd(body: bytes, limit: int, max_parts: int) -> bytes:
    import zstandard

    # zstd's decompressobj has no output bound, so the input goes in small steps and the output is
    # checked between them: a bomb overshoots the limit by what one step can inflate to (an RLE
    # block of 3 bytes gives 128 KiB, so ZSTD_STEP bytes give at most ~22 MiB). A frame must end:
    # a truncated one is 400.
    dctx = zstandard.ZstdDecompressor()
    parts: list[bytes] = []
    total, pos, frames = 0, 0, 0
    try:
        while pos < len(body):
            frames += 1
            if frames > max_parts:
                raise BodyError(413, f"the zstd body has more than {max_parts} frames")
            z = dctx.decompressobj()
            while not z.eof:
                if pos >= len(body):
                    raise BodyError(400, "the zstd body is truncated")
                step = body[pos:pos + ZSTD_STEP]
                chunk = z.decompress(step)
                pos += len(step) - (len(z.unused_data) if z.eof else 0)
                total += len(chunk)
                if total > limit:
                    raise TooLarge(413, f"the decompressed body exceeds {limit} bytes")
                parts.append(chunk)
    except zstandard.ZstdError:
        raise BodyError(400, "the body is not valid zstd") from None
    return b"".join(parts)


def parse(data: bytes, max_entries: int = MAX_ENTRIES) -> list[object]:
    """A JSON array of entries, or NDJSON (one entry a line; blank lines ignored), of at most
    ``max_entries`` entries -- counted before anything is parsed (413), so what parsing builds is
    bounded by the count as well as by the bytes (``{}`` is 2 bytes and a 64-byte dict)."""
    stripped = data.lstrip()
    if not stripped:
        return []
    if stripped[:1] == b"[":
        # an array's elements cannot be counted without parsing it; commas bound them from above
        # (a comma inside a string counts too), so a large array with many commas is refused
        if len(data) > ARRAY_UNCOUNTED_BYTES and data.count(b",") >= max_entries:
            raise BodyError(413, f"a JSON array over {ARRAY_UNCOUNTED_BYTES} bytes may hold more than {max_entries} "
                                 "entries: send NDJSON (one entry a line)")
        try:
            items = orjson.loads(data)
        except orjson.JSONDecodeError as exc:  # also orjson's nesting limit: deep JSON is refused here
            raise BodyError(400, f"the body is not valid JSON ({_position(exc)})") from None
        if not isinstance(items, list):
            raise BodyError(400, "the body is not a JSON array")
        if len(items) > max_entries:
            raise BodyError(413, f"more than {max_entries} entries")
        return items
    if data.count(b"\n") + (not data.endswith(b"\n")) > max_entries:
        raise BodyError(413, f"more than {max_entries} lines")
    out: list[object] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        if len(line) > FLAT_CHECK_FROM and not _flat(line):
            out.append(NOT_FLAT)  # refused as an entry, never parsed: see _flat
            continue
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise BodyError(400, f"NDJSON line {number} is not valid JSON ({_position(exc)})") from None
    return out


class NotFlat:
    """A line that is no flat object of string or integer fields, refused without being parsed."""


NOT_FLAT = NotFlat()


def _flat(line: bytes) -> bool:
    """Whether an NDJSON line can be an entry: one object, no array or object outside its strings, at
    most MAX_FIELDS fields' worth of strings -- checked on the bytes, without building anything.

    Why: one 16 MiB line ``{"a":[[],[],...]}`` parses into 5.6 million lists (577 MiB peak RSS,
    measured) before ``check_entry`` refuses its first field. Escaped backslashes and quotes are
    removed first, so every quote left opens or closes a string; the text outside the strings of a
    valid entry then holds exactly one ``{`` and no ``[``."""
    text = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    if text.count(b'"') > 4 * MAX_FIELDS + 4:
        return False
    outside = b"".join(text.split(b'"')[0::2])
    return outside.count(b"[") == 0 and outside.count(b"{") == 1


def _position(exc: orjson.JSONDecodeError) -> str:
    # orjson's message quotes no input, only what it expected and where
    return f"{str(exc.msg)[:80]} at character {exc.pos}"


@dataclass(frozen=True)
class Accepted:
    run: str
    fields: dict[bytes, bytes]
    cut: int = 0  # an oversize entry kept cut: its size as sent (the workers dead-letter it)


@dataclass(frozen=True)
class Refused:
    reason: str  # one of REFUSAL_REASONS
    detail: str


def _value(name: str, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    raise EntryError(f"field {name!r} must be a string or an integer")


def check_entry(obj: object, prefix: str, stamp: dict[str, str], max_line_bytes: int) -> Accepted | Refused:
    """One entry of a batch: its fields as they will be written, or why it is refused.

    ``stamp`` labels (from the token) replace the entry's own; ``prefix`` bounds its run key and the
    run keys it names (``parent``, ``continues``)."""
    if isinstance(obj, NotFlat):
        return Refused(INVALID, "an entry must be one JSON object of string or integer fields")
    if not isinstance(obj, dict):
        return Refused(INVALID, "an entry must be a JSON object")
    if len(obj) > MAX_FIELDS:
        return Refused(INVALID, f"more than {MAX_FIELDS} fields")
    fields: dict[bytes, bytes] = {}
    try:
        for name, value in obj.items():
            if name in DROPPED or value is None:
                continue
            if name in FORBIDDEN:
                raise EntryError(f"field {name!r} is written by workers only")
            if not name or len(name) > MAX_FIELD_NAME or not name.isprintable():
                raise EntryError(f"a field name must be 1-{MAX_FIELD_NAME} printable characters")
            if name == "line_b64":
                if "line" in obj:
                    raise EntryError("both 'line' and 'line_b64'")
                if not isinstance(value, str):
                    raise EntryError("'line_b64' must be a base64 string")
                try:
                    fields[b"line"] = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    raise EntryError("'line_b64' is not base64") from None
                continue
            fields[name.encode("utf-8")] = _value(name, value)
    except EntryError as exc:
        return Refused(INVALID, str(exc))
    for name, label in stamp.items():
        fields[name.encode()] = label.encode("utf-8")
    size = sum(len(k) + len(v) for k, v in fields.items())
    cut = 0
    if size > max_line_bytes:
        # Kept as a direct tap's would be: in the raw log (its line cut to MAX_LINE_BYTES, so what one
        # entry costs stays bounded) and dead-lettered `oversize` by the workers, who then report its
        # seq lost instead of waiting for it. Only the contract's fields are kept: over the size by
        # other fields, nothing bounded is left to keep, and it is refused.
        line = fields.get(b"line")
        if line is None or len(line) <= max_line_bytes:
            return Refused(OVERSIZE, f"{size} bytes > {max_line_bytes}")
        fields = {k: v for k, v in fields.items() if k in FIELD_ORDER}
        fields[b"line"] = line[:max_line_bytes]
        cut = size
    try:
        entry = parse_fields(fields, "0-0")
    except EntryError as exc:
        return Refused(INVALID, str(exc))
    for name, run in (("run", entry.run), ("parent", entry.parent), ("continues", entry.continues)):
        if run is not None and not run.startswith(prefix):
            return Refused(OUTSIDE_PREFIX, f"{name!r} is outside the token's prefix {prefix!r}")
    if b"ts" in fields:
        fields[b"ts"] = str(entry.ts).encode()  # Unix ms, as the taps write it (RFC 3339 accepted on input)
    ordered = {k: fields[k] for k in FIELD_ORDER if k in fields}
    ordered.update((k, v) for k, v in fields.items() if k not in ordered)
    return Accepted(entry.run, ordered, cut)
