"""A signal to `goose-ingest tap` at any moment of its start stops it, and never leaves the command
running (services/tap/supervise.py, `Signals`).

The window that was open: the handlers were installed only after `Popen`, and the main thread then
waited in a bare `waitpid`, which only a signal delivered to that very thread interrupts. Here: the
real CLI signalled at many offsets across its start, and the two races driven deterministically
in-process (a signal while `Popen` runs; a signal the kernel hands to another thread).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from services.tap.supervise import ECHO_S, WAIT_SLICE_S, Signals, supervise
from tests.support.pipeline import REPO, wait_until
from tests.support.redis_server import cli_env

OFFSETS = 16  # signals spread over the tap's start-up (measured first), and a little beyond


def _processes_with(tag: str) -> list[int]:
    """Pids whose command line holds `tag` (the tapped command and what it started)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tag.encode() in cmdline and state != "Z":
            found.append(int(name))
    return found


def _start_tap(settings, tag: str) -> subprocess.Popen[str]:
    # `sleep <tag>`: a unique argument, so what the command started can be found (and must be gone)
    return subprocess.Popen([sys.executable, "-m", "services.cli", "tap", "--run", f"sig/{tag}", "--", "sh", "-c",
                             f"sleep {tag} & wait"], cwd=REPO, env=cli_env(settings), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _startup_s(settings) -> float:
    """How long the tap takes here, now, from exec to its command running (the window to cover)."""
    tag = f"{300 + uuid.uuid4().int % 10_000 / 100_000:.5f}"
    started = time.monotonic()
    proc = _start_tap(settings, tag)
    try:
        wait_until(lambda: len(_processes_with(tag)) >= 3, timeout=60, interval=0.01)  # tap, sh, sleep
        return time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.e2e
def test_sigterm_at_any_moment_of_the_start_stops_the_tap_and_leaves_nothing_running(settings):
    window = _startup_s(settings)
    outcomes: dict[str, int] = {}
    for i in range(OFFSETS + 1):
        tag = f"{300 + uuid.uuid4().int % 10_000 / 100_000:.5f}"
        proc = _start_tap(settings, tag)
        if i < OFFSETS:
            offset = window * 1.3 * i / (OFFSETS - 1)
            time.sleep(offset)
        else:  # and once the command surely runs (the load may have slowed the start past the window)
            offset = -1.0
            wait_until(lambda tag=tag: len(_processes_with(tag)) >= 3, timeout=60, interval=0.01)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        took = time.monotonic() - sent
        stderr = proc.stderr.read() if proc.stderr else ""
        # -15: the signal came before Python installed the tap's handlers (nothing was started then)
        assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), (offset, proc.returncode, stderr[-2000:])
        # seconds, not the command's 300 s (on a starved machine a tap's exit alone took 5-7 s: the bound is loose)
        assert took < 15, (offset, took, stderr[-2000:])
        assert "Traceback" not in stderr, stderr[-2000:]
        wait_until(lambda tag=tag: not _processes_with(tag), timeout=5, interval=0.05)  # nothing left of the command
        kind = ("before the handlers" if proc.returncode < 0 else
                "before the command" if "before the command started" in stderr else "while it ran")
        outcomes[kind] = outcomes.get(kind, 0) + 1
    # the offsets did cover the start: the earliest ones precede the command, the last one reaches it running
    assert outcomes.get("while it ran", 0) >= 1 and outcomes.get("while it ran", 0) <= OFFSETS, outcomes


def test_a_signal_that_arrives_while_popen_runs_reaches_the_command_once_its_pid_is_known():
    signals = Signals()
    signals.starting = True
    signals._on_signal(signal.SIGTERM, None)  # the child may exist, but its pid is not ours yet
    assert not signals.abort.is_set()  # the command is about to run: its output is still wanted
    child = subprocess.Popen(["sleep", "30"], process_group=0)
    try:
        signals.started(child, own_group=True)
        assert child.wait(timeout=5) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert signals.received == [signal.SIGTERM]


# A command that takes a moment to finish after SIGTERM, exiting 7: a SIGKILL shows as -9 instead.
_SLOW_TO_STOP = ("import signal, sys, time\n"
                 "def stop(*_): time.sleep(0.5); sys.exit(7)\n"
                 "signal.signal(signal.SIGTERM, stop)\n"
                 "print('ready', flush=True)\n"
                 "time.sleep(30)\n")


def _slow_to_stop() -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", _SLOW_TO_STOP], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def test_the_same_signal_twice_at_once_is_one_signal_not_a_kill():
    """GNU `timeout` signals the tap and then its process group: one SIGTERM arrives twice (CPython
    often folds the two into one handler call; when it does not, the second must not be a kill)."""
    signals = Signals()
    child = _slow_to_stop()
    try:
        signals.started(child, own_group=False)
        signals._on_signal(signal.SIGTERM, None)
        signals._on_signal(signal.SIGTERM, None)  # the echo, microseconds later
        assert child.wait(timeout=10) == 7
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    assert signals.received == [signal.SIGTERM]


def test_a_second_signal_after_a_moment_still_ends_the_command_for_good():
    signals = Signals()
    child = _slow_to_stop()
    try:
        signals.started(child, own_group=False)
        signals._on_signal(signal.SIGTERM, None)
        time.sleep(ECHO_S + 0.05)  # inside the command's 0.5 s of stopping, past an echo's window
        signals._on_signal(signal.SIGTERM, None)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    assert signals.received == [signal.SIGTERM, signal.SIGTERM]


@pytest.mark.e2e
def test_a_tap_under_gnu_timeout_lets_the_command_stop_as_it_chooses(settings, tmp_path):
    """`timeout 3 goose-ingest tap -- agent`: the agent gets SIGTERM (from the tap and from the
    group) and exits in its own time with its own status; it is not killed."""
    script = tmp_path / "agent.py"
    script.write_text(_SLOW_TO_STOP)
    run = f"sig/timeout-{uuid.uuid4().hex[:8]}"
    res = subprocess.run(["timeout", "--preserve-status", "-s", "TERM", "3", sys.executable, "-m", "services.cli",
                          "tap", "--run", run, "--", sys.executable, str(script)], cwd=REPO, env=cli_env(settings),
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert res.returncode == 7, res.stderr.decode()[-2000:]


def test_a_signal_before_the_start_means_the_command_never_runs(settings, tmp_path):
    marker = tmp_path / "ran"
    signals = Signals()
    signals._on_signal(signal.SIGTERM, None)  # e.g. during the broker's credential check
    signals._on_signal(signal.SIGINT, None)
    assert signals.abort.is_set() and signals.first == signal.SIGTERM
    args = argparse.Namespace(format=None, agent=None, drain_timeout=None, quiet=True)
    rc = supervise(args, settings, "sig/early", ["sh", "-c", f"touch {marker}"], signals)
    assert rc == 128 + signal.SIGTERM
    time.sleep(0.2)
    assert not marker.exists()


def test_the_handler_runs_while_the_tap_waits_even_when_another_thread_takes_the_signal(tmp_path):
    """The kernel may hand a process-directed signal to any thread that does not block it; only the
    main thread runs Python's handler. Forced here: the main thread blocks SIGTERM, a helper thread
    does not. A bare `child.wait()` then never returns (the command runs on); `Signals.wait` does,
    within WAIT_SLICE_S."""
    script = textwrap.dedent(f"""
        import signal, subprocess, sys, threading, time
        sys.path.insert(0, {str(REPO)!r})
        from services.tap.supervise import Signals
        signals = Signals()
        signals.install()
        child = subprocess.Popen(["sleep", "60"], process_group=0)
        signals.started(child, own_group=True)
        ready = threading.Event()
        def helper():  # started before the block below: SIGTERM stays deliverable to this thread
            ready.set()
            time.sleep(30)
        threading.Thread(target=helper, daemon=True).start()
        ready.wait()
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        started = time.monotonic()
        import os
        os.kill(os.getpid(), signal.SIGTERM)  # only the helper can take it
        rc = signals.wait(child)
        print(rc, round(time.monotonic() - started, 2), flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    rc, took = out.stdout.split()
    assert int(rc) == -signal.SIGTERM
    assert float(took) < WAIT_SLICE_S + 3, took
