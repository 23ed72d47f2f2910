"""Replay and reprocess over an archive on the S3 HTTP API (moto_server on loopback), written by the real
`goose-ingest archive` process, every component under its own ACL user (tap, worker, goose-archive;
replay and reprocess as admin; the reprocessed topics read by the consumer role), Redis then emptied
as a short retention would."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.archive.test_archive import archive_done, start_archive
from tests.archive.test_archive import stop as stop_archive
from tests.broker.test_acl import AclBroker, acl_broker  # noqa: F401 (fixture)
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import REPO, wait_until
from tests.support.s3_server import TEST_BUCKET as BUCKET
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.e2e



def _ended(b: AclBroker) -> set[str]:
    admin = b.client("admin")
    return {f[b"runId"].decode() for s in b.settings.layout.runs_partitions() for _, f in admin.xrange(s)
            if f[b"state"] in (b"ended", b"abandoned")}


def test_replay_and_reprocess_from_s3_after_redis_let_everything_go(acl_broker: AclBroker, s3: S3Server, tmp_path: Path):  # noqa: F811
    b = acl_broker
    url = f"s3://{BUCKET}/fleet"
    runs = {f"s3replay/{p.stem}": p for p in TRANSCRIPTS}
    with open(tmp_path / "worker.log", "ab") as out:
        worker = subprocess.Popen([sys.executable, "-m", "services.cli", "worker"], cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT,
                                  env=b.env("worker", GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_BATCH_SIZE="50"))
    archive, _ = start_archive(b, tmp_path, url, **s3.env())
    try:
        for run, path in runs.items():
            done = b.cli("tap", "publish", "--run", run, str(path))
            assert done.returncode == 0, done.stderr
        wait_until(lambda: set(runs) <= _ended(b), timeout=120)
        wait_until(lambda: archive_done(b.root(), b), timeout=120)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        assert stop_archive(archive) == 0, (tmp_path / "archive.log").read_text()[-2000:]
    root = b.root()
    layout = b.settings.layout
    live_events = sum(root.xlen(s) for s in layout.events_partitions())
    everything = f"{int(time.time() * 1000) + 1}-0"
    for stream in [*layout.raw_streams(), *layout.control_streams(), *layout.events_partitions(), *layout.runs_partitions()]:
        root.xtrim(stream, minid=everything)
    assert sum(root.xlen(s) for s in layout.raw_streams()) == 0

    replay = b.cli("admin", "replay", "--quiet", GOOSE_INGEST_ARCHIVE_URL=url, **s3.env())
    assert replay.returncode == 0, replay.stdout + replay.stderr
    m = re.search(r"(\d+) runs? rebuilt from the raw log, (\d+) differ", replay.stdout)
    assert m and (int(m.group(1)), int(m.group(2))) == (len(runs), 0), replay.stdout

    day = time.strftime("%Y-%m-%d", time.gmtime())
    reprocess = b.cli("admin", "reprocess", "--since", day, GOOSE_INGEST_ARCHIVE_URL=url, **s3.env())
    assert reprocess.returncode == 0, reprocess.stdout + reprocess.stderr
    assert f"{len(runs)} runs rebuilt" in reprocess.stdout
    # The reprocessed topics sit under the live names: the read-only consumer role may read them.
    reader = b.client("consumer")
    base = layout.key("harness.events.reprocessed")
    assert reader.xlen(base) == live_events
    assert not [d for d in b.denials() if "reprocessed" in str(d.get("object", ""))]

    # A store that cannot be reached: one line naming it, exit 2, for both commands.
    gone = s3.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{_closed_port()}", GOOSE_INGEST_ARCHIVE_STORE_TIMEOUT_S="3")
    for args in (["replay"], ["reprocess", "--since", day]):
        failed = b.cli("admin", *args, GOOSE_INGEST_ARCHIVE_URL=url, **gone)
        assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
        assert f"s3://{BUCKET}/fleet" in failed.stderr and "Traceback" not in failed.stderr


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
