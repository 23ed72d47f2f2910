"""How a tap ends (pure): how long it waits for the broker, what its eof says, which code it exits with.

Decisions only -- services/tap/supervise.py does what they say. A script reads the exit code, so it
must tell "the command failed" (its own code, passed through), "killed by signal N" (128+N) and "it
succeeded but its entries wait in the spool" (UNDELIVERED_EXIT) apart.
"""

from __future__ import annotations

from services.tap.launchers import command_name

# A tap on a terminal (someone watching) waits this long for an unreachable broker after the command
# ended, unless --drain-timeout says otherwise; a tap under a supervisor or in a script waits until
# delivered. What is not delivered stays in the spool (the last line says how to deliver it).
INTERACTIVE_DRAIN_TIMEOUT_S = 10.0
# After a forwarded SIGINT/SIGTERM/SIGHUP the user wants out: wait this long for the broker, no longer.
SIGNALLED_DRAIN_TIMEOUT_S = 2.0
# Exit code of a tap whose command succeeded but whose entries stay in the spool (EX_TEMPFAIL): a
# script must not take "0" for "delivered". A failed command's own code is passed through as ever.
UNDELIVERED_EXIT = 75


def drain_timeout(given: float | None, interactive: bool) -> float | None:
    """--drain-timeout, else INTERACTIVE_DRAIN_TIMEOUT_S on a terminal, else None (until delivered)."""
    if given is None and interactive:
        return INTERACTIVE_DRAIN_TIMEOUT_S
    return given


def signalled_drain_timeout(timeout: float | None) -> float:
    """The drain timeout once the tap was asked to stop: no longer than SIGNALLED_DRAIN_TIMEOUT_S."""
    if timeout is None or timeout > SIGNALLED_DRAIN_TIMEOUT_S:
        return SIGNALLED_DRAIN_TIMEOUT_S
    return timeout


def not_started_exit(exc: OSError) -> int:
    """The shell's codes for a command that could not be run: 127 not found, 126 not executable."""
    return 127 if isinstance(exc, FileNotFoundError) else 126


def eof_extra(command: list[str], agent: str | None, first_signal: int | None) -> dict[str, str] | None:
    """The eof's fields beyond the exit code: the command's name when no agent label names the run
    (not on every line: bytes per entry), so a run without a JSON line ends as "<command> exited
    with code N", not as goose's exit; and the signal the tap forwarded, evidence the exit code may
    not carry (Gemini CLI exits 0 on SIGINT)."""
    name = command_name(command) if agent is None else None
    extra = {"agent": name} if name else {}
    if first_signal is not None:
        extra["signal"] = str(first_signal)
    return extra or None


def exit_code(returncode: int, delivered: bool) -> int:
    """The tap's exit code from the command's (`Popen.returncode`: -N when killed by signal N)."""
    if returncode == 0 and not delivered:
        return UNDELIVERED_EXIT
    return returncode if returncode >= 0 else 128 - returncode
