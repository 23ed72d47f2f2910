"""Tool classification (contract 3.5 and extension 5.3): a tool call becomes zero or more events.

``classify_tool`` (goose, 3.5) and ``classify_extended`` (3.5 plus the C-T rows, used for Claude
Code and Codex MCP calls) return the kind fields of each event (with "type" first), ``[]`` when
the call is consumed (extension ``todo``, or a C-T7 name), or ``None`` when the call is unmapped
(the caller emits ``unknown``). Success and exit code are added by the caller. The format
modules classify through a ``HandlerMemo`` of ``tool_handler`` / ``extended_handler``, which
gives the same results (a property test checks it).

MCP tool names live here too, with the rules they feed: Claude Code writes an MCP tool as
``mcp__<server>__<tool>`` and Codex's labels are built the same way (X-S3); the prefix is
stripped before the 3.5 + C-T lookups (5.3). Both formats classify through one ``classify_mcp``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.normalizer.paths import normalize_path
from services.normalizer.shell import shell_kinds

PATH_KEYS = ("path", "file_path", "filePath", "filepath", "abs_path", "absolutePath", "source")
START_KEYS = ("offset", "start_line", "startLine", "line")
END_KEYS = ("end_line", "endLine")
COUNT_KEYS = ("limit", "line_count", "lineCount", "num_lines", "numLines")
# The kind fields of a classified call's events (read only: shared with the shell classifier's cache).
Kinds = Sequence[Mapping[str, Any]]

SHELL_KEYS = ("command", "cmd", "script")
QUERY_KEYS = ("pattern", "query", "regex", "glob", "search", "searchText", "q")
SEARCH_PATH_KEYS = ("path", "dir", "directory", "cwd", "scope")
LIST_PATH_KEYS = ("path", "dir", "directory")
SKILL_NAME_KEYS = ("name", "skill", "skill_name", "skillName")
SKILL_PATH_KEYS = ("path", "file_path", "filePath", "skillPath")
DIR_KEYS = ("dir", "directory")
NOTEBOOK_PATH_KEYS = ("notebook_path", "notebookPath", *PATH_KEYS)

EDITOR_READ = frozenset(("view", "read"))
EDITOR_WRITE = frozenset(("write", "create", "overwrite", "edit", "str_replace", "insert", "move", "rename", "delete"))


def first_string(args: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first non-empty string among `keys` (an empty string counts as missing)."""
    for key in keys:
        value = args.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _first_int(args: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        if key in args:
            value = args[key]
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _path(args: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    value = first_string(args, keys)
    return normalize_path(value) if value is not None else None


def _read(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    path = _path(args, PATH_KEYS)
    if path is None:
        return None
    event: dict[str, Any] = {"type": "read", "path": path}
    start = _first_int(args, START_KEYS)
    if start is not None and start >= 1:
        event["startLine"] = start
    else:
        start = None
    end = _first_int(args, END_KEYS)
    if end is None and start is not None:
        count = _first_int(args, COUNT_KEYS)
        if count is not None and count >= 1:
            end = start + count - 1
    # An end before the start (or below 1) is not a range a reader can use.
    if end is not None and end >= 1 and (start is None or end >= start):
        event["endLine"] = end
    return [event]


def _write(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    path = _path(args, PATH_KEYS)
    return None if path is None else [{"type": "write", "path": path}]


def _text_editor(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    command = args.get("command")
    if not isinstance(command, str):
        command = args.get("cmd")
    if not isinstance(command, str):
        return None
    if command in EDITOR_READ:
        return _read(args)
    if command in EDITOR_WRITE:
        return _write(args)
    return None


def _shell(args: dict[str, Any]) -> Kinds | None:
    command = first_string(args, SHELL_KEYS)
    if command is None:
        return None
    return shell_kinds(command) or ({"type": "command", "command": command},)


def _search(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    query = first_string(args, QUERY_KEYS)
    if query is None:
        return None
    event: dict[str, Any] = {"type": "search", "query": query}
    path = _path(args, SEARCH_PATH_KEYS)
    if path is not None:
        event["path"] = path
    return [event]


def _list(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    event: dict[str, Any] = {"type": "list"}
    path = _path(args, LIST_PATH_KEYS)
    if path is not None:
        event["path"] = path
    return [event]


def _skill(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    name = first_string(args, SKILL_NAME_KEYS)
    path = first_string(args, SKILL_PATH_KEYS)
    if path is None:
        directory = first_string(args, DIR_KEYS)
        if directory is not None:
            path = directory.rstrip("/") + "/SKILL.md" if directory.rstrip("/") else "/SKILL.md"
        elif name is not None:
            path = f"skills/{name}/SKILL.md"
        else:
            return None
    event: dict[str, Any] = {"type": "skill", "path": normalize_path(path)}
    if name is not None:
        event["skillName"] = name
    return [event]


_BY_BASE = {
    "read": _read,
    "read_image": _read,
    "write": _write,
    "edit": _write,
    "text_editor": _text_editor,
    "shell": _shell,
    "grep": _search,
    "glob": _search,
    "list": _list,
    "tree": _list,
    "load_skill": _skill,
    "skill": _skill,
}


def _notebook_path(args: dict[str, Any]) -> str | None:
    return _path(args, NOTEBOOK_PATH_KEYS)


def _notebook_write(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    path = _notebook_path(args)
    return None if path is None else [{"type": "write", "path": path}]


def _notebook_read(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    # C-T4: the path as C-T3, the lines as a read's.
    path = _notebook_path(args)
    if path is None:
        return None
    return _read({**args, "path": path})


def _powershell(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    # C-T6: never reclassified, the 3.6 shell rules are POSIX-only.
    command = first_string(args, SHELL_KEYS)
    return None if command is None else [{"type": "command", "command": command}]


# Extension 5.3: the rows C-T1..C-T6 added to the 3.5 table.
_BY_BASE_EXTENDED = {
    **_BY_BASE,
    "bash": _shell,
    "multiedit": _write,
    "notebookedit": _notebook_write,
    "notebookread": _notebook_read,
    "ls": _list,
    "powershell": _powershell,
}
# C-T7: consumed when the name has no extension.
CONSUMED_BASES = frozenset(
    ("todowrite", "todoread", "taskcreate", "taskget", "taskupdate", "tasklist", "structuredoutput")
)


def split_name(name: str) -> tuple[str | None, str]:
    """(extension, base name): split at the first `__`; no `__` means no extension."""
    ext, sep, base = name.partition("__")
    return (ext, base) if sep else (None, name)


# What a call's classification does, once its arguments are an object: a pure function of the
# tool name alone, so a name's handler can be worked out once (``HandlerMemo``).
Handler = Callable[[dict[str, Any]], Kinds | None]


def _consumed(args: dict[str, Any]) -> Kinds:
    return []


def _unmapped(args: dict[str, Any]) -> None:
    return None


def tool_handler(name: str) -> Handler:
    """3.5: the handler of a tool name (goose)."""
    ext, base = split_name(name)
    if ext == "todo":
        return _consumed
    return _BY_BASE.get(base.lower(), _unmapped)


def extended_handler(name: str) -> Handler:
    """3.5 with the C-T rows, for a name already stripped of a leading `mcp__`."""
    ext, base = split_name(name)
    lowered = base.lower()
    if ext == "todo" or (ext is None and lowered in CONSUMED_BASES):
        return _consumed
    return _BY_BASE_EXTENDED.get(lowered, _unmapped)


def classify_tool(name: str, args: Any) -> Kinds | None:
    """The reference of 3.5 (goose); the mapping uses the same through a ``HandlerMemo``."""
    return tool_handler(name)(_arguments(args))


def extended_consumed(name: str) -> bool:
    """Consumed by 3.5 (extension `todo`) or C-T7 (a bare checklist/plumbing tool name)."""
    return extended_handler(name) is _consumed


def classify_extended(name: str, args: Any) -> Kinds | None:
    """The reference of 3.5 with the C-T rows, for a name already stripped of a leading `mcp__`."""
    return extended_handler(name)(_arguments(args))


def _arguments(args: Any) -> dict[str, Any]:
    # goose omits `arguments` when a call has none, and wraps non-object ones as {"value": ...}.
    if args is None:
        return {}
    if not isinstance(args, dict):
        return {"value": args}
    return args


class HandlerMemo:
    """Classification with each tool name's handler worked out once (a run uses a handful of
    names, each thousands of times), not by splitting and lowering the name on every call.

    Bounded: forgotten all at once when full, so made-up names cost only the lookup again.
    Safe to share: the handlers are pure and a name always gets the same one.
    """

    __slots__ = ("_handler_of", "_handlers", "_most")

    def __init__(self, handler_of: Callable[[str], Handler], most: int = 1024) -> None:
        self._handler_of = handler_of
        self._handlers: dict[str, Handler] = {}
        self._most = most

    def classify(self, name: str, args: Any) -> Kinds | None:
        handler = self._handlers.get(name)
        if handler is None:
            handler = self._handler_of(name)
            if len(self._handlers) >= self._most:
                self._handlers.clear()
            self._handlers[name] = handler
        # ``_arguments``, inline: one call fewer on every classification.
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            args = {"value": args}
        return handler(args)


# ----------------------------------------------------------------------- MCP
MCP_PREFIX = "mcp__"


def strip_mcp(name: str) -> str:
    """5.3: a leading `mcp__` is stripped before the 3.5 lookups."""
    return name[len(MCP_PREFIX) :] if name.startswith(MCP_PREFIX) else name


def mcp_label(server: str, tool: str) -> str:
    """X-S3: the tool name of an MCP call given as server and tool (Claude Code's own spelling)."""
    return f"{MCP_PREFIX}{server}__{tool}"


def mcp_handler(name: str) -> Handler:
    """The 3.5 + C-T handler of a Claude Code (or Codex MCP) tool name, as the CLI wrote it."""
    return extended_handler(strip_mcp(name))


def mcp_consumed(name: str) -> bool:
    return extended_consumed(strip_mcp(name))


# Classification of a Claude Code or Codex MCP call (name as written), each name's handler worked
# out once; one memo for both formats (a process runs runs of either).
classify_mcp = HandlerMemo(mcp_handler).classify
