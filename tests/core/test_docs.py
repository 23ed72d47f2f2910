"""The README keeps its promises: the two opening commands, and every setting documented."""

from __future__ import annotations

import re

from services.settings import Settings
from tests.support.fixtures import REPO

README = (REPO / "README.md").read_text()


def test_readme_opens_with_the_run_and_test_commands_and_ci_runs_the_test_command():
    block = re.search(r"```sh\n(.*?)\n```", README, re.S).group(1).splitlines()
    assert "goose-ingest demo" in block[0]
    assert "pytest" in block[1]
    assert block[1] in (REPO / ".ci" / "run").read_text()


def test_every_setting_is_in_the_readme():
    documented = set(re.findall(r"^\| `([A-Z_]+)`", README, re.M))
    documented |= {n for row in re.findall(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \|", README, re.M)
                   for n in re.findall(r"`([A-Z_]+)`", row)}
    fields = {name.upper() for name in Settings.model_fields}
    assert fields - documented == set()


def _section(title: str) -> str:
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert found, f"no section {title!r} in the README"
    return found.group(1)


def _parser_commands() -> set[str]:
    """Every command of the CLI's parser: `tap`, and `export otlp` for those with commands of their own."""
    import argparse

    from services.cli import build_parser

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(found[0].choices) if found else {}

    out = set()
    for name, parser in subparsers(build_parser()).items():
        inner = subparsers(parser)
        out |= {f"{name} {sub}" for sub in inner} if inner else {name}
    return out


def test_the_readme_commands_table_is_the_cli_parsers_commands():
    rows = [line.split(" | ")[0] for line in _section("Commands").splitlines() if line.startswith("| `")]
    documented = set()
    for first_cell in rows:
        for usage in re.findall(r"`([^`]+)`", first_cell):
            words = usage.split()
            documented.add(" ".join(words[:2]) if words[0] in ("export", "tokens") else words[0])
    assert documented == _parser_commands()


def test_the_readme_documents_list_is_docs():
    listed = set(re.findall(r"^- `(docs/[^`]+\.md)`", _section("Documents"), re.M))
    assert listed == {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
