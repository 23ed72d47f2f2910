"""One archive per consumer group, and one deployment per archive store (issue 32, docs/archive.md
"Guarantees").

**The lease.** A key per archive group (`KeyLayout.archive_lease`) holds the token of the one
archive process that may read and acknowledge in that group, with a TTL (LEASE_TTL_MS) renewed
every third of it by a thread of its own (a store write can take longer than a TTL). At start:

- free: taken (SET NX PX);
- held: the holder is watched for one TTL. A live holder renews it (its remaining time goes up):
  the newcomer is refused with one line (`ArchiveBusy`, exit 2), within a third of a TTL. A dead
  holder (SIGKILL, a lost node) renews nothing, the key expires, the newcomer takes it.

A holder that finds the key gone (Redis restarted empty, flushed, rolled back to before it took
it) takes it again and reports it (`renew` returns RETAKEN: the caller checks the broker). One that
finds another token there lost it (it was partitioned for a TTL and a successor started): it is
FENCED and stops before acknowledging anything more. What it may still write is harmless: objects
are created, never replaced (services/archive/segments.py), and every reader keeps one copy per
stream id.

**The deployment id.** A random id per archive group, in Redis (`KeyLayout.archive_identity`) and
in the store (`DEPLOYMENT_KEY`, created once, never replaced). An archive whose broker's id differs
from the store's is writing into another deployment's archive: refused, one line, exit 2. A broker
without an id (new, or restarted empty) facing a store that has one is refused too, unless the
operator says it is the same deployment (`--adopt-store`; `up`'s local archive always adopts its
own folder): a running archive keeps its id in memory and writes it back itself after its broker
restarted empty, so only a cold start of both needs the flag.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from services.archive.store import ArchiveStore, StoreError
from services.settings import ConfigError

log = logging.getLogger("goose_ingest.archive")

LEASE_TTL_MS = 10_000
DEPLOYMENT_KEY = "_goose-ingest/deployment.json"  # outside raw/, events/, runs/: no reader takes it for data

HELD, RETAKEN, LOST = 1, 2, 0
# KEYS[1] the lease, ARGV[1] our token, ARGV[2] the TTL: renew ours, take it again when it is gone.
_RENEW = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end
return 0
"""


class ArchiveBusy(ConfigError):
    """Another live archive holds the group's lease (one line, exit 2)."""


def process_name() -> str:
    """A consumer name of this process: host and pid (unique among live processes of one host)."""
    return f"archive-{socket.gethostname()[:40]}-{os.getpid()}"


def _s(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class Lease:
    def __init__(self, client: Any, key: str, token: str, ttl_ms: int = LEASE_TTL_MS) -> None:
        self.client = client
        self.key = key
        self.token = token
        self.ttl_ms = ttl_ms
        self.fenced = threading.Event()
        self.retaken = threading.Event()  # the key was gone once: the caller checks the broker
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew: Any = None

    def acquire(self, group: str, sleep: Callable[[float], None] = time.sleep) -> None:
        """Take the lease, waiting at most one TTL for a dead holder's to expire; ArchiveBusy if a
        live holder renews it meanwhile."""
        deadline = time.monotonic() + self.ttl_ms / 1000 + 1.0
        last_ttl: int | None = None
        while True:
            if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                return
            holder = _s(self.client.get(self.key))
            ttl = int(self.client.pttl(self.key))
            if holder is not None and last_ttl is not None and ttl > last_ttl + 200:
                raise ArchiveBusy(f"another archive is running on group {group!r} ({holder}, lease renewed): "
                                  "one archive per group; stop it first (docs/archive.md \"Guarantees\")")
            if time.monotonic() > deadline:
                raise ArchiveBusy(f"the archive lease of group {group!r} is held by {holder} and did not expire "
                                  f"within {self.ttl_ms / 1000:.0f}s: another archive is running; stop it first")
            if ttl > 0:
                last_ttl = ttl
            sleep(0.25)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="archive-lease", daemon=True)
        self._thread.start()

    def renew(self) -> int:
        if self._renew is None:
            self._renew = self.client.register_script(_RENEW)
        result = int(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))
        if result == LOST and not self.fenced.is_set():
            holder = _s(self.client.get(self.key))
            log.error("archive lease lost to %s (this process was cut off for longer than %.0fs): stopping without "
                      "acknowledging anything more", holder, self.ttl_ms / 1000)
            self.fenced.set()
        elif result == RETAKEN:
            log.warning("archive lease was gone from the broker (restarted, flushed or rolled back): taken again")
            self.retaken.set()
        return result

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if self.renew() == LOST:
                    return
            except Exception as exc:  # noqa: BLE001 - a broker outage: the main loop reports it; try again
                log.debug("archive lease renewal failed: %s", exc)

    def release(self) -> None:
        """On a clean stop: give the lease up (only ours), so a successor starts at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self.fenced.is_set():
            return
        try:
            self.client.eval("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
                             "return 0", 1, self.key, self.token)
        except Exception as exc:  # noqa: BLE001 - it expires by itself
            log.debug("archive lease not released: %s", exc)


def check_deployment(client: Any, store: ArchiveStore, key: str, namespace: str, group: str,
                     adopt: bool = False) -> str:
    """The deployment id shared by the broker and the store (made when both have none); ConfigError
    (one line, exit 2) when the store is another deployment's. See the module docstring."""
    mine = _s(client.get(key))
    theirs = _read_deployment(store)
    if theirs is None:
        if mine is None:
            fresh = uuid.uuid4().hex
            client.set(key, fresh, nx=True)
            mine = _s(client.get(key)) or fresh
        record = orjson.dumps({"deployment": mine, "namespace": namespace, "group": group})
        if not store.create(DEPLOYMENT_KEY, record):  # another one made it meanwhile: compare with it
            return check_deployment(client, store, key, namespace, group, adopt)
        return mine
    other, their_ns = theirs
    where = store.describe()
    if mine is None:
        if adopt and their_ns == namespace:
            client.set(key, other, nx=True)
            log.warning("the broker had no archive id (new or restarted empty): adopting the store's (%s)", other[:8])
            return other
        raise ConfigError(f"archive store {where} belongs to deployment {other[:8]} (namespace {their_ns!r}) and this "
                          f"broker has no archive id: if it is that deployment's broker restarted empty, start once with "
                          f"--adopt-store; otherwise give this deployment its own archive URL")
    if mine != other:
        raise ConfigError(f"archive store {where} is already written by another deployment's archive ({other[:8]}, "
                          f"this broker's is {mine[:8]}): give each deployment its own archive URL")
    return mine


def restore_deployment(client: Any, key: str, deployment: str) -> None:
    """A running archive puts its id back after its broker lost it (restarted empty, flushed)."""
    client.set(key, deployment, nx=True)


def _read_deployment(store: ArchiveStore) -> tuple[str, str] | None:
    if not store.exists(DEPLOYMENT_KEY):
        return None
    try:
        doc = orjson.loads(store.get(DEPLOYMENT_KEY))
        return str(doc["deployment"]), str(doc.get("namespace", ""))
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"archive store {store.describe()}: {DEPLOYMENT_KEY} is not an archive's "
                          f"deployment record ({exc})") from None
    except StoreError:
        raise
