"""Per-run write-ahead spool of raw entries (see docs/raw-entries.md, "Spool").

Layout: ``<spool_dir>/<namespace>/<run>/`` (both names escaped to ``[A-Za-z0-9_-]`` plus ``%XX``) with

- ``entries.jsonl``: every entry ever assigned for the run, one JSON object a line, in seq order, appended
  (and flushed to the OS) before it is sent. Its line count is the next seq.
- ``sent``: how many leading entries of the log the broker confirmed (a fixed-width number, rewritten in place
  per batch; see ``Spool.mark_sent``).
- ``lock``: flock'ed by the one process publishing the run.

A line that is valid UTF-8 is stored as ``"line"``; any other bytes as ``"line_b64"``. ``"_src"`` is a local
resume tag (which input a line came from), never sent.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Any

import orjson

from services.settings import Settings

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

LOG = "entries.jsonl"
REFUSED_DIR = "refused"  # <spool_dir>/<namespace>/refused/<run>.jsonl: entries a gateway refused for good
SENT = "sent"
LOCK = "lock"
SRC_TAG = "_src"
SENT_WIDTH = 20  # digits of the `sent` count (fits any seq; see Spool.mark_sent)


class SpoolLocked(RuntimeError):
    """Another process is publishing this run (its spool is locked)."""


class SpoolCorrupt(RuntimeError):
    pass


def _escape(name: str) -> str:
    return "".join(c if (c.isascii() and (c.isalnum() or c in "_-")) else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def spool_path(settings: Settings, run: str) -> Path:
    root = Path(os.path.expanduser(settings.spool_dir))
    ns = _escape(settings.namespace) if settings.namespace else "%40default"
    return root / ns / _escape(run)


def refused_path(settings: Settings, run: str) -> Path:
    return spool_path(settings, run).parent / REFUSED_DIR / (_escape(run) + ".jsonl")


def _open_in_new_dir(directory: Path, name: str, attempts: int = 5) -> Any:
    """Create `directory` (and its parents) and open `name` in it for appending, in binary.

    Another tap finishing its run removes the namespace directory when it became empty
    (`Spool.close`, `discard`): between our mkdir of it and of the run's own directory (or the open)
    it can be gone again, a FileNotFoundError that is only that race. Tried again a few times; a
    directory that cannot be made at all still raises."""
    for attempt in range(attempts):
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            return open(directory / name, "a+b")
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def keep_refused(settings: Settings, record: bytes, reason: str) -> Path | None:
    """Keep an entry the gateway refused for good, with the reason, beside the spool (``spool`` lists it,
    ``spool --discard RUN`` deletes it): the run's spool itself goes when the run is delivered."""
    try:
        rec = orjson.loads(record)
        run = str(rec["run"])
        path = refused_path(settings, run)
        with _open_in_new_dir(path.parent, path.name) as fh:
            fh.write(orjson.dumps({"reason": reason[:300], "entry": rec}, option=orjson.OPT_APPEND_NEWLINE))
        return path
    except (orjson.JSONDecodeError, KeyError, TypeError, OSError):
        return None


def encode_record(fields: dict[str, Any], src: str | None = None) -> bytes:
    rec: dict[str, str] = {}
    for k, v in fields.items():
        if k == "line" and isinstance(v, (bytes, bytearray)):
            try:
                rec["line"] = bytes(v).decode("utf-8")
            except UnicodeDecodeError:
                rec["line_b64"] = base64.b64encode(v).decode("ascii")
        else:
            rec[k] = v
    if src is not None:
        rec[SRC_TAG] = src
    return orjson.dumps(rec) + b"\n"


def decode_record(raw: bytes) -> dict[str, Any]:
    """Field map to XADD (``line`` as bytes); the local ``_src`` tag is dropped."""
    rec = orjson.loads(raw)
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if k == SRC_TAG:
            continue
        if k == "line":
            out["line"] = v.encode("utf-8")
        elif k == "line_b64":
            out["line"] = base64.b64decode(v)
        else:
            out[k] = v
    return out


class Spool:
    """Opens (and locks) a run's spool, recovering it when it already exists."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_file = _open_in_new_dir(self.path, LOCK)
        if fcntl is not None:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lock_file.close()
                raise SpoolLocked(f"another process is publishing this run (spool {self.path} is locked)") from None
        self.count = 0  # entries in the log = next seq
        self.finished = False  # the log ends with an eof entry
        self.by_source: dict[str, int] = {}
        self._recover()
        self.sent = min(max(self._read_sent(), 0), self.count)
        self._writer = open(self.path / LOG, "ab")
        self._sent_fd: int | None = None
        self._reader = open(self.path / LOG, "rb")
        for _ in range(self.sent):
            self._reader.readline()
        self.unsent_offset = self._reader.tell()  # byte offset of the first unconfirmed record
        self.resumed = self.count

    # --- recovery -----------------------------------------------------------------
    def _recover(self) -> None:
        log = self.path / LOG
        if not log.exists():
            return
        good = 0
        with open(log, "r+b") as f:
            for n, raw in enumerate(iter(f.readline, b"")):
                if not raw.endswith(b"\n"):
                    # torn last write (killed mid-append): that entry was never sent, drop it
                    f.truncate(good)
                    break
                try:
                    rec = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise SpoolCorrupt(f"spool log {log} is corrupt at entry {n}: {exc}") from None
                if str(rec.get("seq")) != str(n):
                    raise SpoolCorrupt(f"spool log {log}: entry {n} has seq {rec.get('seq')!r}")
                good += len(raw)
                self.count += 1
                self.finished = rec.get("kind") == "eof"
                src = rec.get(SRC_TAG)
                if src is not None:
                    self.by_source[src] = self.by_source.get(src, 0) + 1

    def _read_sent(self) -> int:
        try:
            return int((self.path / SENT).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    # --- writing --------------------------------------------------------------------
    def append(self, record: bytes, src: str | None = None) -> None:
        """Append one encoded record and hand it to the OS (survives a SIGKILL of this process)."""
        self._writer.write(record)
        self._writer.flush()
        self.count += 1
        if src is not None:
            self.by_source[src] = self.by_source.get(src, 0) + 1

    def append_many(self, records: bytes, count: int) -> None:
        """Append ``count`` encoded records given as one byte string: one write, one flush."""
        self._writer.write(records)
        self._writer.flush()
        self.count += count

    def sync(self) -> None:
        # fdatasync: the data and the file size, without the inode's timestamps (enough to read it back)
        getattr(os, "fdatasync", os.fsync)(self._writer.fileno())

    # --- sending --------------------------------------------------------------------
    def read_unsent(self, n: int) -> list[bytes]:
        """The next ``n`` records after those already handed out (caller ensures they are written)."""
        out = []
        for _ in range(n):
            raw = self._reader.readline()
            if not raw.endswith(b"\n"):
                raise SpoolCorrupt(f"spool log {self.path / LOG} ended early")
            out.append(raw)
        return out

    def read_at(self, offset: int, n: int) -> tuple[list[bytes], int]:
        """``n`` records starting at byte ``offset`` (caller ensures they are written), and the offset after."""
        if self._reader.tell() != offset:
            self._reader.seek(offset)
        out = self.read_unsent(n)
        return out, self._reader.tell()

    def mark_sent(self, count: int) -> None:
        """Record how many entries the broker confirmed: one pwrite of a fixed-width number in place.

        Fixed width, so every write covers the whole previous value (a short write of a few bytes in
        one block is not torn by a crash of this process). Never fsync'ed: a lost update only makes a
        resumed run re-send confirmed entries, which the workers drop as duplicates."""
        self.sent = count
        if self._sent_fd is None:
            self._sent_fd = os.open(self.path / SENT, os.O_WRONLY | os.O_CREAT, 0o600)
        os.pwrite(self._sent_fd, b"%0*d\n" % (SENT_WIDTH, count), 0)

    # --- closing --------------------------------------------------------------------
    def close(self, remove: bool = False) -> None:
        for f in (self._writer, self._reader):
            try:
                f.close()
            except OSError:
                pass
        if self._sent_fd is not None:
            try:
                os.close(self._sent_fd)
            except OSError:
                pass
            self._sent_fd = None
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)
            try:  # drop the namespace dir when it became empty
                self.path.parent.rmdir()
            except OSError:
                pass
        try:
            self._lock_file.close()  # releases the flock
        except OSError:
            pass


def discard(path: Path | str) -> None:
    """Delete a run's spool for good, under its lock: ``SpoolLocked`` while a tap publishes it.

    For a run that will never be accepted (a revoked token's, a run key outside every prefix): a
    corrupt log is discarded too, without being read."""
    fd = os.open(Path(path) / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SpoolLocked(f"a tap is publishing this run (spool {path} is locked)") from None
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)
    try:  # drop the namespace dir when it became empty
        Path(path).parent.rmdir()
    except OSError:
        pass


def refused_runs(settings: Settings) -> list[tuple[str, int, Path]]:
    """Runs with entries a gateway refused for good (``keep_refused``): run, how many, the file."""
    folder = spool_path(settings, "x").parent / REFUSED_DIR
    out: list[tuple[str, int, Path]] = []
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.jsonl")):
        try:
            lines = [line for line in path.read_bytes().splitlines() if line.strip()]
            run = str(orjson.loads(lines[0])["entry"]["run"]) if lines else path.stem
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, IndexError):
            continue
        out.append((run, len(lines), path))
    return out
