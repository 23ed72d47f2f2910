"""The archive as the readers (`replay --source archive`, `reprocess`) open it: reading never creates
it, and an archive that is not there is one line (exit 2), not "0 runs rebuilt".

A `file://` folder that does not exist is a typo or another machine's path (a writer creates its folder;
`open_store` does so for the writers). With no broker to read beside it, an archive holding no raw
segment has nothing to give either (docs/archive-replay.md, "Without a broker").
"""

from __future__ import annotations

import os

from services.archive.segments import RAW_PREFIX
from services.archive.store import ArchiveStore, StoreError, open_store, parse_store_url
from services.settings import ConfigError, Settings


def open_for_reading(settings: Settings, *, alone: bool) -> ArchiveStore | None:
    """The store of GOOSE_INGEST_ARCHIVE_URL (None when unset). `alone`: no broker is read beside it,
    so an archive without raw segments is refused too. ConfigError: one line, the command's name
    is put in front by services/cli.py."""
    if not settings.archive_url:
        return None
    url = parse_store_url(settings.archive_url)
    if url.scheme == "file" and not os.path.isdir(url.location):
        raise ConfigError(f"the archive {url.describe()} does not exist (no such folder; `up` and "
                          "`demo` archive beside the spool, see docs/archive.md \"Locally\")")
    store = open_store(settings)
    assert store is not None
    if alone:
        try:
            segments = store.list(f"{RAW_PREFIX}/")
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
        if not segments:
            raise ConfigError(f"the archive {store.describe()} holds no raw log segment, and no "
                              "broker is configured (GOOSE_INGEST_REDIS_URL) to read instead: nothing to rebuild")
    return store
