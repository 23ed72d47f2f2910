"""The linter and the type checker pass on the whole tree (issue 9 part 5).

Both run as the project configures them in pyproject.toml ([tool.ruff], [tool.mypy]: strict on
the pure core, the defaults plus checked bodies on the shell), with the executables of the
interpreter running the tests, so the pinned versions of the `test` extra decide, not whatever
else is on the PATH.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# A cold mypy run of the tree takes ~6 s here; the margin is for a loaded CI machine.
CHECK_TIMEOUT_S = 240

CHECKS = {
    "ruff": ["ruff", "check", "."],
    "mypy": ["mypy", "services", "contracts"],
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_static_check_passes(name: str) -> None:
    tool, *args = CHECKS[name]
    exe = BIN / tool
    assert exe.is_file(), f"{exe} is missing: install the test extra (pip install -e '.[test]')"
    proc = subprocess.run(
        [str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False
    )
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"`{tool} {' '.join(args)}` exited {proc.returncode}:\n{output}"


PROBE = '''
def untyped(x):
    return len(x) + ""


def bare(a: dict) -> int:
    return a["n"]
'''


def test_mypy_is_strict_on_the_core_only(tmp_path: Path) -> None:
    """pyproject's mypy config checks the pure core strictly and the shell with the defaults.

    `strict = true` in an override would be applied to every module by mypy (python/mypy#11401),
    so this checks the effect: the same probe module as part of the core and of the shell."""
    for package in ("services", "services/normalizer", "services/worker", "contracts"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    for package in ("services/normalizer", "services/worker", "contracts"):
        (tmp_path / package / "probe.py").write_text(PROBE)
    proc = subprocess.run(
        [str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
         "services", "contracts"],
        cwd=tmp_path, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False,
    )
    codes = {
        (line.split(":", 1)[0], line.rsplit("[", 1)[-1].rstrip("]"))
        for line in proc.stdout.splitlines() if ": error: " in line
    }
    for core in ("services/normalizer/probe.py", "contracts/probe.py"):
        # strict: annotations required, generics parameterised, no Any returned as int
        assert {(core, "no-untyped-def"), (core, "type-arg"), (core, "no-any-return")} <= codes, proc.stdout
    shell = "services/worker/probe.py"
    # defaults, and the body of an unannotated function is still checked (check_untyped_defs)
    assert {code for file, code in codes if file == shell} == {"operator"}, proc.stdout
