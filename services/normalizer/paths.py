"""Lexical normalisation of absolute paths from structured tool inputs (contract 3.5)."""

from __future__ import annotations


def normalize_path(path: str) -> str:
    """Collapse `//`, drop `.`, resolve `..` and strip a trailing `/` of an absolute path.

    Relative paths are returned verbatim. Purely lexical: no file system access, so
    `..` through a symlink resolves as written.
    """
    if not path.startswith("/"):
        return path
    # Most paths are already normal: no empty part (`//`), no `.` or `..` part (each would
    # follow a `/`), no trailing `/`. Those are returned as they are, without the split.
    if "//" not in path and "/." not in path and not path.endswith("/"):
        return path
    return _resolve(path)


def _resolve(path: str) -> str:
    """The reference: normalise an absolute path part by part."""
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
