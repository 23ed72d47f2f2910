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


# ---------------------------------------------------------------------------------------------
# Issue 33 item 4: the codec and the layering finished.
CORE = ("services.normalizer", "services.sequencer", "services.redaction")
# The field names of a topic entry: contracts/topics.py is the one place that spells them as bytes
# (the encoder and decoder every writer and reader uses).
TOPIC_FIELD_BYTES = {b"eventId", b"recordId", b"runId", b"data", b"state", b"type"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _is_command(path: Path) -> bool:
    return path.stem == "command" or path.stem.endswith("_command")


def _ours(path: Path) -> list[str]:
    """The project's modules `path` imports (relative imports resolved), at any depth of the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.stem != "__init__":
        package = package[:-1]
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out.append(module)
            out.extend(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return [m for m in out if m.split(".")[0] in ("services", "contracts")]


def test_topic_entries_are_encoded_and_decoded_only_through_contracts_topics():
    """No module of services/ spells a topic entry's field names as bytes: it writes with
    `TopicEntry.to_fields` / `event_fields` / `record_fields` and reads with `TopicEntry.from_fields`
    (contracts/topics.py), so a change of the entry's layout is one change."""
    found = []
    for path in _py_files("services"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in TOPIC_FIELD_BYTES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_pure_core_imports_only_the_core_and_the_contracts():
    """normalizer, sequencer (with rebuild, beside it) and redaction import no shell module (their
    `command.py` is the shell's face of them, and may)."""
    offenders = []
    for package in CORE:
        for path in _py_files(package.replace(".", "/")):
            if _is_command(path):
                continue
            offenders += [(path.relative_to(REPO).as_posix(), m) for m in _ours(path)
                          if not m.startswith(("contracts", *CORE))]
    assert offenders == []


def test_the_settings_import_only_the_contracts_and_the_core():
    """The settings are read by every process, the tap included: they import no shell module (the
    metrics' tool-label check lives in contracts/tool_labels.py for them)."""
    path = REPO / "services" / "settings.py"
    assert [m for m in _ours(path) if not m.startswith(("contracts", *CORE))] == []


def test_no_library_module_imports_a_command_module():
    """Commands sit on top: the archive reprocesses with the sequencer's rebuild
    (services/sequencer/rebuild.py), not with replay's command."""
    commands = {_module_name(p) for p in _py_files("services") if _is_command(p)}
    offenders = [(p.relative_to(REPO).as_posix(), m) for p in _py_files("services") if not _is_command(p)
                 and p.name != "cli.py" for m in _ours(p) if m in commands]
    assert offenders == []
    # and nothing reaches into `services/replay/` but its own command
    assert [(p.relative_to(REPO).as_posix(), m) for p in _py_files("services") for m in _ours(p)
            if m.startswith("services.replay") and not p.is_relative_to(REPO / "services" / "replay")] == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's nodes, found once each (graph small: a DFS per node)."""
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                key = tuple(sorted(path))
                if key not in seen:
                    seen.add(key)
                    found.append([*path, start])
            elif nxt not in path and nxt > start:
                walk(start, nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def test_contracts_have_no_import_circle():
    """Imports inside functions count: a circle that only lazy imports keep from failing is still
    one module that cannot be read without the other."""
    modules = {_module_name(p): p for p in _py_files("contracts")}
    graph = {name: {m for m in _ours(path) if m in modules and m != name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_and_the_import_reader_see_a_circle(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    f = REPO / "contracts" / "asyncapi.py"
    assert "contracts.jsonschema" in _ours(f) and "contracts.generate" not in _ours(f)


def test_stream_ids_are_parsed_only_by_contracts_stream_ids():
    """One stream-id type (contracts/stream_ids.py StreamId): no other module splits an id at its
    `-` (a `.partition("-")`, `.split("-")`), so what counts as an id, and its order, is decided once."""
    found = []
    for path in [*_py_files("services"), *_py_files("contracts")]:
        rel = path.relative_to(REPO).as_posix()
        if rel == "contracts/stream_ids.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("partition", "rpartition", "split", "rsplit") and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "-"):
                found.append(f"{rel}:{node.lineno}")
    assert found == []
