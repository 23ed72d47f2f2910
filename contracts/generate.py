"""Writes the generated contract documents: `python -m contracts.generate` (add --check to compare)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from contracts.events import harness_event_adapter
from contracts.jsonschema import NoNullDefaults as _NoNullDefaults
from contracts.raw import RawEntry
from contracts.runs import run_record_adapter

HERE = Path(__file__).parent
SCHEMA_DIR = HERE / "schemas"


def _schema(adapter_schema: dict[str, Any], title: str) -> dict[str, Any]:
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title}
    doc.update(adapter_schema)
    return doc


def documents() -> dict[str, str]:
    """File name (relative to contracts/) -> content."""
    docs = {
        "schemas/raw-entry.schema.json": _schema(RawEntry.model_json_schema(schema_generator=_NoNullDefaults), "RawEntry"),
        "schemas/harness-event.schema.json": _schema(
            harness_event_adapter.json_schema(schema_generator=_NoNullDefaults), "HarnessEvent"
        ),
        "schemas/run-record.schema.json": _schema(run_record_adapter.json_schema(schema_generator=_NoNullDefaults), "RunRecord"),
    }
    out = {name: json.dumps(doc, indent=2, sort_keys=False) + "\n" for name, doc in docs.items()}
    from contracts.asyncapi import asyncapi_document

    out["asyncapi.json"] = asyncapi_document()
    from contracts.gateway import openapi_document

    out["openapi.json"] = openapi_document()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a checked-in document is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, content in documents().items():
        path = HERE / name
        current = path.read_text() if path.exists() else None
        if current != content:
            stale.append(name)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
    for name in stale:
        print(("stale: " if args.check else "wrote: ") + f"contracts/{name}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
