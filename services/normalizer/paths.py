"""Lexical normalisation of absolute paths from structured tool inputs (contract 3.5)."""

from __future__ import annotations


def normalize_path(path: str) -> str:
    """Collapse `//`, drop `.`, resolve `..` and strip a trailing `/` of an absolute path.

    Relative paths are returned verbatim. Purely lexical: no file system access, so
    `..` through a symlink resolves as written.
    """
    if not path.startswith("/"):
        return path
    parts: list[str] = []
    for part in path.split("/"):
        if part == "" or part == ".":
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)
