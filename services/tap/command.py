"""`goose-ingest tap` and `goose-ingest publish`: publish an agent's output lines as raw entries.

Both label every entry with the run's input `format` (goose | claude-code | codex | gemini-cli | opencode) when it is known:
given with --format, or, for `tap`, recognised from the command it wraps (`goose`, `claude`, `codex`, `gemini`, `opencode`,
also behind launchers such as `env`, `npx`, `nohup`). Without a label the workers detect the format
from the first JSON line (harness-events-more-formats.md section 1).
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, BinaryIO

from contracts.formats import BY_COMMAND, BY_PACKAGE
from services.broker.url import redact_url
from services.settings import Settings
from services.tap.lines import LineSplitter
from services.tap.publisher import Publisher, RunFinished, now_ms
from services.tap.runkey import RUN_KEY_RULE, is_valid_run, new_run_key
from services.tap.sniff import HEAD_BYTES, LiveSniffer, binary_kind, document_kind
from services.tap.spool import SpoolCorrupt, SpoolLocked

log = logging.getLogger("goose_ingest.tap")
PROG = "goose-ingest"
READER_GRACE_S = 5.0  # after the child exits, how long to wait for its pipes to close (grandchildren)
PIPE_READ_BYTES = 1 << 16  # per read; below malloc's mmap threshold (a larger buffer measured no better)
# While the publisher is busy (a batch in flight or paced), the readers let output collect in the pipe
# this long before the next read: one read and one spool write then carry dozens of lines instead of
# one each. An idle publisher means no wait (a lone line is read and sent at once). The pipes are grown
# to PIPE_BUFFER_BYTES so a fast command does not block on a full pipe meanwhile.
PIPE_COALESCE_S = 0.005
PIPE_BUFFER_BYTES = 1 << 20
CREDENTIAL_CHECK_TIMEOUT_S = 2.0  # one PING before the command starts; a slow broker only delays the check
# A tap on a terminal (someone watching) waits this long for an unreachable broker after the command
# ended, unless --drain-timeout says otherwise; a tap under a supervisor or in a script waits until
# delivered. What is not delivered stays in the spool (the last line says how to deliver it).
INTERACTIVE_DRAIN_TIMEOUT_S = 10.0
# After a forwarded SIGINT/SIGTERM/SIGHUP the user wants out: wait this long for the broker, no longer.
SIGNALLED_DRAIN_TIMEOUT_S = 2.0
# Exit code of a tap whose command succeeded but whose entries stay in the spool (EX_TEMPFAIL): a
# script must not take "0" for "delivered". A failed command's own code is passed through as ever.
UNDELIVERED_EXIT = 75
# The longest a signal can wait for its handler while the tap waits for the command (see `_Signals`).
WAIT_SLICE_S = 0.5

# Executables (basename) of the agent CLIs and the npm packages they ship in -> the run's format
# (the table of contracts/formats.py: plain data, cheap for a tap to import).
AGENT_COMMANDS = BY_COMMAND
AGENT_PACKAGES = BY_PACKAGE
# Launchers that run their argument as a command: name -> options that take a value.
LAUNCHERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
    "npx": frozenset({"-p", "--package", "-c", "--call"}),
    "bunx": frozenset({"-p", "--package"}),
    "pnpx": frozenset(),
    "nohup": frozenset(),
    "nice": frozenset({"-n", "--adjustment"}),
    "exec": frozenset(),
    "command": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
}
TWO_WORD_LAUNCHERS = {("pnpm", "dlx"), ("yarn", "dlx"), ("npm", "exec"), ("bun", "x")}


class _Formats:
    """contracts.events.FORMATS as argparse choices, loaded only when --format is given or help is shown
    (with a metavar, argparse does not list them when the option is added): the contract's event models
    cost a tap ~0.7 MiB it otherwise never needs."""

    @staticmethod
    def _formats() -> tuple[str, ...]:
        from contracts.events import FORMATS

        return FORMATS

    def __contains__(self, value: object) -> bool:
        return value in self._formats()

    def __iter__(self) -> Iterator[str]:
        return iter(self._formats())


def format_of_command(command: list[str]) -> str | None:
    """The input format of the agent CLI `command` runs, or None when it is not one we know.

    Looks through launchers (`env [-i] [VAR=value ...]`, `npx [-y] @anthropic-ai/claude-code`,
    `pnpm dlx`, `nohup`, `nice -n 5`, ...) to the command they start; never guesses from arguments."""
    name, package = _started_command(command)
    if name in AGENT_COMMANDS:
        return AGENT_COMMANDS[name]
    return AGENT_PACKAGES.get(package) if package is not None else None


def command_name(command: list[str]) -> str | None:
    """The name of what `command` starts, through launchers (`env`, `npx`, `nohup`...): the run's
    default `agent` label when it is no agent CLI we know, so its exit is not called goose's."""
    name, package = _started_command(command)
    return (package or name) or None


def _started_command(command: list[str]) -> tuple[str, str | None]:
    """(executable basename, npm package name or None) of the command behind the launchers."""
    args = list(command)
    name = ""
    while args:
        name = os.path.basename(args[0])
        if tuple(os.path.basename(a) for a in args[:2]) in TWO_WORD_LAUNCHERS:
            args, name = args[1:], "npx"
        if name in AGENT_COMMANDS:
            return name, None
        package = _package_name(args[0])
        if package in AGENT_PACKAGES:
            return name, package
        if name not in LAUNCHERS:
            return name, None
        takes_value = LAUNCHERS[name]
        rest = args[1:]
        while rest:
            head = rest[0]
            if head == "--":
                rest = rest[1:]
                break
            if head in takes_value:
                rest = rest[2:]
            elif head.startswith("-") or (name == "env" and "=" in head):
                rest = rest[1:]
            else:
                break
        if not rest:
            return "", None  # a launcher with nothing behind it
        args = rest
    return name, None


def _package_name(arg: str) -> str:
    """`@openai/codex@0.46.0` -> `@openai/codex`; `claude@latest` -> `claude`."""
    at = arg.rfind("@")
    return arg[:at] if at > 0 else arg


def register(subparsers) -> None:
    tap = subparsers.add_parser(
        "tap",
        help="run a command (goose run --output-format stream-json ...) and publish its output lines",
        description="Run COMMAND, echo and publish every stdout/stderr line as a raw entry, then an eof "
        "entry with its exit code; exit with the command's exit code (128+N when killed by signal N), or "
        f"{UNDELIVERED_EXIT} when the command succeeded but its entries stay spooled (broker unreachable).",
    )
    tap.add_argument("--run", help=f"run key ({RUN_KEY_RULE}); default <host>/<ULID>, through a gateway <token prefix><host>/<ULID>")
    tap.add_argument("--quiet", "-q", action="store_true", help="do not echo the command's output")
    tap.add_argument("--agent", help="`agent` label on every entry (default: the agent CLI when recognised; else "
                     "only the eof entry carries the command's name, so a run with no JSON line ends as "
                     "`<command> exited with code N`)")
    tap.add_argument("--format", choices=_Formats(), metavar="FORMAT",
                     help="input format label on every entry: %(choices)s (default: recognised from COMMAND -- "
                     "goose, claude, codex, also behind env/npx/nohup; otherwise none and the workers detect it)")
    tap.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                     help="after the command ends, wait at most this long for an unreachable broker "
                     f"(default: {INTERACTIVE_DRAIN_TIMEOUT_S:g} s on a terminal, else until delivered); undelivered "
                     f"entries stay in the spool and a command that succeeded then exits {UNDELIVERED_EXIT}")
    tap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    tap.set_defaults(func=cmd_tap)

    pub = subparsers.add_parser(
        "publish",
        help="publish the lines of a file or pipe as one run's raw entries",
        description="Publish every line of FILE (or stdin) as a stdout raw entry of RUN, then an eof entry. "
        "Restarted with the same RUN and FILE after a crash, it skips the lines already spooled.",
    )
    pub.add_argument("--run", required=True, help=f"run key ({RUN_KEY_RULE})")
    pub.add_argument("file", nargs="?", default="-", metavar="FILE|-", help="input (default: stdin)")
    pub.add_argument("--no-eof", action="store_true", help="do not end the run (more input will follow later)")
    pub.add_argument("--no-skip", action="store_true",
                     help="when resuming a spooled run, do not skip the lines already taken from this input")
    pub.add_argument("--drain", action="store_true", help="only deliver the run's spooled entries; read no input")
    pub.add_argument("--agent", help="`agent` label on every entry")
    pub.add_argument("--format", choices=_Formats(), metavar="FORMAT",
                     help="input format label on every entry: %(choices)s (default: none, the workers detect it)")
    pub.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                     help="wait at most this long for an unreachable broker at the end (default: until delivered)")
    pub.set_defaults(func=cmd_publish)

    spool = subparsers.add_parser(
        "spool",
        help="list the runs waiting in this host's spool; --drain delivers them all",
        description="List every run of this namespace whose entries wait in the spool (GOOSE_INGEST_SPOOL_DIR): "
        "entries, how many are not yet confirmed by the broker, whether the run ended, whether a tap still "
        f"publishes it. --drain delivers each one not in use (as `publish --run RUN --drain`); exit {UNDELIVERED_EXIT} "
        "when some stay spooled.",
    )
    spool.add_argument("--drain", action="store_true", help="deliver every spooled run not in use by a live tap")
    spool.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                       help="with --drain: wait at most this long per run for an unreachable broker (default: until "
                       "delivered)")
    spool.add_argument("--discard", action="append", default=[], metavar="RUN",
                       help="delete this run's spooled entries for good, delivered or not (repeatable; not while a "
                       "tap publishes it)")
    spool.set_defaults(func=cmd_spool)


# --- shared ---------------------------------------------------------------------------------------
def _setup_logging() -> None:
    root = logging.getLogger("goose_ingest")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False


def _err(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def _labels(settings: Settings, agent: str | None) -> dict[str, str]:
    labels = {"host": settings.host_label or socket.gethostname()}
    if agent:
        labels["agent"] = agent
    return labels


def _strip_newline(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


def _open_publisher(settings: Settings, run: str, labels: dict[str, str], input_format: str | None) -> Publisher | int:
    if not settings.redis_url and not settings.endpoint:
        _err("no broker configured: set GOOSE_INGEST_REDIS_URL (e.g. redis://127.0.0.1:6379/0) "
             "or GOOSE_INGEST_ENDPOINT (an ingest gateway)")
        return 2
    if not settings.endpoint:
        _check_credentials(settings, run)
    else:  # the token and the run key, asked of the gateway (one line and exit 2 when refused)
        from services.tap.gateway_check import gateway_run

        gateway_run(settings, run)
    try:
        pub = Publisher(settings, run, labels, format=input_format)
    except (SpoolLocked, SpoolCorrupt) as exc:
        _err(str(exc))
        return 1
    except OSError as exc:
        _err(f"cannot use the spool directory {settings.spool_dir}: {exc}")
        return 1
    except ValueError as exc:  # e.g. a malformed broker URL (redis-py's message does not echo it)
        _err(f"invalid broker URL {redact_url(settings.redis_url)}: {exc}")
        return 2
    if pub.resumed:
        log.info("resuming run %s from its spool %s: next seq %d, %d entries not yet confirmed",
                 run, pub.spool_dir, pub.next_seq, pub.pending)
    return pub


def _check_credentials(settings: Settings, run: str) -> None:
    """Refuse to start when the broker answers but rejects our credentials or role (config errors: exit 2).

    An unreachable broker is no reason to stop -- that is what the spool is for -- but entries spooled
    under credentials the broker refuses would never be delivered. The role is probed with an XADD of
    id 0-0 to the run's shard: Redis checks the ACL first (NOPERM) and then refuses the id without
    writing anything."""
    if settings.redis_cluster:
        _check_credentials_cluster(settings, run)
        return
    from services.broker.facts import check_deployment_facts
    from services.broker.url import target, tls_options
    from services.tap.conn import AuthFailed, BrokerError, NoPermission, ReplyError, RespConnection

    conn = RespConnection(target(settings), connect_timeout=CREDENTIAL_CHECK_TIMEOUT_S,
                          socket_timeout=CREDENTIAL_CHECK_TIMEOUT_S, tls=tls_options(settings))
    try:
        conn.execute("PING")
        # another shard count than the data's would route this run elsewhere: one line, exit 2
        check_deployment_facts(settings.layout, conn.hgetall, conn.hsetnx, NoPermission)
        try:
            conn.execute("XADD", settings.layout.raw_stream(settings.layout.shard_of(run)), "0-0", "probe", "1")
        except NoPermission:
            raise
        except ReplyError:
            pass  # "must be greater than 0-0": allowed, and nothing was written
    except (AuthFailed, NoPermission):
        raise  # services/cli.py prints it as one line naming the settings
    except (BrokerError, OSError):
        pass  # down or unreachable: spool and deliver later
    finally:
        conn.close()


def _check_credentials_cluster(settings: Settings, run: str) -> None:
    """`_check_credentials` through redis-py's RedisCluster (which routes the probe to the shard's node)."""
    from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

    from services.broker.cluster import ensure_shard_count
    from services.broker.connect import sync_client_with_timeouts

    try:
        client = sync_client_with_timeouts(settings, socket_timeout=CREDENTIAL_CHECK_TIMEOUT_S,
                                           connect_timeout=CREDENTIAL_CHECK_TIMEOUT_S)
        try:
            client.ping()
            ensure_shard_count(client, settings.layout)
            try:
                client.execute_command("XADD", settings.layout.raw_stream(settings.layout.shard_of(run)),
                                       "0-0", "probe", "1")
            except NoPermissionError:
                raise
            except RedisError:
                pass
        finally:
            client.close()
    except (AuthenticationError, NoPermissionError):
        raise
    except (RedisError, OSError):
        pass


def _drain(pub: Publisher, timeout: float | None, abort: threading.Event) -> bool:
    """Wait until everything is delivered (or timeout / abort), then close. True when delivered."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ok = False
    while not abort.is_set():
        step = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        if pub.flush(step):
            ok = True
            break
        if not pub.sender_alive:  # it failed (logged): waiting longer would spin forever
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
    ok = pub.close(timeout=None if ok else 0)
    if not ok:
        url = redact_url(pub.settings.endpoint or pub.settings.redis_url)
        why = pub.refusal or (f"broker {url} answered {pub.last_answer}" if pub.last_answer else f"broker {url} unreachable")
        _err(f"{pub.pending} entries of run {pub.run} are not delivered yet ({why}); they are kept in "
             f"{pub.spool_dir}: deliver them with `{PROG} publish --run {pub.run} --drain`")
    return ok


# --- tap --------------------------------------------------------------------------------------------
def cmd_tap(args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _err("tap: no command given: use `goose-ingest tap [--run RUN] -- goose run --output-format stream-json ...`")
        return 2
    settings = Settings()
    if args.run is not None and not is_valid_run(args.run):
        _err(f"invalid --run {args.run!r}: must be {RUN_KEY_RULE}")
        return 2
    if args.run is None and settings.endpoint:  # through a gateway: in the token's prefix (gateway_check.py)
        from services.tap.gateway_check import gateway_run

        run = gateway_run(settings, None)
    else:
        run = args.run or new_run_key(settings.host_label)
    _setup_logging()
    # The handlers go in before anything is started (see `_Signals`): a signal from here on either
    # keeps the command from starting or reaches it, never neither.
    signals = _Signals()
    signals.install()
    try:
        return _tap(args, settings, run, command, signals)
    finally:
        signals.restore()


class _Signals:
    """SIGINT/SIGTERM/SIGHUP of a tap, race-free against the command's start.

    Installed before the publisher and the command exist. A signal that arrives before the command
    was started keeps it from starting (the tap exits 128+N); one that arrives while `Popen` runs
    (the child may exist, its pid not yet known to us) is forwarded as soon as `started` learns the
    pid; later ones are forwarded at once (a second one as SIGKILL: the command ignores them); once
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


def _tap(args: argparse.Namespace, settings: Settings, run: str, command: list[str], signals: _Signals) -> int:
    recognised = format_of_command(command)
    input_format = args.format or recognised
    agent = args.agent or recognised
    pub = _open_publisher(settings, run, _labels(settings, agent), input_format)
    if isinstance(pub, int):
        return pub
    _err(f"run {run}")
    if _prints_one_document(command):
        _err("hint: `--output-format json` prints one JSON document at the end, not a line per event, so every "
             "line of it becomes a warning; use `--output-format stream-json` (claude: add --verbose)")
    abort = signals.abort
    interactive = sys.stdin is not None and sys.stdin.isatty()
    drain_timeout = args.drain_timeout
    if drain_timeout is None and interactive:
        drain_timeout = INTERACTIVE_DRAIN_TIMEOUT_S
    if pub.finished:
        _err(f"run {run} already ended (its eof is in the spool {pub.spool_dir}); delivering what is spooled, "
             "not starting the command: choose a new run key")
        _drain(pub, drain_timeout, abort)
        return 2
    if signals.first is not None:  # asked to stop before the command started: it is not started at all
        _err(f"interrupted before the command started: {command[0]!r} was not run")
        _drain(pub, SIGNALLED_DRAIN_TIMEOUT_S, abort)
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
        _err(f"cannot run {command[0]!r}: {exc.strerror or exc}")
        _drain(pub, drain_timeout, abort)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    signals.started(child, own_group)  # a signal that came during Popen reaches the command now

    for pipe in (child.stdout, child.stderr):
        _grow_pipe(pipe)
    # Output that is no line stream (gzip, a sessions.db, one JSON document) is published all the
    # same (it is what the command printed), with one warning that says what it is.
    sniff = LiveSniffer(f"the output of {command[0]!r}", "FILE", f"goose-ingest publish --run {run} -",
                        documents=not _prints_one_document(command))
    readers = [
        threading.Thread(target=_pump, args=(child.stdout, "stdout", None if args.quiet else sys.stdout, pub, sniff),
                         daemon=True),
        threading.Thread(target=_pump, args=(child.stderr, "stderr", None if args.quiet else sys.stderr, pub),
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
    # No agent label: the eof alone names the command (not every line: bytes per entry), so a
    # run without a JSON line ends as "<command> exited with code N", not as goose's exit.
    name = command_name(command) if agent is None else None
    extra = {"agent": name} if name else {}
    if signalled and signals.first is not None:
        # What the tap did is evidence the exit code may not carry: Gemini CLI exits 0 on SIGINT.
        extra["signal"] = str(signals.first)
    pub.add_eof(rc, extra=extra or None)
    if signalled and (drain_timeout is None or drain_timeout > SIGNALLED_DRAIN_TIMEOUT_S):
        drain_timeout = SIGNALLED_DRAIN_TIMEOUT_S
    delivered = _drain(pub, drain_timeout, abort)
    if rc == 0 and not delivered:
        return UNDELIVERED_EXIT
    return rc if rc >= 0 else 128 - rc


def _prints_one_document(command: list[str]) -> bool:
    """The agent was asked for one JSON document (`goose run`/`claude -p --output-format json`)."""
    for i, arg in enumerate(command):
        if arg == "--output-format=json" or (arg == "--output-format" and command[i + 1:i + 2] == ["json"]):
            return True
    return False


def _grow_pipe(pipe: IO[bytes] | None) -> None:
    """Linux: raise the pipe's capacity to PIPE_BUFFER_BYTES (best effort: the default 64 KiB also works)."""
    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or setsz is None:
        return
    try:
        fcntl.fcntl(pipe.fileno(), setsz, PIPE_BUFFER_BYTES)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size for an unprivileged user


def _pump(pipe: BinaryIO, stream: str, echo, pub: Publisher, sniff: LiveSniffer | None = None) -> None:
    """Echo and publish a pipe's output: one read of up to PIPE_READ_BYTES, one echo write and one
    spool write per chunk, however many lines it holds (reads return as soon as anything arrived)."""
    out = getattr(echo, "buffer", None) if echo is not None else None
    fd = pipe.fileno()  # read the fd directly: the BufferedReader's readline costs a call per line
    splitter = LineSplitter()
    late = 0
    while True:
        chunk = os.read(fd, PIPE_READ_BYTES)
        if not chunk:
            break
        ts = now_ms()
        if sniff is not None and not sniff.done:
            why = sniff.feed(chunk)
            if why:
                _err(f"warning: {why}; its lines are published anyway, each one a warning event")
        if out is not None:
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None  # our own stdout/stderr went away: keep publishing
        lines = splitter.feed(chunk)
        if lines:
            late += _add_lines(pub, lines, stream, ts)
        if pub.sender_busy and len(chunk) < PIPE_READ_BYTES:  # a full read: more is waiting, read on
            time.sleep(PIPE_COALESCE_S)
    tail = splitter.rest()
    if tail is not None:
        late += _add_lines(pub, [tail], stream, now_ms())
    if late:
        log.warning("%d %s lines arrived after the run ended and were not published", late, stream)


def _add_lines(pub: Publisher, lines: list[bytes], stream: str, ts: int) -> int:
    """Publish lines; returns how many could not be (the run already ended)."""
    try:
        pub.add_lines(lines, stream, ts)
    except (RunFinished, RuntimeError):
        return len(lines)
    return 0


# --- publish ---------------------------------------------------------------------------------------
class _Stop(Exception):
    pass


def cmd_publish(args: argparse.Namespace) -> int:
    if not is_valid_run(args.run):
        _err(f"invalid --run {args.run!r}: must be {RUN_KEY_RULE}")
        return 2
    settings = Settings()
    source: str | None = None
    fh: BinaryIO | None = None
    if not args.drain:
        if args.file == "-":
            fh, source = sys.stdin.buffer, "stdin"
        else:
            try:
                fh = open(args.file, "rb")
            except OSError as exc:
                _err(f"cannot read {args.file}: {exc.strerror or exc}")
                return 2
            source = "file:" + os.path.realpath(args.file)
    lines: Iterator[bytes] = iter(())
    if fh is not None:
        found = _not_a_stream(fh, args)
        if isinstance(found, str):
            _err(found)
            if fh is not sys.stdin.buffer:
                fh.close()
            return 2
        lines = found
    _setup_logging()
    pub = _open_publisher(settings, args.run, _labels(settings, args.agent), args.format)
    if isinstance(pub, int):
        return pub
    abort = threading.Event()

    def on_term(signum, _frame):
        raise _Stop(signum)

    previous = {s: signal.signal(s, on_term) for s in (signal.SIGTERM, signal.SIGHUP)}
    added = skip = 0
    summary = fh is not None and not pub.finished  # an ended run only delivers what was spooled
    try:
        if fh is not None and pub.finished:
            _err(f"run {args.run} already ended (its eof is in the spool {pub.spool_dir}); delivering what is spooled")
        elif fh is not None:
            skip = 0 if args.no_skip or source is None else pub.lines_from(source)
            if skip:
                log.info("skipping the first %d lines of %s: already spooled for run %s", skip, args.file, args.run)
            for i, raw in enumerate(lines):
                if i < skip:
                    continue
                pub.add_line(_strip_newline(raw), "stdout", source=source)
                added += 1
            if not args.no_eof:
                pub.add_eof(None)
    except (KeyboardInterrupt, _Stop) as exc:
        signum = exc.args[0] if isinstance(exc, _Stop) else signal.SIGINT
        abort.set()
        pub.close(timeout=2.0)
        _err(f"interrupted: {pub.next_seq} entries of run {args.run} assigned; undelivered ones and the resume "
             f"point are kept in {pub.spool_dir}")
        return 128 + int(signum)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if fh is not None and fh is not sys.stdin.buffer:
            fh.close()
    try:
        if not _drain(pub, args.drain_timeout, abort):
            return 1
    except KeyboardInterrupt:
        pub.close(timeout=0)
        return 130
    if summary:  # the command's result, on stdout
        print(f"published {added} {'line' if added == 1 else 'lines'} to run {args.run}"
              + (f" ({skip} already spooled were skipped)" if skip else "")
              + (" (left open: --no-eof)" if args.no_eof else ""), flush=True)
    return 0


def _not_a_stream(fh: BinaryIO, args: argparse.Namespace) -> Iterator[bytes] | str:
    """The input's lines, or the sentence saying what it is when it is no line stream (services/tap/sniff.py)."""
    label = "standard input" if args.file == "-" else args.file
    shown = "FILE" if args.file == "-" else args.file
    peek = getattr(fh, "peek", None)
    why = binary_kind(peek(HEAD_BYTES)[:HEAD_BYTES] if peek else b"", label, shown,
                      f"goose-ingest publish --run {args.run} -")
    if why:
        return why
    first: list[bytes] = []  # read up to the first non-blank line, then given back in front of the rest
    for raw in iter(fh.readline, b""):
        first.append(raw)
        if raw.strip():
            why = document_kind(raw.decode("utf-8", "replace"), label)
            if why:
                return why
            break
    return itertools.chain(first, iter(fh.readline, b""))


# --- spool ----------------------------------------------------------------------------------------
def spooled_runs(settings: Settings) -> list[dict[str, object]]:
    """Every run of the configured namespace with a spool: run, entries, pending, ended, in_use, path.

    Read without taking the lock (a live tap holds it); `in_use` says whether one does."""
    from services.tap.spool import LOCK, LOG, SENT, spool_path

    root = spool_path(settings, "x").parent
    found: list[dict[str, object]] = []
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        log_file = path / LOG
        if not log_file.is_file():
            continue
        lines = [line for line in log_file.read_bytes().split(b"\n") if line.strip()]
        if not lines:
            continue
        try:
            import orjson

            first, last = orjson.loads(lines[0]), orjson.loads(lines[-1])
        except ValueError:
            first, last = {}, {}
        try:
            sent = int((path / SENT).read_text().strip() or 0)
        except (OSError, ValueError):
            sent = 0
        found.append({"run": str(first.get("run") or path.name), "entries": len(lines),
                      "pending": max(0, len(lines) - sent), "ended": last.get("kind") == "eof",
                      "in_use": _locked(path / LOCK), "path": str(path)})
    return found


def _locked(lock: os.PathLike[str] | str) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def cmd_spool(args: argparse.Namespace) -> int:
    settings = Settings()
    _setup_logging()
    runs = spooled_runs(settings)
    if args.discard:
        return _discard(settings, runs, args.discard)
    for r in runs:
        state = "ended" if r["ended"] else "open"
        use = "  (a tap is publishing it)" if r["in_use"] else ""
        print(f"{r['run']}  {r['entries']} entries, {r['pending']} not confirmed, {state}{use}")
    from services.tap.spool import refused_runs

    for run, n, path in refused_runs(settings):
        print(f"{run}  {n} entries refused by the gateway for good, kept in {path}")
    if not args.drain:
        _err(f"{len(runs)} spooled run{'s' if len(runs) != 1 else ''} in {settings.spool_dir}"
             + (f": deliver them with `{PROG} spool --drain`" if any(r["pending"] for r in runs) else ""))
        return 0
    if runs and not settings.redis_url and not settings.endpoint:  # a gateway's taps drain through it
        _err("no broker configured: set GOOSE_INGEST_REDIS_URL (e.g. redis://127.0.0.1:6379/0) "
             "or GOOSE_INGEST_ENDPOINT (an ingest gateway)")
        return 2
    try:
        return _drain_spooled(settings, runs, args.drain_timeout)
    except KeyboardInterrupt:
        _err(f"interrupted: what is not delivered stays in the spool; `{PROG} spool` lists it")
        return 130


def _discard(settings: Settings, runs: list[dict[str, object]], wanted: list[str]) -> int:
    from services.tap.spool import discard, refused_path

    by_run = {str(r["run"]): r for r in runs}
    failed = 0
    for run in wanted:
        r = by_run.get(run)
        refused = refused_path(settings, run)
        if refused.is_file():  # the entries the gateway refused for good go with it
            refused.unlink()
            if r is None:
                _err(f"run {run}: discarded its entries refused by the gateway")
                continue
        if r is None:
            _err(f"run {run}: not in the spool (`{PROG} spool` lists it)")
            failed += 1
            continue
        try:
            discard(str(r["path"]))
        except (SpoolLocked, OSError) as exc:
            _err(f"run {run}: {exc}")
            failed += 1
            continue
        _err(f"run {run}: discarded ({r['pending']} entries were not delivered)")
    return 1 if failed else 0


def _drain_spooled(settings: Settings, runs: list[dict[str, object]], timeout: float | None) -> int:
    left = 0
    abort = threading.Event()
    for r in runs:
        if r["in_use"] or not (r["pending"] or r["ended"]):
            continue  # a live tap delivers its own; an open run with nothing pending is only its seq counter
        run = str(r["run"])
        try:
            pub = Publisher(settings, run, _labels(settings, None))
        except (SpoolLocked, SpoolCorrupt, OSError, ValueError) as exc:
            _err(f"run {run}: {exc}")
            left += 1
            continue
        if not _drain(pub, timeout, abort):
            left += 1
        else:
            _err(f"run {run}: delivered")
        if abort.is_set():
            break
    return UNDELIVERED_EXIT if left else 0
