"""The compiled core: which modules of the pure core are compiled with mypyc, and the switch back.

The modules listed here are ordinary, strictly typed Python and stay the one source of their
rules. ``setup.py`` compiles the same files with mypyc when the project is installed on a machine
with a C compiler (the README's command does it); Python then imports the compiled extension
that sits beside each ``.py`` file. Without a compiler the install keeps the Python modules.

``GOOSE_INGEST_PURE_PYTHON=1`` makes a process import the Python files even where the compiled
ones exist: the reference path, for the property tests that compare both byte for byte
(``tests/core/test_native_core.py``) and for anyone who suspects the compiled code.

This module is never compiled itself, and imports nothing but the standard library, because
``setup.py`` reads it before anything is built.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_ENV = "GOOSE_INGEST_PURE_PYTHON"

# Every module of the core that is compiled. They import each other, so they are compiled as
# one group (one shared library): calls between them are C calls, not Python calls.
COMPILED_MODULES = (
    "services.normalizer.timefmt",
    "services.normalizer.paths",
    "services.normalizer.error_classes",
    "services.normalizer.shell_tokens",
    "services.normalizer.shell",
    "services.normalizer.tools",
    "services.normalizer.machinery",
    # One line per input format (contracts/formats.py; tests/core/test_formats_registry.py checks it).
    "services.normalizer.formats.goose",
    "services.normalizer.formats.claude_code",
    "services.normalizer.formats.codex",
    "services.normalizer.formats.gemini_cli",
    "services.normalizer.formats.opencode",
    "services.normalizer.run_normalizer",
    "services.sequencer.entries",
    "services.sequencer.run",
    "services.redaction.rules",
    "services.redaction.prefilter",
    "services.redaction.forms",
    "services.redaction.redactor",
)
# The name of the group's shared library (``goose_ingest_core__mypyc.<abi>.so``).
GROUP_NAME = "goose_ingest_core"

_ROOT = Path(__file__).resolve().parent.parent
# An installer may write a wheel's .py files a moment after its .so files: only an edit counts.
_MTIME_SLACK_S = 2.0


def _source(name: str) -> str:
    """A core module's ``.py`` file, relative to the project root (or site-packages)."""
    return name.replace(".", "/") + ".py"


def source_paths() -> list[str]:
    """The ``.py`` files that are compiled (for ``setup.py``)."""
    return [_source(name) for name in COMPILED_MODULES]


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class _SourceFirst:
    """A meta path finder that loads the core's modules from their ``.py`` files."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in COMPILED_MODULES:
            return None
        return importlib.util.spec_from_file_location(name, _ROOT / _source(name))


def use_pure_python() -> None:
    """Make this process import the core from its Python files (before any of them is imported)."""
    if not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


def stale_modules(root: Path = _ROOT) -> list[str]:
    """Core modules whose ``.py`` file is newer than the compiled group: an edit since the last
    build (an editable install compiles beside the sources). Running the build would run code
    that is no longer in the source, so the caller falls back to Python. The group's shared
    library holds all the compiled code (each module's own extension is a small loader that a
    rebuild may leave as it was), so it is the one compared."""
    built = sorted(root.glob(f"{GROUP_NAME}__mypyc.*.so"))
    if not built:
        return []
    try:
        built_at = built[0].stat().st_mtime
    except OSError:
        return []
    stale = []
    for name in COMPILED_MODULES:
        try:
            if (root / _source(name)).stat().st_mtime > built_at + _MTIME_SLACK_S:
                stale.append(name)
        except OSError:
            pass
    return stale


def choose_core() -> None:
    """At the first import of ``services``: the Python core when asked for, or when a compiled
    module is stale (with one line on stderr saying so); the compiled one otherwise."""
    if pure_requested():
        use_pure_python()
        return
    stale = stale_modules()
    if stale:
        use_pure_python()
        print(f"goose-ingest: the compiled core is older than {_source(stale[0])}; running the "
              f"Python core (reinstall to rebuild it: pip install -e .)", file=sys.stderr)


def loaded_kind() -> str:
    """``compiled``, ``pure`` or ``mixed``: how the core modules imported so far were loaded."""
    loaded = [sys.modules[name] for name in COMPILED_MODULES if name in sys.modules]
    compiled = [m for m in loaded if not (getattr(m, "__file__", None) or "").endswith(".py")]
    if not loaded or not compiled:
        return "pure"
    return "compiled" if len(compiled) == len(loaded) else "mixed"


def core_kind() -> str:
    """How this process runs the core: imports all of it, then answers as ``loaded_kind``."""
    for name in COMPILED_MODULES:
        importlib.import_module(name)
    return loaded_kind()
