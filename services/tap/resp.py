"""Hand-built RESP for the tap's one hot command: a pipeline of XADDs built straight from spool records.

Why: redis-py builds every XADD through its command layer (argument checks, per-argument encoding, a
Python list per command, then its serializer), which cost the tap more CPU per line than everything
else it does. A spool record already holds the entry's fields in their final order, so the command's
bytes can be written in one pass. ``tests/tap/test_tap.py`` proves the bytes equal redis-py's
``pipe.xadd(stream, fields)`` for the same fields and that a real Redis stores identical entries.

Pure functions only (no I/O): the publisher owns the socket.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping

import orjson

from services.tap.spool import SRC_TAG

_XADD_HEAD = b"$4\r\nXADD\r\n"
_AUTO_ID = b"$1\r\n*\r\n"


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def command(*args: bytes) -> bytes:
    """One RESP array of bulk strings (a command as redis-py would send it)."""
    return b"*%d\r\n" % len(args) + b"".join(bulk(a) for a in args)


def xadd(stream: bytes, fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``XADD stream * k1 v1 k2 v2 ...`` with fields in the given order."""
    parts = [bulk(stream), _AUTO_ID]
    n = 0
    for key, value in fields:
        parts.append(b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(key), key, len(value), value))
        n += 1
    return b"*%d\r\n" % (3 + 2 * n) + _XADD_HEAD + b"".join(parts)


def record_fields(rec: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The stream fields of a decoded spool record: what ``spool.decode_record`` gives, as bytes pairs.

    ``line_b64`` goes out as ``line`` with the original bytes; the local ``_src`` tag is never sent."""
    out = []
    for key, value in rec.items():
        if key == "line":
            out.append((b"line", value.encode("utf-8")))
        elif key == "line_b64":
            out.append((b"line", base64.b64decode(value)))
        elif key != SRC_TAG:
            out.append((key.encode("utf-8"), value.encode("utf-8")))
    return out


def xadd_commands(stream: bytes, raws: Iterable[bytes]) -> list[bytes]:
    """The XADD command of each raw spool record, in order."""
    loads = orjson.loads
    return [xadd(stream, record_fields(loads(raw))) for raw in raws]


def xadd_records(stream: bytes, raws: Iterable[bytes]) -> bytes:
    """The pipeline (concatenated XADD commands) for raw spool records, in order."""
    return b"".join(xadd_commands(stream, raws))
