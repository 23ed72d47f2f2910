"""Where spans go: the OpenTelemetry SDK's OTLP exporter, with each attempt classified.

The SDK's exporters answer SUCCESS or FAILURE only. The consumer must tell a collector that is
down (retry, never ack) from one that refuses the data (dead-letter that run), so the HTTP sink
reads the status of the SDK's own HTTP client. Only a refusal of the content itself is final:
400 (the collector could not accept this well-formed request's data) and 413 (too large). Every
other answer is an outage that a fix on the collector's side ends, so retrying loses nothing:
401/403/407 (an expired token), 404/405 (a wrong path or a proxy in the way), 408/429, any other
4xx, any 5xx, connection errors and timeouts. Everything else (encoding, retries within
`OTEL_EXPORTER_OTLP_TIMEOUT`, compression, headers, TLS) stays the SDK's, configured by the
standard `OTEL_EXPORTER_OTLP_*` variables.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("goose_ingest.export.otlp")

PROTOCOL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
HTTP_PROTOCOL = "http/protobuf"
GRPC_PROTOCOL = "grpc"
# The only answers that refuse the content itself: dead-letter (everything else is retried).
CONTENT_REJECTIONS = frozenset({400, 413})
MAX_DETAIL_CHARS = 500


class SendOutcome(Enum):
    OK = "ok"
    REJECTED = "rejected"  # the collector refused the content (400, 413): retrying cannot help
    TRANSIENT = "transient"  # an outage (unreachable, 401/403/404/..., 408, 429, 5xx, timeout): retry, never ack


@dataclass(frozen=True)
class Attempt:
    outcome: SendOutcome
    detail: str = ""


class SpanSink(Protocol):
    def send(self, spans: Sequence[ReadableSpan]) -> Attempt: ...

    def close(self) -> None: ...


def classify_status(status: int | None, reason: str | None, error: object) -> Attempt:
    if status is not None and 200 <= status < 400:
        return Attempt(SendOutcome.OK)
    detail = f"HTTP {status}" if status is not None else f"no response ({type(error).__name__ if error else 'unknown'})"
    if reason:
        detail += f": {reason}"
    detail = detail[:MAX_DETAIL_CHARS]
    if status in CONTENT_REJECTIONS:
        return Attempt(SendOutcome.REJECTED, detail)
    return Attempt(SendOutcome.TRANSIENT, detail)


def endpoint_for_log(endpoint: str) -> str:
    """The endpoint without userinfo, query or fragment: safe to log. A URL may carry credentials in
    its userinfo and tokens in its query (`?api_key=`); what is left still says where spans go."""
    if "://" not in endpoint:  # not a URL (e.g. a gRPC host:port): drop userinfo and query
        return endpoint.split("?", 1)[0].rsplit("@", 1)[-1]
    try:
        parts = urlsplit(endpoint)
        host = parts.netloc.rsplit("@", 1)[-1]
    except ValueError:
        return "(unparseable endpoint)"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_QUERY = re.compile(r"\?[^\s\"']*")


class QueryScrubber(logging.Filter):
    """Cuts the query off every URL or path in a log line. An endpoint's query may hold a token, and
    the HTTP clients quote it: urllib3 logs `"POST /v1/traces?api_key=... HTTP/1.1" 200` at DEBUG,
    the SDK's exporter logs a transient error with the connection error's text, which names the URL."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "?" in text:
            record.msg, record.args = _QUERY.sub("?***", text), ()
        return True


def scrub_url_queries_in_logs() -> None:
    """Install `QueryScrubber` on every handler of the root logger (so on every logger's lines)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, QueryScrubber) for f in handler.filters):
            handler.addFilter(QueryScrubber())


class HttpSink:
    """OTLP over HTTP/protobuf through the SDK's `OTLPSpanExporter`."""

    def __init__(self, exporter: Any = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        self.exporter = exporter if exporter is not None else OTLPSpanExporter()
        self.endpoint: str = endpoint_for_log(str(getattr(self.exporter, "_endpoint", "?")))

    def send(self, spans: Sequence[ReadableSpan]) -> Attempt:
        client = getattr(self.exporter, "_client", None)
        if client is None or not hasattr(client, "export"):
            # An SDK whose client we cannot read: a failure may be a rejection, but retrying a
            # rejection only stalls the consumer, while dropping on a timeout would lose data.
            result = self.exporter.export(spans)
            return Attempt(SendOutcome.OK) if result is SpanExportResult.SUCCESS else Attempt(SendOutcome.TRANSIENT, "export failed")
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        try:
            data = encode_spans(spans).SerializePartialToString()
        except Exception as exc:  # values the encoder cannot represent: that data is refused for good
            return Attempt(SendOutcome.REJECTED, f"cannot encode: {type(exc).__name__}: {exc}"[:MAX_DETAIL_CHARS])
        max_size = getattr(self.exporter, "_max_request_size", 0) or 0
        if max_size > 0 and len(data) > max_size:
            return Attempt(SendOutcome.REJECTED, f"request of {len(data)} bytes exceeds max_request_size {max_size}")
        result = client.export(data)
        if result.success:
            return Attempt(SendOutcome.OK)
        return classify_status(result.status_code, result.reason, result.error)

    def close(self) -> None:
        self.exporter.shutdown()


class SdkSink:
    """Any SDK `SpanExporter` (gRPC, the in-memory one of the tests): FAILURE counts as transient.

    The gRPC exporter does not report why it failed, so a rejection there is retried (and shows
    as a stalled consumer with failed-span metrics) rather than dropped.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.endpoint: str = endpoint_for_log(str(getattr(exporter, "_endpoint", type(exporter).__name__)))

    def send(self, spans: Sequence[ReadableSpan]) -> Attempt:
        result = self.exporter.export(spans)
        return Attempt(SendOutcome.OK) if result is SpanExportResult.SUCCESS else Attempt(SendOutcome.TRANSIENT, "export failed")

    def close(self) -> None:
        self.exporter.shutdown()


class SinkConfigError(ValueError):
    """The OTEL_* configuration names something this installation cannot do."""


def protocol_from_env(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    for name in PROTOCOL_ENV:
        value = env.get(name, "").strip().lower()
        if value:
            return value
    return HTTP_PROTOCOL


def encode_request(spans: Sequence[ReadableSpan]) -> bytes | None:
    """The OTLP/HTTP protobuf body (ExportTraceServiceRequest) of `spans`, as the HTTP sink sends it;
    None when the encoder refuses them. Kept in a rejected run's dead letter for a resend."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    try:
        return bytes(encode_spans(spans).SerializePartialToString())
    except Exception:  # the same refusal the sink reported; nothing to keep
        return None


ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")  # the first set wins


def check_http_endpoint(env: dict[str, str] | None = None) -> None:
    """SinkConfigError for an OTLP/HTTP endpoint that is no http(s):// URL with a host: the SDK would
    take `not-a-url` and fail every export, an outage that never ends instead of one line at start."""
    env = dict(os.environ) if env is None else env
    for name in ENDPOINT_ENV:
        value = env.get(name, "").strip()
        if not value:
            continue
        try:
            parts = urlsplit(value)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            ok = False
        if not ok:
            raise SinkConfigError(f"{name}={endpoint_for_log(value)!r} is not an http:// or https:// URL "
                                  "(e.g. http://127.0.0.1:4318, the collector's OTLP/HTTP port)")
        return


def sink_from_env(env: dict[str, str] | None = None) -> SpanSink:
    """The sink the standard OTEL_EXPORTER_OTLP_* variables describe."""
    protocol = protocol_from_env(env)
    if protocol == HTTP_PROTOCOL:
        check_http_endpoint(env)
        return HttpSink()
    if protocol == GRPC_PROTOCOL:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError as exc:
            raise SinkConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: pip install 'goose-ingest[otlp-grpc]'"
            ) from exc
        return SdkSink(GrpcExporter())
    raise SinkConfigError(f"OTLP protocol {protocol!r} is not supported (use {HTTP_PROTOCOL} or {GRPC_PROTOCOL})")
