"""The JSON Schema generator every generated document uses (schemas, AsyncAPI, OpenAPI).

Its own module so that `generate.py` (which writes the documents) and `asyncapi.py` / `gateway.py`
(which build them) import it from below, instead of the builders importing the writer back.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import GenerateJsonSchema


class NoNullDefaults(GenerateJsonSchema):
    """Optional fields are omitted, never null: drop the `default: null` pydantic would print."""

    def default_schema(self, schema: Any) -> Any:
        result = super().default_schema(schema)
        if result.get("default", 0) is None:
            result.pop("default")
        return result
