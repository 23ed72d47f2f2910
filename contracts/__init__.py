"""The goose-ingest contract: pydantic models that are the single source of truth.

JSON Schema files in ``contracts/schemas/`` and ``contracts/asyncapi.yaml`` are generated
from these models (``python -m contracts.generate``); a test fails when they are stale.
"""

from contracts.events import EVENT_TYPES, TOOL_EVENT_TYPES, HarnessEvent, harness_event_adapter
from contracts.raw import RUN_KEY_PATTERN, RawEntry
from contracts.runs import RUN_STATES, RunRecord, run_record_adapter

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
