"""Shared fixtures: a real Redis broker for the whole session, an isolated namespace per test."""

from __future__ import annotations

import fcntl
import sys
import tempfile
from pathlib import Path
from uuid import uuid4

import pytest

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # `tests.support` importable however pytest is started
    sys.path.insert(0, str(_ROOT))

from services.broker.embedded import EmbeddedRedis, start_redis  # noqa: E402
from services.settings import Settings  # noqa: E402
from tests.support.redis_cluster import cluster_settings, redis_cluster  # noqa: E402,F401 (fixtures)
from tests.support.redis_server import choose_broker, wipe_namespace  # noqa: E402

pytest_plugins = ["tests.support.file_order"]  # longest files first under pytest-xdist


@pytest.fixture(scope="session")
def redis_broker():
    """The session's broker: env REDIS_URL, else testcontainers (if Docker answers), else embedded."""
    broker = choose_broker()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def redis_url(redis_broker) -> str:
    return redis_broker.url


@pytest.fixture
def settings(redis_url: str, tmp_path: Path):
    """Settings on the session broker with a namespace of its own; its keys are deleted afterwards."""
    s = Settings(
        redis_url=redis_url,
        namespace=f"t{uuid4().hex[:10]}",
        shards=2,
        spool_dir=str(tmp_path / "spool"),
        host_label="test-host",
    )
    yield s
    wipe_namespace(redis_url, s.namespace)


@pytest.fixture
def private_redis(tmp_path: Path):
    """A dedicated redis-server (for tests that stop/kill/restart it), whatever REDIS_URL says."""
    server: EmbeddedRedis = start_redis(dir=str(tmp_path / "private-redis"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture()
def fixture_db(tmp_path: Path) -> Path:
    """The shared sessions.db fixture (SQL) loaded into a fresh SQLite file."""
    import sqlite3

    from tests.support.fixtures import FIXTURES

    path = tmp_path / "sessions.db"
    conn = sqlite3.connect(path)
    conn.executescript((FIXTURES / "a-read-edit-test-finish.sessions-db.sql").read_text("utf-8"))
    conn.close()
    return path


@pytest.fixture(autouse=True)
def _default_ports_alone(request):
    """A test marked `default_ports` holds a machine-wide lock while it runs: two pytest-xdist
    workers (or two pytest sessions) must not both bind a command's fixed default port."""
    if request.node.get_closest_marker("default_ports") is None:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "goose-ingest-tests-default-ports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
