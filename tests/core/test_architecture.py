"""The layering the code promises, checked on the tree (issue 25 item 3):

- the pure core (normalizer, sequencer, redaction) and the contracts load no broker, worker or
  framework module when imported (a fresh interpreter, so nothing else has loaded them first);
- `contracts/` imports nothing from `services/`: names and vocabularies are public (AsyncAPI,
  OpenAPI, JSON Schema are generated from them), so they cannot depend on an implementation;
- no `*.command` module imports another command module: commands share code through the library
  modules, never through each other, so importing one command never pays for another's imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pipeline import REPO

FRAMEWORKS = ("redis", "faststream", "psycopg", "opentelemetry", "starlette", "uvicorn", "pyarrow", "obstore")
SHELL_PREFIXES = ("services.worker", "services.broker", "services.settings", "services.export", "services.gateway",
                  "services.archive", "services.streams", "services.tap")


def _imports(path: Path) -> list[str]:
    """Every module an `import` or `from ... import` of the file names (at any depth of the file)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def _py_files(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if ".venv" not in p.parts)


@pytest.mark.parametrize("modules", [
    "services.normalizer, services.sequencer, services.redaction",
    "contracts, contracts.events, contracts.raw, contracts.runs, contracts.keys, contracts.topics, contracts.formats",
])
def test_the_pure_core_and_the_contracts_load_no_broker_worker_or_framework_module(modules):
    code = (f"import sys, {modules}\n"
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r} "
            f"or m.startswith({SHELL_PREFIXES!r}))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{modules} loaded: {out.stdout.strip()}"


def test_contracts_import_nothing_from_services():
    offenders = [(p.relative_to(REPO).as_posix(), m) for p in _py_files("contracts") for m in _imports(p)
                 if m == "services" or m.startswith("services.")]
    assert offenders == []


def test_no_command_module_imports_another_command_module():
    commands = {p for p in _py_files("services") if p.stem == "command" or p.stem.endswith("_command")}
    assert len(commands) >= 10  # the check reads real files: every subcommand's module
    names = {".".join(p.relative_to(REPO).with_suffix("").parts): p for p in commands}
    offenders = [(name, m) for name, p in names.items() for m in _imports(p) if m in names and m != name]
    assert offenders == []


def test_the_checks_see_a_violation_when_there_is_one(tmp_path):
    """The import reader is not blind: a file with each kind of import is read as importing them."""
    f = tmp_path / "x.py"
    f.write_text("import services.worker.app\nfrom services.tap import command\n"
                 "def later():\n    from services.export.command import register\n")
    assert _imports(f) == ["services.worker.app", "services.tap", "services.export.command"]
