"""Helpers for the tests of replay, reprocessing and the lake over the archive (tests/test_archive_replay*.py,
tests/test_reprocess*.py, tests/archive/test_lake_analytics.py).

`start_archive_process` runs the real `goose-ingest archive`; `archive_from_redis` writes what Redis
holds with the same format functions (services/archive/segments.py) through the same store client,
in small segments of a chosen size, for the tests that want many objects (a corrupt one among
them) without waiting for cuts; `goose-ingest archive` itself is tested by tests/test_archive*.py.
`trim_to` then plays a short Redis retention: what the archive holds is gone from Redis.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.archive.segments import (
    ArchivedEntry,
    TopicEntry,
    encode_event_rows,
    encode_raw_segment,
    raw_segment_key,
)
from services.archive.store import ArchiveStore, open_store
from services.broker.connect import sync_client
from services.settings import Settings
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import REPO
from tests.support.redis_server import cli_env


def file_store(settings: Settings, directory: Path) -> tuple[str, ArchiveStore]:
    url = f"file://{directory}"
    store = open_store(settings.model_copy(update={"archive_url": url}))
    assert store is not None
    return url, store


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def archive_from_redis(settings: Settings, store: ArchiveStore, segment: int = 40) -> list[str]:
    """Raw and control streams as raw segments, topics as the event lake; the keys written."""
    r = sync_client(settings)
    layout = settings.layout
    keys: list[str] = []
    for kind, streams in (("raw", layout.raw_streams()), ("control", layout.control_streams())):
        for shard, stream in enumerate(streams):
            entries = [ArchivedEntry(shard, kind, sid.decode(), dict(fields)) for sid, fields in r.xrange(stream)]
            for chunk in _chunks(entries, segment):
                key = raw_segment_key(kind, shard, chunk[0].id, chunk[-1].id)
                store.put(key, encode_raw_segment(chunk))
                keys.append(key)
    for shard, stream in enumerate(layout.events_partitions()):
        events = [TopicEntry(shard, sid.decode(), fields) for sid, fields in r.xrange(stream)]
        for chunk in _chunks(events, segment):
            for obj in encode_event_rows(chunk, []).objects:
                store.put(obj.key, obj.data)
                keys.append(obj.key)
    for shard, stream in enumerate(layout.runs_partitions()):
        records = [TopicEntry(shard, sid.decode(), fields) for sid, fields in r.xrange(stream)]
        for chunk in _chunks(records, segment):
            for obj in encode_event_rows([], chunk).objects:
                store.put(obj.key, obj.data)
                keys.append(obj.key)
    return keys


def trim_to(settings: Settings, min_id: str, topics: bool = True) -> int:
    """XTRIM MINID every raw and control stream (and the topics): a short retention. Entries removed."""
    r = sync_client(settings)
    layout = settings.layout
    streams = [*layout.raw_streams(), *layout.control_streams()]
    if topics:
        streams += [*layout.events_partitions(), *layout.runs_partitions()]
    return sum(int(r.xtrim(s, minid=min_id)) for s in streams)


def publish_runs(settings: Settings, runs: dict[str, Path]) -> None:
    """Each run through the real `goose-ingest publish` CLI (which ends it with an eof)."""
    procs = [subprocess.Popen([sys.executable, "-m", "services.cli", "publish", "--run", run, str(path)], cwd=REPO,
                              env=cli_env(settings), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for run, path in runs.items()]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode(errors="replace")


def runs_of(prefix: str) -> dict[str, Path]:
    return {f"{prefix}/{path.stem}": path for path in TRANSCRIPTS}


def cli(settings: Settings, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """`goose-ingest ARGS` as a real process against the test's broker and namespace."""
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=cli_env(settings, **env),
                          capture_output=True, text=True, timeout=timeout)


def start_archive_process(settings: Settings, url: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """The real `goose-ingest archive` (services/archive/consumer.py), cutting segments every 0.5 s."""
    full = cli_env(settings, GOOSE_INGEST_ARCHIVE_URL=url, GOOSE_INGEST_METRICS_PORT="0",
                   GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S="0.5", GOOSE_INGEST_SWEEP_INTERVAL_S="0.5", **env)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.cli", "archive"], cwd=REPO, env=full, stdout=out,
                                stderr=subprocess.STDOUT)


def archived_everything(settings: Settings) -> bool:
    """The archive's group has read and acknowledged every entry of every stream it archives."""
    r = sync_client(settings)
    layout = settings.layout
    for stream in [*layout.raw_streams(), *layout.control_streams(), *layout.events_partitions(), *layout.runs_partitions()]:
        try:
            groups = r.xinfo_groups(stream)
        except Exception:  # the stream does not exist (yet): nothing of it to archive
            continue
        info = next((g for g in groups if g["name"].decode() == settings.archive_group), None)
        if info is None or info["pending"] or info["lag"]:
            return False
    return True
