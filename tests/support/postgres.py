"""PostgreSQL for the tests: a throw-away database per test session on 127.0.0.1:5432 (trust auth,
user postgres), a schema of its own per test, and private clusters for tests that stop the server."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from services.broker.embedded import free_port
from tests.support.needs import missing

ADMIN_DSN = os.environ.get("GOOSE_INGEST_TEST_PG_ADMIN_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1] if Path("/usr/lib/postgresql").exists() else None


def _reachable() -> str | None:
    try:
        psycopg.connect(ADMIN_DSN, connect_timeout=3).close()
        return None
    except psycopg.OperationalError as exc:
        return str(exc).splitlines()[0]


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """DSN of a database created for this test session and dropped afterwards."""
    problem = _reachable()
    if problem:
        missing(f"PostgreSQL at {ADMIN_DSN}", f"{problem}; .ci/run starts it")
    name = f"goose_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(ADMIN_DSN, dbname=name)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def pg_dsn(pg_database: str) -> Iterator[str]:
    """A DSN whose search_path is a fresh schema: every test has its own tables."""
    schema = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    yield make_conninfo(pg_database, options=f"-csearch_path={schema}")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@dataclass
class PrivateCluster:
    """A PostgreSQL server of our own (initdb in a temporary directory) that a test may stop."""

    datadir: Path
    port: int

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=3"

    def _ctl(self, *args: str) -> None:
        assert PG_BIN is not None
        done = subprocess.run([str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "60", *args],
                              capture_output=True, text=True, **_as_postgres())
        if done.returncode != 0:
            log = (self.datadir / "server.log").read_text(errors="replace")[-2000:] if (self.datadir / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl {' '.join(args[-1:])} failed: {done.stdout} {done.stderr}\n{log}")

    def start(self) -> None:
        self._ctl("-o", f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off",
                  "-l", str(self.datadir / "server.log"), "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "stop")


def _as_postgres() -> dict:
    """initdb/postgres refuse to run as root: drop to the `postgres` user when we are root."""
    if os.geteuid() != 0:
        return {}
    import pwd

    pw = pwd.getpwnam("postgres")

    def demote() -> None:
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)

    return {"preexec_fn": demote}


@contextmanager
def private_cluster(prefix: str = "goose-ingest-pg-") -> Iterator[PrivateCluster]:
    """A PostgreSQL server of our own, started, stopped (immediate) and deleted at the end."""
    if PG_BIN is None or not (PG_BIN / "initdb").exists():
        missing("/usr/lib/postgresql/*/bin/initdb", "the postgresql package")
    # Not under pytest's tmp_path: its root is 0700 (and reset so by every pytest session), which
    # the postgres user cannot enter.
    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            shutil.chown(base, "postgres", "postgres")
        datadir = base / "data"
        subprocess.run([str(PG_BIN / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                        "--no-sync"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **_as_postgres())
        cluster = PrivateCluster(datadir, free_port())
        cluster.start()
        try:
            yield cluster
        finally:
            try:
                cluster.stop("immediate")
            except RuntimeError:
                pass  # already stopped by the test
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def private_postgres() -> Iterator[PrivateCluster]:
    with private_cluster() as cluster:
        yield cluster


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
