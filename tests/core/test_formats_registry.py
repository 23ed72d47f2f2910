"""The agent formats' table (contracts/formats.py) against every place that names a format.

Adding a format is one row of that table plus one module under services/normalizer/formats/ and
one line of the compiled-core list: these tests fail until the contract's ``Literal``, the
registry, the compiled modules, the tap, the workers' detection, the demo and the Grafana
dashboard all agree with the table.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from contracts.events import FORMATS, InputFormat
from contracts.formats import AGENT_FORMATS, BY_NAME, DEFAULT_FORMAT, FORMAT_NAMES
from services import native
from services.metrics.registry import FORMAT_LABELS, OTHER
from services.normalizer.formats import RULES
from services.normalizer.run_normalizer import RunNormalizer, detect_format, format_from_agent
from services.quickstart.command import OTHER_FORMAT_FIXTURES
from services.tap.command import format_of_command

ROOT = Path(__file__).resolve().parents[2]
FORMATS_DIR = ROOT / "services" / "normalizer" / "formats"


def test_the_contracts_literal_is_the_table():
    assert FORMATS == FORMAT_NAMES
    assert InputFormat.__args__ == FORMAT_NAMES  # type: ignore[attr-defined]
    assert DEFAULT_FORMAT in FORMAT_NAMES


def test_every_row_has_one_module_and_the_registry_is_the_table():
    assert list(RULES) == list(FORMAT_NAMES)
    modules = sorted(p.stem for p in FORMATS_DIR.glob("*.py") if p.stem != "__init__")
    assert modules == sorted(f.module for f in AGENT_FORMATS)
    for fmt in AGENT_FORMATS:
        assert RULES[fmt.name].product == fmt.product
        assert RULES[fmt.name].record.__module__ == f"services.normalizer.formats.{fmt.module}"


def test_every_format_module_is_compiled_and_nothing_else_of_formats_is_missing():
    compiled = {m for m in native.COMPILED_MODULES if m.startswith("services.normalizer.formats.")}
    assert compiled == {f"services.normalizer.formats.{f.module}" for f in AGENT_FORMATS}


@pytest.mark.parametrize("fmt", AGENT_FORMATS, ids=lambda f: f.name)
def test_a_format_module_imports_only_the_shared_machinery(fmt):
    allowed = {"services.normalizer.machinery", "services.normalizer.tools", "services.normalizer.shell",
               "services.normalizer.paths", "services.normalizer.error_classes", "contracts.formats"}
    tree = ast.parse((FORMATS_DIR / f"{fmt.module}.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    ours = {name for name in imported if name.split(".")[0] in ("services", "contracts", "tests")}
    assert ours <= allowed, f"{fmt.module} imports {sorted(ours - allowed)}"


def test_the_shared_machinery_imports_no_format():
    tree = ast.parse((ROOT / "services" / "normalizer" / "machinery.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.startswith("services.normalizer.formats") or m.endswith("run_normalizer")}


@pytest.mark.parametrize("fmt", AGENT_FORMATS, ids=lambda f: f.name)
def test_the_tap_and_the_workers_recognise_every_row(fmt):
    for command in fmt.commands:
        assert format_of_command([command, "--flag"]) == fmt.name
        assert format_of_command(["env", "A=1", f"/usr/bin/{command}"]) == fmt.name
    for package in fmt.packages:
        assert format_of_command(["npx", "-y", f"{package}@1.0.0", "exec"]) == fmt.name
    for product in fmt.agent_products:
        assert format_from_agent(f"{product.upper()}/1.2") == fmt.name
    for rtype in fmt.record_types:
        assert detect_format({"type": rtype}) == fmt.name
    for rtype in fmt.subtyped_record_types:
        assert detect_format({"type": rtype, "subtype": "x"}) == fmt.name
        assert detect_format({"type": rtype}) == DEFAULT_FORMAT
    for prefix in fmt.type_prefixes:
        assert detect_format({"type": f"{prefix}anything"}) == fmt.name


@pytest.mark.parametrize("fmt", AGENT_FORMATS, ids=lambda f: f.name)
def test_the_exit_error_names_the_rows_product(fmt):
    events = RunNormalizer("r", fmt=fmt.name).end(1, 0, exit_code=3)
    assert events[-1]["message"] == f"{fmt.product} exited with code 3"
    assert BY_NAME[fmt.name] is fmt


def test_an_undecided_run_without_agent_is_called_by_the_default_formats_product():
    events = RunNormalizer("r").end(1, 0, exit_code=3)
    assert events[-1]["message"] == f"{BY_NAME[DEFAULT_FORMAT].product} exited with code 3"


def test_an_unknown_format_is_refused_with_the_tables_names():
    with pytest.raises(ValueError, match="one of " + ", ".join(FORMAT_NAMES)):
        RunNormalizer("r", fmt="aider")


def test_the_demo_shows_every_other_format():
    assert [name for name, _ in OTHER_FORMAT_FIXTURES] == [n for n in FORMAT_NAMES if n != DEFAULT_FORMAT]


def test_the_dashboards_format_variable_is_the_tables_formats_and_the_metrics_labels():
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    options = variables["format"]["query"].split(",")
    assert options == [*FORMAT_LABELS, OTHER]  # every value the `format` label can have
    assert options[: len(FORMAT_NAMES)] == list(FORMAT_NAMES)
