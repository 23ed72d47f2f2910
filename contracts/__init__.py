"""The goose-ingest contract: pydantic models that are the single source of truth.

JSON Schema files in ``contracts/schemas/`` and ``contracts/asyncapi.json`` are generated
from these models (``python -m contracts.generate``); a test fails when they are stale.

The names below load on first use (PEP 562): importing one submodule for its constants (the tap
takes ``contracts.raw``'s) must not build every event and run model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contracts.events import EVENT_TYPES, TOOL_EVENT_TYPES, HarnessEvent, harness_event_adapter
    from contracts.raw import RUN_KEY_PATTERN, RawEntry
    from contracts.runs import RUN_STATES, RunRecord, run_record_adapter

_SOURCE = {
    "EVENT_TYPES": "contracts.events",
    "TOOL_EVENT_TYPES": "contracts.events",
    "HarnessEvent": "contracts.events",
    "harness_event_adapter": "contracts.events",
    "RUN_KEY_PATTERN": "contracts.raw",
    "RawEntry": "contracts.raw",
    "RUN_STATES": "contracts.runs",
    "RunRecord": "contracts.runs",
    "run_record_adapter": "contracts.runs",
}

__all__ = [
    "EVENT_TYPES",
    "TOOL_EVENT_TYPES",
    "HarnessEvent",
    "harness_event_adapter",
    "RUN_KEY_PATTERN",
    "RawEntry",
    "RUN_STATES",
    "RunRecord",
    "run_record_adapter",
]


def __getattr__(name: str) -> Any:
    source = _SOURCE.get(name)
    if source is None:
        raise AttributeError(f"module 'contracts' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value
