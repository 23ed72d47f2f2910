"""The archive inside `goose-ingest up` (docs/archive.md "Locally"): a thread beside the worker that
writes to GOOSE_INGEST_ARCHIVE_URL, or, when none is set, to a folder beside the tap's spool
(`~/.local/state/goose-ingest/archive`), so a local pipeline keeps its history like a deployed one.

It shares the worker's process, not its metrics port (one port per process): its state shows in the
log. It stops with the process, writing what it has read; the rest stays pending and is archived
on the next `up` (what the folder holds already is not written again). It takes the archive lease
of its group like `goose-ingest archive` (a second archive of the group: exit 2) and always adopts
its folder's deployment id (an embedded broker is new at every `up`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.settings import Settings
from services.streams.lag import read_backlog_sync

if TYPE_CHECKING:
    from services.archive.consumer import Archiver

log = logging.getLogger("goose_ingest.archive")


def local_archive_url(settings: Settings) -> str:
    """ARCHIVE_URL, else `file://` of `archive/` beside the spool directory."""
    if settings.archive_url:
        return settings.archive_url
    return (Path(settings.spool_dir).expanduser().parent / "archive").resolve().as_uri()


@dataclass
class LocalArchive:
    thread: threading.Thread
    archiver: Archiver

    def stop(self, timeout: float = 30.0) -> None:
        self.archiver.stop()
        self.thread.join(timeout)

    def backlog(self) -> tuple[int, int] | None:
        """(unread, pending) entries of the archived streams for its group (the skeleton's one lag
        rule, services/streams/lag.py); None while its group does not exist on every stream yet."""
        unread = pending = 0
        for src in self.archiver.all:
            b = read_backlog_sync(self.archiver.client, src.stream, self.archiver.group)
            if b.missing:
                return None
            unread, pending = unread + (b.lag or 0), pending + b.pending
        return unread, pending

    def finish(self, timeout: float) -> int:
        """A one-shot command's end (`demo`): wait until the archive has read everything, then stop it,
        which writes what it read (flush_on_stop). Returns how many entries stay unarchived (pending
        or unread: rewritten on the next start against the same broker), -1 when that is unknown."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self._backlog_or_none() or (1, 0))[0] != 0:
            time.sleep(0.1)
        self.stop(timeout=max(1.0, deadline - time.monotonic()))
        left = self._backlog_or_none()
        return -1 if left is None else sum(left)

    def _backlog_or_none(self) -> tuple[int, int] | None:
        try:
            return self.backlog()
        except Exception:  # noqa: BLE001 - a broker hiccup: not known (waited for, or reported as -1)
            return None


def archives_here(settings: Settings, embedded: bool) -> bool:
    """Whether `up`/`demo` archive in-process: with their own embedded broker, or when
    GOOSE_INGEST_ARCHIVE_URL says where. On a configured broker without one, the archive group may be
    a deployment's `goose-ingest archive`: a local thread in that group would take its entries into a
    folder on this machine, a gap in the deployment's log of record."""
    return embedded or bool(settings.archive_url)


def start_local_archive(settings: Settings) -> tuple[Settings, LocalArchive]:
    """Settings with the archive's URL (the worker's raw trim then waits for it) and the running
    archive thread. ConfigError for a URL the store refuses (as `goose-ingest archive` would)."""
    from services.archive.consumer import Archiver
    from services.archive.fence import Lease, check_deployment, process_name
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import StoreError, open_store
    from services.broker.connect import sync_client

    settings = settings.model_copy(update={"archive_url": local_archive_url(settings)})
    store = open_store(settings)
    assert store is not None
    client = sync_client(settings)
    consumer = process_name()
    archiver = Archiver(settings, client, store, ArchiveMetrics(), consumer)
    lease = Lease(client, settings.layout.archive_lease(archiver.group), f"{consumer}/{os.urandom(4).hex()}")
    lease.acquire(archiver.group)  # ArchiveBusy (exit 2): an archive of this group runs already
    try:
        store.check()
        # The local folder is this machine's: an embedded broker is new at every `up`, so it adopts it.
        deployment = check_deployment(client, store, settings.layout.archive_identity(archiver.group),
                                      settings.namespace, archiver.group, adopt=True)
        archiver.start(lease, deployment)
    except StoreError as exc:
        archiver.store_unavailable(exc)
        archiver.lease = lease
        lease.start()
        log.warning("%s; will keep trying", exc)
    thread = threading.Thread(target=archiver.run, name="archive", daemon=True)
    thread.start()
    log.info("archiving to %s", store.describe())
    return settings, LocalArchive(thread, archiver)
