"""`goose-ingest tap`, `publish` and `spool`: their arguments, their usage errors, and the hand-off.

Both `tap` and `publish` label every entry with the run's input `format` (goose | claude-code | codex | gemini-cli | opencode) when it is known:
given with --format, or, for `tap`, recognised from the command it wraps (`goose`, `claude`, `codex`, `gemini`, `opencode`,
also behind launchers such as `env`, `npx`, `nohup`). Without a label the workers detect the format
from the first JSON line (harness-events-more-formats.md section 1).

The entry point only: a usage error is one line and exit 2 here, before anything is opened; each
command's work is done by the module named for its job --
- services/tap/supervise.py: the tapped command (spawn, output, signals, exit code), deciding through
  services/tap/launchers.py (which agent runs) and services/tap/outcome.py (timeouts, exit codes);
- services/tap/publish_input.py: the lines of a file or a pipe;
- services/tap/spool_admin.py: the runs waiting in the spool;
- services/tap/delivery.py: the publisher each opens after the checks of services/tap/credentials.py,
  and the wait for delivery at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

from services.settings import Settings
from services.tap import publish_input, spool_admin, supervise
from services.tap.console import err, setup_logging
from services.tap.outcome import INTERACTIVE_DRAIN_TIMEOUT_S, UNDELIVERED_EXIT
from services.tap.runkey import RUN_KEY_RULE, is_valid_run, new_run_key


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


def cmd_tap(args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        err("tap: no command given: use `goose-ingest tap [--run RUN] -- goose run --output-format stream-json ...`")
        return 2
    settings = Settings()
    if args.run is not None and not is_valid_run(args.run):
        err(f"invalid --run {args.run!r}: must be {RUN_KEY_RULE}")
        return 2
    if args.run is None and settings.endpoint:  # through a gateway: in the token's prefix (gateway_check.py)
        from services.tap.gateway_check import gateway_run

        run = gateway_run(settings, None)
    else:
        run = args.run or new_run_key(settings.host_label)
    setup_logging()
    return supervise.tap(args, settings, run, command)


def cmd_publish(args: argparse.Namespace) -> int:
    if not is_valid_run(args.run):
        err(f"invalid --run {args.run!r}: must be {RUN_KEY_RULE}")
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
                err(f"cannot read {args.file}: {exc.strerror or exc}")
                return 2
            source = "file:" + os.path.realpath(args.file)
    lines: Iterator[bytes] = iter(())
    if fh is not None:
        found = publish_input.input_lines(fh, args)
        if isinstance(found, str):  # no line stream (a gzip file, a sessions.db, one JSON document)
            err(found)
            if fh is not sys.stdin.buffer:
                fh.close()
            return 2
        lines = found
    setup_logging()
    return publish_input.publish(args, settings, fh, source, lines)


def cmd_spool(args: argparse.Namespace) -> int:
    settings = Settings()
    setup_logging()
    return spool_admin.list_drain_or_discard(args, settings)
