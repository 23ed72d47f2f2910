"""The `tool` label's vocabulary and the check of GOOSE_INGEST_METRIC_TOOLS (issue 33 item 4).

Pure: the settings validate GOOSE_INGEST_METRIC_TOOLS with it, and the worker's metrics
(services/metrics/registry.py) label with it. It lives below both so that the settings never
import the metrics (prometheus_client) to check one setting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

OTHER = "other"

# The contract's base tool names (spec §3.5), matched case-insensitively.
TOOL_BASE_NAMES: tuple[str, ...] = (
    "read",
    "read_image",
    "write",
    "edit",
    "text_editor",
    "shell",
    "grep",
    "glob",
    "list",
    "tree",
    "load_skill",
    "skill",
)
TOOL_LABELS: tuple[str, ...] = TOOL_BASE_NAMES + ("mcp", OTHER)

_BASE_NAMES = frozenset(TOOL_BASE_NAMES)
# GOOSE_INGEST_METRIC_TOOLS: each listed name adds len(TOOL_OUTCOMES) series and three runs/hosts gauges per worker, so the
# list is capped; names are label values shown on dashboards and in alert notifications, so they are
# plain identifiers (MCP tool names are: `server__tool`, `mcp__server__tool`), never free text.
METRIC_TOOLS_MAX = 32
METRIC_TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_RESERVED_TOOL_LABELS = frozenset(("mcp", OTHER))


def tool_label(name: object, named: frozenset[str] = frozenset()) -> str:
    """Bounded `tool` label for a tool name exactly as goose sent it.

    The base name (after the first ``__``, or the whole name) lower-cased when it is one of the
    contract's base names; else the name itself when the operator listed it (`named`,
    GOOSE_INGEST_METRIC_TOOLS, matched exactly); else ``"mcp"`` for any other extension tool
    (``ext__name``); else ``"other"``.
    """
    if not isinstance(name, str):
        return OTHER
    ext, sep, base = name.partition("__")
    if not sep:
        base = ext
    lowered = base.lower()
    if lowered in _BASE_NAMES:
        return lowered
    if name in named:
        return name
    return "mcp" if sep else OTHER


def metric_tool_problem(name: str) -> str | None:
    """Why `name` cannot be a GOOSE_INGEST_METRIC_TOOLS entry (None: it can). The name itself is
    only quoted once it is known to be a plain identifier."""
    if not METRIC_TOOL_NAME.fullmatch(name):
        return ("not a tool name (letters, digits, '_', '.', '-', starting with a letter or digit, "
                "at most 64 characters)")
    if name in _RESERVED_TOOL_LABELS:
        return f"{name!r} is a label of its own already"
    base = tool_label(name)
    if base in _BASE_NAMES:
        return f"{name!r} is the contract tool {base!r}, labelled {base!r} already"
    return None


def metric_tools_problem(names: Iterable[str]) -> str | None:
    """Why this list cannot be GOOSE_INGEST_METRIC_TOOLS (None: it can): the cap, then each name."""
    names = list(names)
    if len(names) > METRIC_TOOLS_MAX:
        return f"{len(names)} tools, at most {METRIC_TOOLS_MAX} (each one adds series to every worker)"
    for i, name in enumerate(names):
        problem = metric_tool_problem(name)
        if problem is not None:
            return f"entry {i + 1}: {problem}"
    return None
