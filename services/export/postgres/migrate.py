"""Versioned schema migrations: `migrations/NNNN_name.sql`, applied in order, each exactly once.

`schema_migrations` records each applied version with the SHA-256 of its file; a file that
changed after it was applied is an error (never edit a shipped migration: add the next one).
Each migration runs in its own transaction under an advisory lock, so sinks started together
apply it once and a failed migration leaves nothing half-done.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any constant of our own: pg_advisory_xact_lock(key) serialises the sinks' migrations.
_LOCK_KEY = 0x600_5E_1D6E5


class MigrationError(RuntimeError):
    """The database's schema history does not match the shipped migrations."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def shipped() -> list[Migration]:
    """The migrations shipped in the package, in version order."""
    out: list[Migration] = []
    for item in resources.files("services.export.postgres").joinpath("migrations").iterdir():
        m = _FILE.match(item.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), item.read_text("utf-8")))
    out.sort(key=lambda mig: mig.version)
    if [mig.version for mig in out] != list(range(1, len(out) + 1)):
        raise MigrationError(f"migration versions must be 1..N without gaps: {[mig.version for mig in out]}")
    return out


LATEST = len(shipped())


def applied(conn: psycopg.Connection) -> dict[int, str]:
    """version -> checksum of what this database has applied (empty for a fresh one)."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())


def migrate(conn: psycopg.Connection, target: int | None = None) -> list[Migration]:
    """Apply the shipped migrations up to `target` (default: all) that are not applied yet."""
    todo: list[Migration] = []
    done: list[Migration] = []
    for mig in shipped():
        if target is not None and mig.version > target:
            break
        todo.append(mig)
    for mig in todo:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            have = applied(conn)
            if mig.version in have:
                if have[mig.version] != mig.checksum:
                    raise MigrationError(
                        f"migration {mig.version:04d}_{mig.name} changed after it was applied (checksum mismatch)"
                    )
                continue
            conn.execute(mig.sql.encode("utf-8"))
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (mig.version, mig.name, mig.checksum),
            )
            done.append(mig)
    have = applied(conn)
    unknown = sorted(v for v in have if v > LATEST)
    if unknown:
        raise MigrationError(f"the database has migrations this version does not know: {unknown} (newer sink?)")
    return done
