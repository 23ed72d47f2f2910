"""Build of the compiled core: the modules listed in ``services/native.py``, compiled with mypyc.

The metadata lives in ``pyproject.toml``; this file only adds the extension modules. When they
cannot be built (no C compiler, or ``GOOSE_INGEST_PURE_PYTHON=1`` at install time) the install
goes on with the same modules as Python, and says so in one warning line.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
native = runpy.run_path(str(HERE / "services" / "native.py"))


def _warn(why: str) -> None:
    print(f"goose-ingest: building the pure-Python core only ({why}); everything works, slower", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """A failed compile leaves the Python modules in place instead of failing the install.

    All or nothing: every compiled module needs the group's shared library, and an extension
    that fails to load is not retried as Python, so a partial build is removed."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CCompilerError, a missing compiler, a linker error
            for built in self.get_outputs():
                Path(built).unlink(missing_ok=True)
            _warn(f"{type(exc).__name__}: {exc}")


# setup.py runs once per build step; only the steps that build compile (metadata needs nothing).
_BUILDING = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def _extensions() -> list:
    if not _BUILDING.intersection(sys.argv[1:]):
        return []
    if native["pure_requested"]():
        _warn(f"{native['PURE_ENV']} is set")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    os.chdir(HERE)
    try:
        return mypycify(
            # The compiled modules are checked as strictly as ever; what they import (contracts, the
            # shell) is only read for its types: its own checks are tests/core/test_static_checks.py's.
            ["--config-file", "pyproject.toml", "--follow-imports", "silent", *native["source_paths"]()],
            opt_level="3",
            group_name=native["GROUP_NAME"],
        )
    except (Exception, SystemExit) as exc:  # mypyc reports type errors by exiting
        _warn(f"mypyc: {type(exc).__name__}")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
