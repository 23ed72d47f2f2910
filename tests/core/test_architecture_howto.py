"""docs/architecture.md's "How to add a format, how to change the commit" against the tree.

Every path the section names exists, and its lists name the places the tree's own registries say
a format or the commit lives in: a file moved or a registry added without the guide following fails.
"""

from __future__ import annotations

import re
from pathlib import Path

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
