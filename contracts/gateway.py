"""The ingest gateway's HTTP API (docs/gateway.md): reply models and the OpenAPI 3.1 document, generated
from the same models as the JSON Schemas and AsyncAPI (the request body is the RawEntry model)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from contracts.jsonschema import NoNullDefaults as _NoNullDefaults
from contracts.raw import RawEntry

INGEST_PATH = "/v1/raw"
# GET (same bearer token): what the gateway knows of the token and its limits (TokenInfo): a tap learns its
# run-key prefix there, and checks its token at start.
TOKEN_PATH = "/v1/token"
# On every reply of INGEST_PATH and TOKEN_PATH: the gateway's limits, so a client cuts its batches below them.
MAX_BODY_HEADER = "Goose-Max-Body-Bytes"  # a request body, as sent and decompressed
MAX_ENTRY_HEADER = "Goose-Max-Entry-Bytes"  # one entry's fields; a larger entry is kept cut and dead-lettered
# Why the gateway refused one entry of a batch (`reason` of its result and of the metric label).
REFUSED_INVALID = "invalid-entry"  # a field does not parse (the one decoder's reason), or a worker-only field
REFUSED_OVERSIZE = "oversize"  # the entry's fields exceed MAX_LINE_BYTES
REFUSED_OUTSIDE_PREFIX = "outside-prefix"  # its run key (or parent/continues) is outside the token's prefix: 403
REFUSAL_REASONS: tuple[str, ...] = (REFUSED_INVALID, REFUSED_OVERSIZE, REFUSED_OUTSIDE_PREFIX)


class EntryResult(BaseModel):
    stored: bool = Field(description="The entry is in Redis (XADD done, WAIT too when configured).")
    reason: str = Field(  # type: ignore[assignment]
        default=None,
        json_schema_extra={"enum": [REFUSED_INVALID, REFUSED_OVERSIZE]},
        description="Why it was refused for good; resending it is useless. With `stored` true: `oversize`, the entry "
                    "is kept in the raw log cut to MAX_LINE_BYTES and the workers dead-letter it, as a direct tap's.")
    detail: str = Field(default=None, description="The reason in words: names a field, never quotes a line.")  # type: ignore[assignment]


class TokenInfo(BaseModel):
    id: str = Field(description="The token's id (as `tokens list` shows it; never the token).")
    prefix: str = Field(description="The run-key prefix the token may write: a tap's default run key starts with it.")
    labels: dict[str, str] = Field(description="Labels the gateway stamps on every entry of this token.")
    max_body_bytes: int = Field(description="The largest request body, as sent and decompressed.")
    max_entry_bytes: int = Field(description="The largest entry (its fields); larger ones are kept cut and dead-lettered.")


class IngestReply(BaseModel):
    stored: int = Field(ge=0, description="Entries stored.")
    refused: int = Field(ge=0, description="Entries refused for good.")
    results: list[EntryResult] = Field(description="One result per entry of the request, in order.")


class ErrorReply(BaseModel):
    error: str = Field(description="The kind of refusal (unauthorized, forbidden, bad request, refused, rate limited, unavailable).")
    reason: str = Field(description="Why, in words: never a token or a line.")
    entries: list[int] = Field(default=None,  # type: ignore[arg-type]
                               description="403: indexes of the entries outside the prefix (first 100).")


REF = "#/components/schemas/{model}"


def _error(description: str, retry_after: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorReply")}}}}
    if retry_after:
        out["headers"] = {"Retry-After": {"description": "Seconds to wait before resending.", "schema": {"type": "integer"}}}
    return out


def document() -> dict[str, Any]:
    _, defs = models_json_schema([(RawEntry, "validation"), (IngestReply, "serialization"), (ErrorReply, "serialization"),
                                  (TokenInfo, "serialization")],
                                 ref_template=REF, schema_generator=_NoNullDefaults)
    schemas = dict(sorted(defs.get("$defs", {}).items()))
    entry = {"$ref": REF.format(model="RawEntry")}
    return {
        "openapi": "3.1.0",
        "info": {"title": "goose-ingest gateway", "version": "1",
                 "description": "Authenticated ingest of raw entries (docs/gateway.md). Entries are the raw-entry fields "
                                "(docs/raw-entries.md); `line_b64` may replace `line` for bytes that are not UTF-8. "
                                "Content-Encoding gzip, deflate, zstd or none."},
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "A token of `goose-ingest tokens create`."}}},
        "security": [{"bearer": []}],
        "paths": {INGEST_PATH: {"post": {
            "operationId": "ingestRawEntries",
            "summary": "Store a batch of raw entries on the shards of their runs",
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"type": "array", "items": entry}},
                "application/x-ndjson": {"schema": entry, "description": "One RawEntry object a line."},
            }},
            "responses": {
                "200": {"description": "Every accepted entry is in Redis; per-entry results.",
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="IngestReply")}}}},
                "400": _error("The body is not JSON / NDJSON."),
                "401": _error("No valid, unrevoked bearer token."),
                "403": _error("An entry is outside the token's run-key prefix: nothing of the request was written."),
                "408": _error("The body did not arrive in time."),
                "413": _error("The body, as sent or decompressed, is over the limit."),
                "415": _error("Unsupported Content-Encoding."),
                "429": _error("Over the token's rate on this replica.", retry_after=True),
                "503": _error("Redis is unavailable (down, maxmemory, failover, replicas short).", retry_after=True),
            },
        }}, TOKEN_PATH: {"get": {
            "operationId": "tokenInfo",
            "summary": "The token's run-key prefix, stamped labels and the gateway's limits (a tap's start-up check)",
            "responses": {
                "200": {"description": "The token is valid.",
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="TokenInfo")}}}},
                "401": _error("No valid, unrevoked bearer token."),
                "503": _error("Redis is unavailable.", retry_after=True),
            },
        }}},
    }


def openapi_document() -> str:
    return json.dumps(document(), indent=2) + "\n"
