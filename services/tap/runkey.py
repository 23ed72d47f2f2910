"""Run keys: validation, and generated keys ``<host>/<ULID>`` (sortable by start time, unique)."""

from __future__ import annotations

import os
import re
import secrets
import socket
import time

from contracts.raw import RUN_KEY_PATTERN  # the one definition of a run key

RUN_KEY_RE = re.compile(RUN_KEY_PATTERN)
RUN_KEY_RULE = "1-200 characters of A-Z a-z 0-9 . _ : / @ -"
_HOST_BAD = re.compile(r"[^A-Za-z0-9._:@-]+")  # no '/' inside the host part
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def is_valid_run(run: str) -> bool:
    return isinstance(run, str) and RUN_KEY_RE.fullmatch(run) is not None


def validate_run(run: str) -> str:
    if not is_valid_run(run):
        raise ValueError(f"invalid run key {run!r}: must be {RUN_KEY_RULE}")
    return run


def ulid(ts_ms: int | None = None, randomness: bytes | None = None) -> str:
    """26-char Crockford base32 ULID: 48-bit Unix-ms timestamp, then 80 random bits."""
    if ts_ms is None:
        ts_ms = time.time_ns() // 1_000_000
    if not 0 <= ts_ms < (1 << 48):
        raise ValueError("ULID timestamp out of range")
    rnd = randomness if randomness is not None else secrets.token_bytes(10)
    if len(rnd) != 10:
        raise ValueError("ULID randomness must be 10 bytes")
    value = (ts_ms << 80) | int.from_bytes(rnd, "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def host_label(configured: str | None = None) -> str:
    """The configured label, else the hostname, reduced to run-key characters (no '/')."""
    raw = configured or socket.gethostname() or os.environ.get("HOSTNAME", "") or "host"
    label = _HOST_BAD.sub("-", raw).strip("-")[:100]
    return label or "host"


def new_run_key(host: str | None = None) -> str:
    return f"{host_label(host)}/{ulid()}"
