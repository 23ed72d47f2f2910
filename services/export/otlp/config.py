"""The mapping's configuration from the standard OpenTelemetry environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits

from services.export.otlp.mapping import DEFAULT_ATTRIBUTE_LENGTH, MappingConfig

# The GenAI conventions' own switch for message content (off unless exactly true).
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
LENGTH_ENV = ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT")
DEFAULT_SERVICE_NAME = "goose-ingest"


def capture_enabled(env: Mapping[str, str]) -> bool:
    return env.get(CAPTURE_ENV, "").strip().lower() == "true"


def span_limits(env: Mapping[str, str]) -> SpanLimits:
    """The SDK's limits from OTEL_*_LIMIT variables; attribute length defaults to ours, not unlimited."""
    if any(env.get(name, "").strip() for name in LENGTH_ENV):
        return SpanLimits()  # the SDK reads the variables itself
    return SpanLimits(max_attribute_length=DEFAULT_ATTRIBUTE_LENGTH)


def resource(env: Mapping[str, str]) -> Resource:
    """OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; service.name defaults to goose-ingest."""
    named = env.get("OTEL_SERVICE_NAME", "").strip() or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return Resource.create({} if named else {"service.name": DEFAULT_SERVICE_NAME})


def mapping_config_from_env(env: Mapping[str, str] | None = None) -> MappingConfig:
    env = os.environ if env is None else env
    return MappingConfig(capture_content=capture_enabled(env), limits=span_limits(env), resource=resource(env))
