"""docs/architecture.md's "How to add a format, how to change the commit", and the README's map of
the code ("Where things are"), against the tree.

Every path the section names exists, and its lists name the places the tree's own registries say
a format or the commit lives in: a file moved or a registry added without the guide following fails.
So does a file the README's map names that is not there (a module split or renamed, a test renamed).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contracts.formats import AGENT_FORMATS

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## How to add a format, how to change the commit"


def _section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert HEADING in text
    body = text.split(HEADING, 1)[1]
    return body.split("\n## ", 1)[0]


def _paths(text: str) -> set[str]:
    quoted = re.findall(r"`([^`\s]+)`", text)
    return {q for q in quoted if "/" in q and "<" not in q and not q.startswith("python")}


def test_every_path_the_section_names_exists():
    paths = _paths(_section())
    assert len(paths) >= 12
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that are not in the tree: {missing}"


def test_the_format_list_names_every_place_a_format_is_registered():
    section = _section()
    formats_part = section.split("**Change the commit**", 1)[0]
    named = _paths(formats_part)
    for needed in ("contracts/formats.py", "contracts/events.py", "services/normalizer/formats/__init__.py",
                   "services/native.py", "deploy/grafana/dashboard.json", "services/normalizer/machinery.py",
                   "tests/core/test_formats_registry.py"):
        assert needed in named, needed
    # The model module it points to is one of the formats' modules.
    modules = {f"services/normalizer/formats/{f.module}.py" for f in AGENT_FORMATS}
    assert named & modules


def test_the_commit_list_names_both_halves_and_the_shared_feed():
    commit_part = _section().split("**Change the commit**", 1)[1]
    named = _paths(commit_part)
    for needed in ("services/worker/commit.py", "services/worker/commit.lua", "services/worker/processor.py",
                   "services/sequencer/feed.py", "services/sequencer/rebuild.py", "tests/worker/test_commit_lua_names.py"):
        assert needed in named, needed
    lua = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "services" / "worker").glob("*.lua"))
    assert set(lua) <= named, "a worker script the guide does not name"


# --- the README's map of the code ---------------------------------------------------------------
MAP_HEADING = "## Where things are"
_FILE_NAME = re.compile(r"^[\w.-]+\.[a-z]+$")  # `feed.py`, `commit.lua`: a file beside the cell's last path


def _map_section() -> str:
    text = (ROOT / "README.md").read_text()
    assert MAP_HEADING in text
    return text.split(MAP_HEADING, 1)[1].split("\n## ", 1)[0]


def map_paths(text: str) -> list[tuple[str, str | None]]:
    """(path, name or None) of every file or directory a passage of the map names, line by line.

    A table cell names a directory once and its files by their names after it
    (`services/worker/housekeeping.py`; raw shards ...: `damage.py`): a bare file name is looked up
    beside the last path named before it on that line, then at the root (`setup.py`). A
    `path::name` also names what the file defines. Commands (`python -m ...`), placeholders
    (`<name>`), identifiers (`RunSequencer`) and settings are not paths."""
    found: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        base = ""
        for token in re.findall(r"`([^`]+)`", line):
            if any(c.isspace() for c in token) or "<" in token:
                continue
            path, _, name = token.partition("::")
            if "/" in path:
                base = path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
            elif _FILE_NAME.match(path) and base:
                if not (ROOT / base / path).exists() and (ROOT / path).exists():
                    base = ""
                path = base + path
            else:
                continue
            found.append((path, name or None))
    return found


def test_every_path_the_readme_map_names_exists():
    named = map_paths(_map_section())
    assert len(named) >= 60  # the parse reads the real table: most of its cells name several files
    missing = sorted(p for p, _ in named if not (ROOT / p).exists())
    assert not missing, f"README.md's map names paths that are not in the tree: {missing}"
    undefined = sorted(f"{p}::{n}" for p, n in named
                       if n and not re.search(rf"^\s*(?:async )?def {re.escape(n)}\b", (ROOT / p).read_text(), re.M))
    assert not undefined, f"README.md's map names tests that are not defined: {undefined}"


@pytest.mark.parametrize(("line", "expected"), [
    ("| x | `services/worker/housekeeping.py`; more: `damage.py` |",
     [("services/worker/housekeeping.py", None), ("services/worker/damage.py", None)]),
    ("| x | `services/native.py`, `setup.py` |", [("services/native.py", None), ("setup.py", None)]),
    ("| x | `services/tap/` (`gone.py`: a module that moved) |", [("services/tap/", None), ("services/tap/gone.py", None)]),
    ("(`tests/core/test_docs.py::test_gone` checks it) `python -m contracts.generate` `RunSequencer`",
     [("tests/core/test_docs.py", "test_gone")]),
])
def test_the_map_parse_resolves_names_as_a_reader_would(line, expected):
    assert map_paths(line) == expected
