"""The AsyncAPI 3.0 document of goose-ingest's streams, generated from the contract models."""

from __future__ import annotations

import json
from typing import Any

from pydantic.json_schema import models_json_schema

from contracts.events import EVENT_TYPES, harness_event_adapter
from contracts.jsonschema import NoNullDefaults as _NoNullDefaults
from contracts.keys import KeyLayout
from contracts.raw import DEAD_LETTER_REASONS, RawEntry
from contracts.runs import RUN_STATES, run_record_adapter

REF = "#/components/schemas/{model}"


def _schemas() -> dict[str, Any]:
    event = harness_event_adapter.json_schema(ref_template=REF, schema_generator=_NoNullDefaults)
    record = run_record_adapter.json_schema(ref_template=REF, schema_generator=_NoNullDefaults)
    _, raw = models_json_schema([(RawEntry, "validation")], ref_template=REF, schema_generator=_NoNullDefaults)
    schemas: dict[str, Any] = {}
    for doc in (event, record, raw):
        schemas.update(doc.pop("$defs", {}))
    schemas["HarnessEvent"] = event
    schemas["RunRecord"] = record
    return dict(sorted(schemas.items()))


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _event_entry(description: str) -> dict[str, Any]:
    return {
        "name": "HarnessEventEntry",
        "title": "Harness event",
        "summary": description,
        "contentType": "application/x-redis-stream-fields",
        "payload": {
            "type": "object",
            "description": "Plain stream fields of one entry (XADD field/value pairs), readable by any Redis client.",
            "required": ["eventId", "runId", "seq", "type", "data"],
            "properties": {
                "eventId": _string("`<run>:<n>`"),
                "runId": _string("the run key"),
                "seq": _string("n, the event's index within its run (decimal)"),
                "type": {"type": "string", "enum": list(EVENT_TYPES)},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": "#/components/schemas/HarnessEvent"},
                    "description": "The event as compact JSON.",
                },
            },
        },
    }


def _describe_cluster_partitions(channels: dict[str, Any]) -> None:
    """On a Redis Cluster every stream is one per shard, in that shard's slot (contracts/keys.py)."""
    cluster = KeyLayout(shards=1, cluster=True)
    names = {cluster.raw_stream(0): "goose.raw.{shard}", cluster.control_stream(0): "goose.control.{shard}"}
    for channel in channels.values():
        address = channel["address"]
        example = next((n for n, a in names.items() if a == address), f"{address}.{cluster.tag(0)}")
        channel["description"] = (
            "On a Redis Cluster (GOOSE_INGEST_REDIS_CLUSTER=true) this is one stream per shard i: "
            f"`{example.replace(cluster.tag(0), '{s<i>}')}`, whose hash tag keeps a shard's streams and run "
            "states in one slot. Per-run order holds within a partition; read every partition "
            "(docs/consumers.md)."
        )
    assert cluster.events_partition(0) == f"{cluster.events_topic}.{cluster.tag(0)}"


def document() -> dict[str, Any]:
    channels: dict[str, Any] = {
        "rawShard": {
            "address": "goose.raw.{shard}",
            "title": "Raw goose lines, sharded by crc32(run) % shards",
            "parameters": {"shard": {"description": "0 .. GOOSE_INGEST_SHARDS-1"}},
            "messages": {"rawEntry": {"$ref": "#/components/messages/RawEntry"}},
        },
        "controlShard": {
            "address": "goose.control.{shard}",
            "title": "Worker-only control entries of a shard (abandon markers); part of the log of record",
            "parameters": {"shard": {"description": "0 .. GOOSE_INGEST_SHARDS-1"}},
            "messages": {"rawEntry": {"$ref": "#/components/messages/RawEntry"}},
        },
        "harnessEvents": {
            "address": "harness.events",
            "title": "Every harness event, in per-run order",
            "messages": {"harnessEvent": {"$ref": "#/components/messages/HarnessEvent"}},
        },
        "harnessRuns": {
            "address": "harness.runs",
            "title": "Run lifecycle records",
            "messages": {"runRecord": {"$ref": "#/components/messages/RunRecord"}},
        },
        "deadLetters": {
            "address": "goose.deadletter",
            "title": "Raw entries that could not be processed, with the reason",
            "messages": {"deadLetter": {"$ref": "#/components/messages/DeadLetter"}},
        },
    }
    for t in EVENT_TYPES:
        channels[f"harnessEvents_{t}"] = {
            "address": f"harness.events.{t}",
            "title": f"Harness events of type {t}",
            "messages": {"harnessEvent": {"$ref": "#/components/messages/HarnessEvent"}},
        }
    _describe_cluster_partitions(channels)
    operations: dict[str, Any] = {
        "publishRaw": {"action": "receive", "channel": {"$ref": "#/channels/rawShard"},
                       "summary": "Taps and shippers XADD raw entries; workers consume them in a consumer group."},
    }
    for name in channels:
        if name not in ("rawShard", "controlShard"):
            operations[f"send_{name}"] = {"action": "send", "channel": {"$ref": f"#/channels/{name}"}}
    operations["send_controlShard"] = {
        "action": "send", "channel": {"$ref": "#/channels/controlShard"},
        "summary": "Workers append abandon markers (kind=abandon) in the commit that applies them; "
                   "a kind=abandon entry on a raw shard is dead-lettered invalid-entry.",
    }
    # `goose-ingest export otlp` (docs/otel.md): a consumer group of its own on the topics.
    channels["otlpDeadLetters"] = {
        "address": "goose.deadletter.otlp",
        "title": "Runs whose OTLP export the collector refused, and topic entries the OTLP exporter could not read",
        "messages": {"otlpDeadLetter": {"$ref": "#/components/messages/OtlpDeadLetter"}},
    }
    operations["send_otlpDeadLetters"] = {"action": "send", "channel": {"$ref": "#/channels/otlpDeadLetters"},
                                          "summary": "Written by `goose-ingest export otlp`."}
    for name in ("harnessEvents", "harnessRuns"):
        operations[f"exportOtlp_{name}"] = {
            "action": "receive", "channel": {"$ref": f"#/channels/{name}"},
            "summary": "`goose-ingest export otlp` reads every partition in the consumer group GOOSE_INGEST_OTLP_GROUP "
                       "(default goose-ingest-otlp, created at id 0) and acknowledges an entry only once the spans it "
                       "carries were accepted by the collector or dead-lettered (docs/otel.md).",
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "goose-ingest",
            "version": "1.1.0",
            "description": "Raw goose stream-json lines in, normalized harness events out, on Redis Streams. "
            "Stream names are settings (GOOSE_INGEST_*); the addresses here are the defaults. "
            "Generated from the pydantic models in contracts/ by `python -m contracts.generate`.",
        },
        "defaultContentType": "application/json",
        "servers": {"redis": {"host": "localhost:6379", "protocol": "redis", "description": "Redis Streams"}},
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": {
                "HarnessEvent": _event_entry("One harness event (contract section 2)."),
                "RunRecord": {
                    "name": "RunRecordEntry",
                    "contentType": "application/x-redis-stream-fields",
                    "payload": {
                        "type": "object",
                        "required": ["recordId", "runId", "seq", "state", "data"],
                        "properties": {
                            "recordId": _string("`<run>:run:<k>`"),
                            "runId": _string("the run key"),
                            "seq": _string("raw seq of the entry that caused the transition"),
                            "state": {"type": "string", "enum": list(RUN_STATES)},
                            "data": {"type": "string", "contentMediaType": "application/json",
                                     "contentSchema": {"$ref": "#/components/schemas/RunRecord"}},
                        },
                    },
                },
                "OtlpDeadLetter": {
                    "name": "OtlpDeadLetter",
                    "contentType": "application/x-redis-stream-fields",
                    "payload": {
                        "type": "object",
                        "required": ["reason", "detail", "source", "sourceId", "exporter", "group"],
                        "properties": {
                            "reason": {"type": "string", "enum": ["otlp-rejected", "invalid-entry", "max-deliveries"],
                                       "description": "otlp-rejected: the collector refused the run's spans as content "
                                                      "(HTTP 400 or 413; every other status, a timeout or a connection "
                                                      "error is an outage, retried and never dead-lettered); "
                                                      "invalid-entry: a topic entry without run id or seq, or an "
                                                      "unreadable run record; max-deliveries: an entry that failed "
                                                      "GOOSE_INGEST_MAX_DELIVERIES attempts"},
                            "detail": _string("e.g. the HTTP status and reason of the refusal"),
                            "source": _string("topic partition the entry came from"),
                            "sourceId": _string("its stream entry id"),
                            "runId": _string("the run whose export was dead-lettered (when known)"),
                            "exporter": {"type": "string", "const": "otlp"},
                            "group": _string("the exporter's consumer group (GOOSE_INGEST_OTLP_GROUP)"),
                            "otlp": {"type": "string", "contentEncoding": "binary",
                                     "description": "otlp-rejected only: the refused spans as the OTLP/HTTP protobuf "
                                                    "request body (ExportTraceServiceRequest), to resend as is after a "
                                                    "fix (docs/otel.md); absent when the SDK could not encode them"},
                            "contentType": {"type": "string", "const": "application/x-protobuf",
                                            "description": "the media type of `otlp` (present with it)"},
                        },
                        "additionalProperties": {"description": "`raw.<field>`: the entry's original fields, "
                                                                "unchanged, to resend it after a fix (absent only for "
                                                                "a root closed by the timeout: no entry)"},
                    },
                },
                "RawEntry": {
                    "name": "RawEntry",
                    "contentType": "application/x-redis-stream-fields",
                    "payload": {"$ref": "#/components/schemas/RawEntry"},
                },
                "DeadLetter": {
                    "name": "DeadLetter",
                    "contentType": "application/x-redis-stream-fields",
                    "payload": {
                        "type": "object",
                        "required": ["reason", "detail", "source", "sourceId"],
                        "properties": {
                            "reason": {"type": "string", "enum": list(DEAD_LETTER_REASONS)},
                            "detail": _string("human-readable detail"),
                            "source": _string("raw stream the entry came from"),
                            "sourceId": _string("its stream entry id"),
                        },
                        "additionalProperties": {"description": "`raw.<field>`: the entry's original fields, unchanged"},
                    },
                },
            },
            "schemas": _schemas(),
        },
    }


def asyncapi_document() -> str:
    return json.dumps(document(), indent=2) + "\n"
