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
from services.tap.launchers import format_of_command
from tests.support.fixtures import SHARED

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
               "services.normalizer.paths", "services.normalizer.timefmt", "services.normalizer.error_classes",
               "contracts.formats"}
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
    for rtype in fmt.keyed_record_types:
        assert fmt.record_key
        assert detect_format({"type": rtype, fmt.record_key: "s"}) == fmt.name
        # without its key (or with a non-string one) the type never names it: shared types stay goose's
        assert detect_format({"type": rtype}) != fmt.name
        assert detect_format({"type": rtype, fmt.record_key: 1}) != fmt.name


def test_no_detection_rule_of_a_row_is_anothers():
    """F3 must be unambiguous: no record type or prefix decides for two rows."""
    seen: dict[str, str] = {}
    for fmt in AGENT_FORMATS:
        for rtype in (*fmt.record_types, *fmt.subtyped_record_types):
            assert seen.setdefault(rtype, fmt.name) == fmt.name, rtype
    keyed = [(t, f.record_key) for f in AGENT_FORMATS for t in f.keyed_record_types]
    assert len(keyed) == len(set(keyed))
    # a keyed type's key is no other row's (goose and Claude records never carry `sessionID`,
    # and an `init` type is no one else's)
    keys = {f.record_key for f in AGENT_FORMATS if f.record_key}
    assert len(keys) == len([f for f in AGENT_FORMATS if f.record_key])


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


def _format_words() -> set[str]:
    """Every name that identifies a format other than the default one (goose is also the project's
    own name and its sessions importer's, so it is not looked for)."""
    words: set[str] = set()
    for fmt in AGENT_FORMATS:
        if fmt.name != DEFAULT_FORMAT:
            words |= {fmt.name, fmt.product, *fmt.agent_products, *fmt.commands, *fmt.packages}
    return words


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings (what the code uses, not what it says)."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_no_format_is_named_outside_the_registry_and_its_module():
    """Registry, not scatter: the tap, workers, metrics, OTLP mapping, PostgreSQL views, archive and
    demo read contracts/formats.py; only a format's own module may spell its names."""
    words = _format_words()
    found = []
    for path in sorted((ROOT / "services").rglob("*.py")):
        if path.parent == FORMATS_DIR:
            continue
        found += [f"{path.relative_to(ROOT)}:{line} {value!r}" for line, value in _code_strings(path) if value in words]
    for path in sorted((ROOT / "services").rglob("*.sql")):
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)} '{w}'" for w in words if f"'{w}'" in text]
    assert not found, found


def test_the_dashboard_names_formats_only_in_its_format_variable():
    text = (ROOT / "deploy" / "grafana" / "dashboard.json").read_text()
    for fmt in AGENT_FORMATS:
        if fmt.name != DEFAULT_FORMAT:
            assert text.count(f'"{fmt.name}"') + text.count(f",{fmt.name},") == 1, fmt.name


@pytest.mark.parametrize("fmt", AGENT_FORMATS, ids=lambda f: f.name)
def test_the_otlp_agent_and_provider_names_come_from_the_row(fmt):
    from services.export.otlp.mapping import agent_name, provider_name

    assert agent_name(None, fmt.name) == (fmt.product, None)
    assert agent_name("custom/1.0", fmt.name) == ("custom", "1.0")
    assert provider_name(fmt.name) == (fmt.provider or None)
    assert provider_name(None) is None and provider_name("aider") is None


@pytest.mark.parametrize("fmt", AGENT_FORMATS, ids=lambda f: f.name)
def test_every_row_has_its_demo_transcript(fmt):
    if fmt.name != DEFAULT_FORMAT:
        assert (SHARED / "fixtures" / fmt.name / fmt.demo_transcript).is_file()
