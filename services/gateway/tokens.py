"""Gateway tokens: bearer tokens bound to a run-key prefix, stored only as SHA-256 hashes.

A token is ``gik_<id>_<secret>``: the id (12 hex digits) names its record
(``goose-ingest:token:<id>``, a hash of ``sha256``, ``prefix``, ``labels``, ``created``), so a
lookup is one HGETALL and never a scan; the secret (32 random bytes) is what proves it. The token
itself is shown once by ``tokens create`` and stored nowhere: a leak of Redis gives hashes of
256-bit random strings, which cannot be reversed or guessed.

Replicas cache each lookup (hit or miss) for ``GATEWAY_TOKEN_CACHE_S``: a revocation (the record
deleted) takes effect on every replica within that time, without a restart.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from contracts.keys import KeyLayout
from contracts.raw import RUN_KEY_PATTERN

TOKEN_PREFIX = "gik_"
_TOKEN_RE = re.compile(r"gik_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_ID_RE = re.compile(r"[0-9a-f]{12}")
_PREFIX_RE = re.compile(RUN_KEY_PATTERN)
# Labels a token may stamp on its entries: the entry labels of the contract (never run/seq/kind...).
STAMPABLE = ("host", "agent")
MAX_CACHED = 10_000  # lookups a replica remembers (bounded: cleared when full, e.g. under random ids)


@dataclass(frozen=True)
class TokenRecord:
    id: str
    prefix: str
    labels: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0
    note: str = ""

    def allows(self, run: str) -> bool:
        return run.startswith(self.prefix)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_id_of(token: str) -> str | None:
    """The id part of a well-formed token (None for anything else)."""
    m = _TOKEN_RE.fullmatch(token)
    return m.group(1) if m else None


def validate_prefix(prefix: str) -> str:
    if not prefix or not prefix.endswith("/") or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"--prefix must be a run-key prefix ending in '/' (e.g. team-a/), not {prefix!r}")
    return prefix


def _decode(token_id: str, h: dict[bytes, bytes]) -> tuple[str, TokenRecord] | None:
    try:
        labels = orjson.loads(h.get(b"labels", b"{}"))
        rec = TokenRecord(token_id, h[b"prefix"].decode(), {str(k): str(v) for k, v in labels.items()},
                          int(h.get(b"created", b"0")), h.get(b"note", b"").decode("utf-8", "replace"))
        return h[b"sha256"].decode("ascii"), rec
    except (KeyError, ValueError, AttributeError):
        return None  # a damaged record authenticates nothing


def create(client: Any, layout: KeyLayout, prefix: str, labels: dict[str, str], note: str = "") -> tuple[str, TokenRecord]:
    """A new token (returned once) and its record, stored as a hash of the token."""
    validate_prefix(prefix)
    token_id = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    rec = TokenRecord(token_id, prefix, dict(labels), time.time_ns() // 1_000_000, note)
    client.hset(layout.gateway_token(token_id), mapping={
        "sha256": token_hash(token), "prefix": prefix, "labels": orjson.dumps(rec.labels),
        "created": str(rec.created_ms), "note": note})
    client.sadd(layout.gateway_tokens(), token_id)
    return token, rec


def list_tokens(client: Any, layout: KeyLayout) -> list[TokenRecord]:
    out = []
    for raw_id in sorted(client.smembers(layout.gateway_tokens())):
        token_id = raw_id.decode("ascii", "replace")
        decoded = _decode(token_id, client.hgetall(layout.gateway_token(token_id)))
        if decoded is not None:
            out.append(decoded[1])
    return out


def revoke(client: Any, layout: KeyLayout, token_id: str) -> bool:
    """Delete a token's record (True when it existed); replicas stop accepting it within their cache TTL."""
    if not _ID_RE.fullmatch(token_id):
        return False
    existed = bool(client.delete(layout.gateway_token(token_id)))
    client.srem(layout.gateway_tokens(), token_id)
    return existed


class TokenStore:
    """The gateway's view of the tokens: one HGETALL per id per ``ttl_s``, constant-time hash compare."""

    def __init__(self, client: Any, layout: KeyLayout, ttl_s: float) -> None:
        self.client = client
        self.layout = layout
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, tuple[str, TokenRecord] | None]] = {}
        self._lock = threading.Lock()

    def cached(self, presented: str) -> tuple[bool, TokenRecord | None]:
        """``check`` from the cache alone: (True, the record or None) when it can answer, (False, None)
        when Redis must be asked (the async app calls this on its loop, ``check`` in a thread on a miss)."""
        token_id = token_id_of(presented)
        if token_id is None:
            return True, None
        with self._lock:
            hit = self._cache.get(token_id)
        if hit is None or hit[0] <= time.monotonic():
            return False, None
        return True, self._verify(presented, hit[1])

    def check(self, presented: str) -> TokenRecord | None:
        """The record of a valid, unrevoked token; None otherwise. Redis errors propagate (503)."""
        answered, rec = self.cached(presented)
        if answered:
            return rec
        token_id = token_id_of(presented)
        assert token_id is not None
        found = _decode(token_id, self.client.hgetall(self.layout.gateway_token(token_id)))
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[token_id] = (time.monotonic() + self.ttl_s, found)
        return self._verify(presented, found)

    @staticmethod
    def _verify(presented: str, found: tuple[str, TokenRecord] | None) -> TokenRecord | None:
        if found is None:
            return None
        stored_hash, rec = found
        return rec if hmac.compare_digest(stored_hash, token_hash(presented)) else None


# --- `goose-ingest tokens` -------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tokens", help="create, list and revoke ingest gateway tokens",
                       description="Gateway tokens (docs/gateway.md): each bound to a run-key prefix, stored "
                       "only as a SHA-256 hash. Needs a Redis user that may write goose-ingest:token* (admin).")
    tsub = p.add_subparsers(dest="tokens_command", required=True)
    c = tsub.add_parser("create", help="create a token; it is printed once and stored only as a hash")
    c.add_argument("--prefix", required=True, help="run keys the token may write, e.g. team-a/ or team-a/laptop-42/")
    c.add_argument("--host", default=None, help="stamp this host label on every entry (the body's host is ignored)")
    c.add_argument("--agent", default=None, help="stamp this agent label on every entry")
    c.add_argument("--note", default="", help="free text shown by `tokens list` (who, what for)")
    c.add_argument("--endpoint", default=None,
                   help="the gateway's URL as the taps reach it, for the configuration printed (default "
                        "GOOSE_INGEST_ENDPOINT, else http://<this host>:GOOSE_INGEST_GATEWAY_PORT)")
    c.add_argument("--token-file", default=None, metavar="PATH",
                   help="write the token (and its prefix) to this new file, mode 0600, instead of stdout")
    tsub.add_parser("list", help="list the tokens (id, prefix, labels, created; never the token)")
    r = tsub.add_parser("revoke", help="revoke a token by id; every replica refuses it within GATEWAY_TOKEN_CACHE_S")
    r.add_argument("id")
    p.set_defaults(func=run)


def write_token_file(path: str, token: str, prefix: str) -> None:
    """The token, then its prefix (the tap's default run key when the gateway is out of reach), in a new
    file only its owner reads."""
    import os

    from services.settings import ConfigError

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: cannot create it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"{token}\nprefix: {prefix}\n")


def tap_configuration(settings: Any, rec: TokenRecord, endpoint: str | None, token_file: str | None) -> str:
    """What to set on the agent host, exactly (stderr: the token itself is only on stdout or in the file)."""
    import socket

    url = endpoint or settings.endpoint or f"http://{socket.getfqdn()}:{settings.gateway_port}"
    path = token_file or "<the file holding the token above, mode 0600>"
    return ("tap configuration (agent host):\n"
            f"  export GOOSE_INGEST_ENDPOINT={url}\n"
            f"  export GOOSE_INGEST_TOKEN_FILE={path}\n"
            f"  goose-ingest tap -- <agent command>   # run key {rec.prefix}<host>/<ULID> (the token's prefix)")


def run(args: argparse.Namespace) -> int:
    from services.broker.connect import sync_client
    from services.settings import ConfigError, Settings

    settings = Settings()
    if not settings.redis_url:
        raise ConfigError("no broker configured: set GOOSE_INGEST_REDIS_URL")
    client = sync_client(settings)
    layout = settings.layout
    try:
        if args.tokens_command == "create":
            labels = {k: v for k, v in (("host", args.host), ("agent", args.agent)) if v}
            try:
                token, rec = create(client, layout, args.prefix, labels, args.note)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            print(f"id: {rec.id}\nprefix: {rec.prefix}\nlabels: {orjson.dumps(rec.labels).decode()}", file=sys.stderr)
            if args.token_file:
                write_token_file(args.token_file, token, rec.prefix)
            else:
                print(token)  # stdout: the token alone, once (e.g. `... > token-file`)
            print(tap_configuration(settings, rec, args.endpoint, args.token_file), file=sys.stderr)
            return 0
        if args.tokens_command == "list":
            found = list_tokens(client, layout)
            if not found:
                print("goose-ingest tokens: no tokens (create one with `goose-ingest tokens create --prefix team-a/`)",
                      file=sys.stderr)
                return 0
            print("ID\tPREFIX\tLABELS\tCREATED\tNOTE")  # tab-separated as the rows: `column -t -s $'\t'`
            for rec in found:
                created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.created_ms / 1000))
                print(f"{rec.id}\t{rec.prefix}\t{orjson.dumps(rec.labels).decode()}\t{created}\t{rec.note}")
            return 0
        if revoke(client, layout, args.id):
            print(f"revoked {args.id}", file=sys.stderr)
            return 0
        print(f"goose-ingest: no token with id {args.id!r}", file=sys.stderr)
        return 1
    finally:
        client.close()
