"""The archive inside `goose-ingest up` (docs/archive.md "Locally"): a thread beside the worker that
writes to GOOSE_INGEST_ARCHIVE_URL, or, when none is set, to a folder beside the tap's spool
(`~/.local/state/goose-ingest/archive`), so a local pipeline keeps its history like a deployed one.

It shares the worker's process, not its metrics port (one port per process): its state shows in the
log. It stops with the process, writing what it has read; the rest stays pending and is rewritten
under the same names on the next `up`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.settings import Settings

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


def start_local_archive(settings: Settings) -> tuple[Settings, LocalArchive]:
    """Settings with the archive's URL (the worker's raw trim then waits for it) and the running
    archive thread. ConfigError for a URL the store refuses (as `goose-ingest archive` would)."""
    from services.archive.consumer import Archiver
    from services.archive.metrics import ArchiveMetrics
    from services.archive.store import StoreError, open_store
    from services.broker.connect import sync_client

    settings = settings.model_copy(update={"archive_url": local_archive_url(settings)})
    store = open_store(settings)
    assert store is not None
    archiver = Archiver(settings, sync_client(settings), store, ArchiveMetrics())
    try:
        store.check()
    except StoreError as exc:
        archiver.store_unavailable(exc)
        log.warning("%s; will keep trying", exc)
    thread = threading.Thread(target=archiver.run, name="archive", daemon=True)
    thread.start()
    log.info("archiving to %s", store.describe())
    return settings, LocalArchive(thread, archiver)
