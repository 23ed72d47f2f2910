"""Backfill from goose's sessions.db (pure reading here; publishing lives elsewhere)."""

from .sessions_db import (
    MAX_SCHEMA,
    MIN_SCHEMA,
    SessionInfo,
    SessionsDbError,
    SourceMessage,
    list_sessions,
    open_readonly,
    read_messages,
    schema_version,
    usage_complete,
    usage_complete_with_source,
)

__all__ = [
    "MAX_SCHEMA",
    "MIN_SCHEMA",
    "SessionInfo",
    "SessionsDbError",
    "SourceMessage",
    "list_sessions",
    "open_readonly",
    "read_messages",
    "schema_version",
    "usage_complete",
    "usage_complete_with_source",
]
