"""Tool classification (contract 3.5): a goose tool call becomes zero or more typed events.

``classify_tool`` returns the kind fields of each event (with "type" first), ``[]`` when the
call is consumed (extension ``todo``), or ``None`` when the call is unmapped (the caller
emits ``unknown`` with the response block). Success and exit code are added by the caller.
"""

from __future__ import annotations

from typing import Any

from services.normalizer.paths import normalize_path
from services.normalizer.shell import classify_shell

PATH_KEYS = ("path", "file_path", "filePath", "filepath", "abs_path", "absolutePath", "source")
START_KEYS = ("offset", "start_line", "startLine", "line")
END_KEYS = ("end_line", "endLine")
COUNT_KEYS = ("limit", "line_count", "lineCount", "num_lines", "numLines")
SHELL_KEYS = ("command", "cmd", "script")
QUERY_KEYS = ("pattern", "query", "regex", "glob", "search", "searchText", "q")
SEARCH_PATH_KEYS = ("path", "dir", "directory", "cwd", "scope")
LIST_PATH_KEYS = ("path", "dir", "directory")
SKILL_NAME_KEYS = ("name", "skill", "skill_name", "skillName")
SKILL_PATH_KEYS = ("path", "file_path", "filePath", "skillPath")
DIR_KEYS = ("dir", "directory")

EDITOR_READ = frozenset(("view", "read"))
EDITOR_WRITE = frozenset(("write", "create", "overwrite", "edit", "str_replace", "insert", "move", "rename", "delete"))


def first_string(args: dict, keys: tuple[str, ...]) -> str | None:
    """The first non-empty string among `keys` (an empty string counts as missing)."""
    for key in keys:
        value = args.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _first_int(args: dict, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        if key in args:
            value = args[key]
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _path(args: dict, keys: tuple[str, ...]) -> str | None:
    value = first_string(args, keys)
    return normalize_path(value) if value is not None else None


def _read(args: dict) -> list[dict] | None:
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


def _write(args: dict) -> list[dict] | None:
    path = _path(args, PATH_KEYS)
    return None if path is None else [{"type": "write", "path": path}]


def _text_editor(args: dict) -> list[dict] | None:
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


def _shell(args: dict) -> list[dict] | None:
    command = first_string(args, SHELL_KEYS)
    if command is None:
        return None
    ops = classify_shell(command)
    if ops is None:
        return [{"type": "command", "command": command}]
    return ops


def _search(args: dict) -> list[dict] | None:
    query = first_string(args, QUERY_KEYS)
    if query is None:
        return None
    event: dict[str, Any] = {"type": "search", "query": query}
    path = _path(args, SEARCH_PATH_KEYS)
    if path is not None:
        event["path"] = path
    return [event]


def _list(args: dict) -> list[dict] | None:
    event: dict[str, Any] = {"type": "list"}
    path = _path(args, LIST_PATH_KEYS)
    if path is not None:
        event["path"] = path
    return [event]


def _skill(args: dict) -> list[dict] | None:
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


def split_name(name: str) -> tuple[str | None, str]:
    """(extension, base name): split at the first `__`; no `__` means no extension."""
    ext, sep, base = name.partition("__")
    return (ext, base) if sep else (None, name)


def classify_tool(name: str, args: Any) -> list[dict] | None:
    ext, base = split_name(name)
    if ext == "todo":
        return []
    handler = _BY_BASE.get(base.lower())
    if handler is None:
        return None
    # goose omits `arguments` when a call has none, and wraps non-object ones as {"value": ...}.
    if args is None:
        args = {}
    elif not isinstance(args, dict):
        args = {"value": args}
    return handler(args)
