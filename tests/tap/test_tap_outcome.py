"""How a tap ends, decided by pure functions (services/tap/outcome.py, services/tap/launchers.py).

The exit codes a script reads, the broker waits and the eof's fields, each case once; and the two
modules stay the functional core: importing them starts nothing of the shell (no broker client,
no publisher, no process or signal handling).
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.tap.launchers import command_name, prints_one_document
from services.tap.outcome import (
    INTERACTIVE_DRAIN_TIMEOUT_S,
    SIGNALLED_DRAIN_TIMEOUT_S,
    UNDELIVERED_EXIT,
    drain_timeout,
    eof_extra,
    exit_code,
    not_started_exit,
    signalled_drain_timeout,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("returncode", "delivered", "expected"), [
    (0, True, 0),
    (0, False, UNDELIVERED_EXIT),  # succeeded, but entries wait in the spool: not "0"
    (3, False, 3),  # a failed command's own code is passed through, delivered or not
    (3, True, 3),
    (-signal.SIGTERM, True, 128 + signal.SIGTERM),  # killed by signal N: 128+N, as a shell says
    (-signal.SIGKILL, False, 128 + signal.SIGKILL),
])
def test_the_exit_code(returncode, delivered, expected):
    assert exit_code(returncode, delivered) == expected


def test_a_command_that_cannot_run_exits_as_a_shell_would():
    assert not_started_exit(FileNotFoundError(2, "No such file or directory")) == 127
    assert not_started_exit(PermissionError(13, "Permission denied")) == 126


def test_the_drain_timeouts():
    assert drain_timeout(None, interactive=True) == INTERACTIVE_DRAIN_TIMEOUT_S
    assert drain_timeout(None, interactive=False) is None  # under a supervisor: until delivered
    assert drain_timeout(30.0, interactive=True) == 30.0  # --drain-timeout wins
    assert signalled_drain_timeout(None) == SIGNALLED_DRAIN_TIMEOUT_S
    assert signalled_drain_timeout(60.0) == SIGNALLED_DRAIN_TIMEOUT_S
    assert signalled_drain_timeout(0.5) == 0.5  # asked to stop: never longer than it was


def test_the_eof_names_an_unknown_command_and_the_forwarded_signal():
    assert eof_extra(["sh", "-c", "exit 3"], None, None) == {"agent": "sh"}
    assert eof_extra(["env", "A=1", "npx", "-y", "cowsay"], None, None) == {"agent": "cowsay"}
    assert eof_extra(["sh"], "goose", int(signal.SIGINT)) == {"signal": str(int(signal.SIGINT))}
    assert eof_extra(["env"], None, None) is None  # a launcher with nothing behind it names nothing
    assert command_name(["npx", "-y", "@openai/codex@0.46.0"]) == "@openai/codex"


def test_one_json_document_is_recognised_in_both_spellings():
    assert prints_one_document(["claude", "-p", "hi", "--output-format", "json"])
    assert prints_one_document(["goose", "run", "--output-format=json"])
    assert not prints_one_document(["claude", "-p", "hi", "--output-format", "stream-json"])
    assert not prints_one_document(["claude", "--output-format"])  # no value: not a request for a document


def test_the_decisions_load_nothing_of_the_shell():
    pure = ("services.tap.outcome", "services.tap.launchers")
    # services.native: the package's switch between the compiled and the Python core, no I/O
    allowed = {"services", "services.native", "services.tap", *pure}
    code = (f"import sys, {', '.join(pure)}\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('services', 'redis', 'hiredis'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert set(out.stdout.strip().split(",")) - allowed == set()
    shell = {"subprocess", "signal", "threading", "socket", "select", "fcntl"}
    for module in pure:
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not shell & names, (module, shell & names)
