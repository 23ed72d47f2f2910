"""Ctrl-C in a real terminal (issue 38 item 1): `up` and `demo` run on a pty whose foreground process
group gets the SIGINT a terminal sends for ^C (the byte is written to the pty's master, the line
discipline does the rest). The embedded redis-server is in a session of its own, so it stops last,
after the worker and the archive; nothing the command started outlives it."""

from __future__ import annotations

import os
import pty
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.test_commands_live import TRANSCRIPTS, _archived, _publish
from tests.support.fixtures import REPO
from tests.support.pipeline import ended_runs, wait_until

pytestmark = pytest.mark.e2e

CTRL_C = b"\x03"
EXIT_WITHIN_S = 10.0  # "a few seconds", with room for a loaded 2-core machine


class Terminal:
    """A command on a pty of its own (pty.fork: a new session, the pty its controlling terminal)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once (nothing else is safe after a fork in a threaded test)
            os.chdir(REPO)
            os.execve(sys.executable, [sys.executable, "-m", "services.cli", *args], env)
        self._out = bytearray()
        self._lock = threading.Lock()
        self.code: int | None = None
        self.seen: set[int] = set()  # every descendant seen while it ran
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the last holder of the pty's slave side is gone
                return
            if not chunk:
                return
            with self._lock:
                self._out += chunk

    @property
    def output(self) -> str:
        with self._lock:
            return self._out.decode(errors="replace").replace("\r\n", "\n")

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            found = re.search(pattern, self.output)
            if found:
                return found
            assert self.poll() is None, f"exited {self.code} before {pattern!r}:\n{self.output[-3000:]}"
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout}s:\n{self.output[-3000:]}")

    def watch(self) -> set[int]:
        """Note the command's descendants now (whatever session they are in)."""
        self.seen |= descendants(self.pid)
        return self.seen

    def ctrl_c(self) -> None:
        self.watch()
        os.write(self.fd, CTRL_C)

    def poll(self) -> int | None:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            self.watch()
            time.sleep(0.02)
        if self.code is None:
            self.kill()
            raise AssertionError(f"still running {timeout}s after Ctrl-C:\n{self.output[-3000:]}")
        self._reader.join(5)
        return self.code

    def kill(self) -> None:
        for pid in [self.pid, *self.watch()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.code is None:
            os.waitpid(self.pid, 0)
            self.code = -9

    def close(self) -> None:
        if self.code is None:
            self.kill()
        os.close(self.fd)


def descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def left_running(term: Terminal) -> list[str]:
    """Descendants still alive a moment after the command exited (each with its command line)."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(alive(p) for p in term.seen):
        time.sleep(0.05)
    out = []
    for pid in sorted(p for p in term.seen if alive(p)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            out.append(f"{pid}: {cmdline}")
        except OSError:
            continue
    return out


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update(GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "state" / "spool"), **extra)
    return env


def _has_child(term: Terminal, name: str) -> bool:
    for pid in term.watch():
        try:
            if name in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                return True
        except OSError:
            continue
    return False


# --- demo: the first Ctrl-C ends it in every phase ----------------------------------------------------
def _broker_port(term: Terminal) -> int | None:
    """The embedded server's port, from its process title (redis-server sets it to `redis-server HOST:PORT`)."""
    for pid in term.watch():
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found = re.search(r"redis-server\S* 127\.0\.0\.1:(\d+)", title)
        if found:
            return int(found.group(1))
    return None


def _holds(term: Terminal, pattern: str) -> bool:
    """A stream named like `pattern` on the demo's embedded broker has entries."""
    import redis

    port = _broker_port(term)
    if port is None:
        return False
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return any(client.xlen(k) for k in client.scan_iter(match=pattern))
    except redis.RedisError:
        return False
    finally:
        client.close()


# phase -> (how long the transcript is, when the Ctrl-C comes). A long transcript keeps the demo in its
# publishing and waiting phases for seconds (the fixtures pass through them in a blink).
DEMO_PHASES = {
    "importing": (0, lambda term: time.sleep(0.2)),
    "broker-started": (0, lambda term: wait_until(lambda: _has_child(term, "redis-server"), timeout=60)),
    "worker-started": (0, lambda term: wait_until(lambda: _has_child(term, "services.cli worker"), timeout=60)),
    "publishing": (60_000, lambda term: wait_until(lambda: _holds(term, "goose.raw.*"), timeout=60, interval=0.02)),
    "waiting-for-the-worker": (60_000, lambda term: wait_until(lambda: _holds(term, "harness.events.*"), timeout=60,
                                                                interval=0.02)),
}


def _long_transcript(tmp_path: Path, lines: int) -> Path:
    one = TRANSCRIPTS[0].read_bytes().splitlines()
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"\n".join(one[i % len(one)] for i in range(lines)) + b"\n")
    return path


@pytest.mark.parametrize("phase", list(DEMO_PHASES))
def test_one_ctrl_c_ends_the_demo_at_once_in_every_phase_and_leaves_nothing(phase, tmp_path):
    lines, reached = DEMO_PHASES[phase]
    files = [str(_long_transcript(tmp_path, lines))] if lines else []
    term = Terminal(["demo", *files], clean_env(tmp_path))
    try:
        reached(term)
        assert term.poll() is None, term.output[-3000:]  # still in the phase meant
        started = time.monotonic()
        term.ctrl_c()
        code = term.wait(EXIT_WITHIN_S)
        took = time.monotonic() - started
    finally:
        term.close()
    if phase == "importing":  # the interpreter may still be loading `services.cli` itself: Python's own exit
        assert code in (130, -signal.SIGINT), (code, term.output[-3000:])
    else:
        assert code == 130 and "Traceback" not in term.output, (code, term.output[:3000])
        assert "interrupted" in term.output and "RUN ENDED" not in term.output, term.output[-3000:]
    assert took < EXIT_WITHIN_S, term.output[-3000:]
    assert left_running(term) == [], term.output[-3000:]
    # its runs went through a spool of its own, never the user's
    spool = tmp_path / "state" / "spool"
    assert not spool.exists() or not any(spool.iterdir()), list(spool.rglob("*"))


def test_the_demo_uses_a_private_spool_and_leaves_no_process(tmp_path):
    term = Terminal(["demo", str(TRANSCRIPTS[0])], clean_env(tmp_path))
    try:
        code = term.wait(120)
    finally:
        term.close()
    assert code == 0 and "1 run normalized by a live worker" in term.output, term.output[-3000:]
    assert left_running(term) == []
    spool = tmp_path / "state" / "spool"
    assert not spool.exists() or not any(spool.iterdir()), list(spool.rglob("*"))


# --- up: Ctrl-C stops the worker, the archive writes what is left, the broker stops last ----------------
def test_ctrl_c_of_up_archives_every_run_before_its_broker_stops(settings, tmp_path):
    term = Terminal(["up"], clean_env(tmp_path))
    try:
        url = term.wait_for(r"export GOOSE_INGEST_REDIS_URL=(\S+)").group(1)
        local = settings.model_copy(update={"redis_url": url, "namespace": ""})
        runs = [f"up/ctrl-c/{i}" for i in range(8)]
        for i, run in enumerate(runs):
            _publish(local, run, TRANSCRIPTS[i % len(TRANSCRIPTS)])
        wait_until(lambda: set(runs) <= ended_runs(local), timeout=60)
        assert _has_child(term, "redis-server")
        term.ctrl_c()
        code = term.wait(EXIT_WITHIN_S + 20)  # the archive's bounded finish (UP_ARCHIVE_FINISH_TIMEOUT_S)
    finally:
        term.close()
    assert code == 0 and "Traceback" not in term.output, term.output[-3000:]
    assert "everything the broker held is archived to file://" in term.output, term.output[-3000:]
    assert left_running(term) == []
    seqs, events = _archived(tmp_path / "state" / "archive")
    for i, run in enumerate(runs):
        lines = len(TRANSCRIPTS[i % len(TRANSCRIPTS)].read_bytes().splitlines())
        assert seqs.get(run) == list(range(lines + 1)), (run, seqs.get(run))
        assert events.get(run, 0) > 0, run


def test_ctrl_c_while_up_starts_leaves_no_broker(tmp_path):
    term = Terminal(["up"], clean_env(tmp_path))
    try:
        wait_until(lambda: _has_child(term, "redis-server"), timeout=60)
        term.ctrl_c()
        code = term.wait(EXIT_WITHIN_S + 20)
    finally:
        term.close()
    assert code in (0, 130) and "Traceback" not in term.output, (code, term.output[-3000:])
    assert left_running(term) == [], term.output[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_a_closed_terminal_stops_the_demo_in_order_and_leaves_nothing(signum, tmp_path):
    """Not a Ctrl-C: a SIGTERM to the demo alone (kill PID), or the SIGHUP of a closed terminal. Its
    worker and broker are in sessions of their own, so only the demo can stop them: it does."""
    term = Terminal(["demo", str(_long_transcript(tmp_path, 60_000))], clean_env(tmp_path))
    try:
        wait_until(lambda: _holds(term, "goose.raw.*"), timeout=60, interval=0.02)
        term.watch()
        os.kill(term.pid, signum)
        code = term.wait(EXIT_WITHIN_S)
    finally:
        term.close()
    assert code == 130 and "Traceback" not in term.output, (code, term.output[-3000:])
    assert left_running(term) == [], term.output[-3000:]
