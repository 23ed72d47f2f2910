"""`goose-ingest tap`'s child: started, its output pumped, its signals forwarded, its exit passed on.

The imperative shell of the tap: what to decide (the format, the drain timeouts, the exit code) is
in services/tap/launchers.py and services/tap/outcome.py; here it is done -- a process spawned,
threads started, signals caught and sent, a process group ended.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import threading
import time

from services.settings import Settings
from services.tap.console import err, log
from services.tap.delivery import drain, open_publisher, run_labels
from services.tap.launchers import format_of_command, prints_one_document
from services.tap.outcome import (
    SIGNALLED_DRAIN_TIMEOUT_S,
    drain_timeout,
    eof_extra,
    exit_code,
    not_started_exit,
    signalled_drain_timeout,
)
from services.tap.pipes import grow_pipe, pump
from services.tap.sniff import LiveSniffer

READER_GRACE_S = 5.0  # after the child exits, how long to wait for its pipes to close (grandchildren)
# The longest a signal can wait for its handler while the tap waits for the command (see `Signals`).
WAIT_SLICE_S = 0.5
# The same signal again this soon is an echo, not a second request: GNU `timeout`, and any supervisor
# that signals a process and then its group, hands the tap one signal twice within microseconds. A
# person pressing Ctrl-C twice takes longer than this.
ECHO_S = 0.25


def tap(args: argparse.Namespace, settings: Settings, run: str, command: list[str]) -> int:
    """Run `command` under `run`'s publisher; the exit code to leave with."""
    # The handlers go in before anything is started (see `Signals`): a signal from here on either
    # keeps the command from starting or reaches it, never neither.
    signals = Signals()
    signals.install()
    try:
        return supervise(args, settings, run, command, signals)
    finally:
        signals.restore()


class Signals:
    """SIGINT/SIGTERM/SIGHUP of a tap, race-free against the command's start.

    Installed before the publisher and the command exist. A signal that arrives before the command
    was started keeps it from starting (the tap exits 128+N); one that arrives while `Popen` runs
    (the child may exist, its pid not yet known to us) is forwarded as soon as `started` learns the
    pid; later ones are forwarded at once (a second one as SIGKILL: the command ignores them; the same
    signal again within ECHO_S is the first one's echo and changes nothing); once
    the command is over, a signal means "stop waiting for the broker" (`abort`).

    Python runs a handler in the main thread only, between two bytecodes; which thread the kernel
    interrupts is its choice. So the main thread never blocks in a bare `wait()` (waitpid is only
    interrupted when the signal is delivered to that very thread): `wait` sleeps on the child's
    pidfd with a timeout, and a handler runs at the latest when that times out."""

    FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self.abort = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.own_group = False
        self.starting = False  # Popen is running: the child may exist before we know its pid
        self._unsent: int | None = None  # arrived while the child's pid was not known yet
        self._last_at = float("-inf")  # time.monotonic() of the last signal received
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        self._previous = {s: signal.signal(s, self._on_signal) for s in self.FORWARDED}

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self._previous = {}

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def _on_signal(self, signum: int, _frame: object) -> None:
        now, last_at = time.monotonic(), self._last_at
        self._last_at = now
        if self.received and self.received[-1] == signum and now - last_at < ECHO_S:
            return  # the echo of the signal just handled (see ECHO_S)
        child = self.child
        if child is None:
            self.received.append(signum)
            if not self.starting:
                self.abort.set()  # not started, and now it never will be: stop waiting for the broker too
            elif self._unsent is None:
                self._unsent = signum  # `started` sends it once the pid is known (if Popen succeeds)
            return
        if child.poll() is None:
            # a second signal while the command still runs: it ignores them, so end it for good
            self._send(signal.SIGKILL if self.received else signum)
            self.received.append(signum)
        else:  # the command is over: a signal now means "stop waiting for the broker"
            self.abort.set()

    def started(self, child: subprocess.Popen[bytes], own_group: bool) -> None:
        """The command runs: from now on signals go to it; one that came during `Popen` goes now."""
        self.own_group = own_group
        self.child = child
        self.starting = False
        unsent, self._unsent = self._unsent, None
        if unsent is not None:
            self._send(unsent)

    def _send(self, signum: int) -> None:
        child = self.child
        if child is None:
            return
        try:
            if self.own_group:
                os.killpg(child.pid, signum)
            else:
                os.kill(child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, child: subprocess.Popen[bytes]) -> int:
        """`child.wait()`, during which the handlers above run within WAIT_SLICE_S of a signal."""
        pidfd = _pidfd(child.pid)
        try:
            while True:
                if pidfd is not None:
                    try:
                        select.select([pidfd], [], [], WAIT_SLICE_S)
                    except OSError:
                        pass
                try:
                    return child.wait(timeout=0 if pidfd is not None else WAIT_SLICE_S)
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if pidfd is not None:
                os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A pidfd of the child (readable once it exited), or None where there is none (not Linux >= 5.3)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def supervise(args: argparse.Namespace, settings: Settings, run: str, command: list[str], signals: Signals) -> int:
    """The tap with its signal handlers in place: publisher, command, readers, eof, drain, exit code."""
    recognised = format_of_command(command)
    input_format = args.format or recognised
    agent = args.agent or recognised
    pub = open_publisher(settings, run, run_labels(settings, agent), input_format)
    if isinstance(pub, int):
        return pub
    err(f"run {run}")
    if prints_one_document(command):
        err("hint: `--output-format json` prints one JSON document at the end, not a line per event, so every "
            "line of it becomes a warning; use `--output-format stream-json` (claude: add --verbose)")
    abort = signals.abort
    interactive = sys.stdin is not None and sys.stdin.isatty()
    timeout = drain_timeout(args.drain_timeout, interactive)
    if pub.finished:
        err(f"run {run} already ended (its eof is in the spool {pub.spool_dir}); delivering what is spooled, "
            "not starting the command: choose a new run key")
        drain(pub, timeout, abort)
        return 2
    if signals.first is not None:  # asked to stop before the command started: it is not started at all
        err(f"interrupted before the command started: {command[0]!r} was not run")
        drain(pub, SIGNALLED_DRAIN_TIMEOUT_S, abort)
        return 128 + signals.first

    # Not on a terminal: the child leads its own process group and a signal we get is forwarded to that
    # whole group, so what it started (`sh -c`, npx -> node) stops with it instead of living on under
    # init. On a terminal the child stays in the foreground group (it may read the tty): Ctrl-C reaches
    # it and its descendants from the terminal itself, and a forwarded signal goes to the child.
    own_group = not interactive
    signals.starting = True
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 process_group=0 if own_group else None)
    except OSError as exc:
        signals.starting = False
        err(f"cannot run {command[0]!r}: {exc.strerror or exc}")
        drain(pub, timeout, abort)
        return not_started_exit(exc)
    signals.started(child, own_group)  # a signal that came during Popen reaches the command now

    for pipe in (child.stdout, child.stderr):
        grow_pipe(pipe)
    # Output that is no line stream (gzip, a sessions.db, one JSON document) is published all the
    # same (it is what the command printed), with one warning that says what it is.
    sniff = LiveSniffer(f"the output of {command[0]!r}", "FILE", f"goose-ingest publish --run {run} -",
                        documents=not prints_one_document(command))
    readers = [
        threading.Thread(target=pump, args=(child.stdout, "stdout", None if args.quiet else sys.stdout, pub, sniff),
                         daemon=True),
        threading.Thread(target=pump, args=(child.stderr, "stderr", None if args.quiet else sys.stderr, pub),
                         daemon=True),
    ]
    for t in readers:
        t.start()
    rc = signals.wait(child)
    signalled = bool(signals.received)
    if signalled and own_group:
        # We were asked to stop and the command is gone: what it left in its group (a `sh` job
        # started with `&` ignores SIGINT) would hold our pipes open for READER_GRACE_S and live on.
        try:
            os.killpg(child.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + READER_GRACE_S
    for t in readers:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in readers):
        log.warning("the command exited but its output pipes are still open (background processes?); "
                    "ending the run without their further output")
    pub.add_eof(rc, extra=eof_extra(command, agent, signals.first))
    if signalled:
        timeout = signalled_drain_timeout(timeout)
    return exit_code(rc, drain(pub, timeout, abort))
