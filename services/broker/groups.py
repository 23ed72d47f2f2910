"""Moved to services/streams/groups.py (the consumer skeleton); these names stay importable here
for code written against the old place."""

from __future__ import annotations

from services.streams.groups import create_group, ensure_groups, guard_missing_group

__all__ = ["create_group", "ensure_groups", "guard_missing_group"]
