"""`goose-ingest export otlp`: every run as an OpenTelemetry trace (docs/otel.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from services.settings import ConfigError, Settings


def register(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = targets.add_parser(
        "otlp",
        help="export every run as an OpenTelemetry trace (OTLP; GenAI semantic conventions)",
        description="Consume harness.runs and harness.events with the group GOOSE_INGEST_OTLP_GROUP and export "
        "one trace per run through the OpenTelemetry SDK's OTLP exporter, configured by the standard "
        "OTEL_EXPORTER_OTLP_* / OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES variables (HTTP/protobuf by default; "
        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc with the otlp-grpc extra). Message text only with "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true. See docs/otel.md.",
    )
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


SDK_EXPORT_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.common.http",
                      "opentelemetry.exporter.otlp.proto.grpc.exporter")


def run(args: argparse.Namespace) -> int:
    from services.export.otlp.config import mapping_config_from_env
    from services.export.otlp.sink import SinkConfigError, scrub_url_queries_in_logs, sink_from_env
    from services.logs import configure_logging, stdout_to_stderr

    # As the worker: one plain format on stderr, FastStream's loggers included (no ANSI-coloured
    # "callback for Task-N" INFO lines on stdout, and its fetch-error tracebacks digested).
    stdout_to_stderr()
    configure_logging(str(args.log_level))
    scrub_url_queries_in_logs()  # an endpoint's query may hold a token
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # The SDK logs each of its retries ("Transient error ... retrying in 2s", a dozen per 30 s
        # outage) and each give-up; the processor says it once, when the collector goes and comes back.
        for name in SDK_EXPORT_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
    settings = Settings().for_command("export otlp")  # 9465 unless set: beside a worker on one host
    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if not settings.redis_url:
        raise ConfigError("no broker configured (GOOSE_INGEST_REDIS_URL)")
    try:
        sink = sink_from_env()
        cfg = mapping_config_from_env()
    except (SinkConfigError, ValueError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    try:
        return asyncio.run(serve_exporter(settings, sink, cfg))
    except KeyboardInterrupt:
        return 0


async def serve_exporter(settings: Settings, sink, cfg) -> int:
    from services.export.otlp.app import build_app
    from services.streams.app_shell import serve_app

    # the shell's start sequence (services/streams/app_shell.py); exit 1 when a subscriber died
    return await serve_app(
        settings, logging.getLogger("goose_ingest.export.otlp"), lambda: build_app(settings, sink, cfg),
        lambda rt: (f"otlp exporter {rt.consumer} consuming {len(rt.exporter.streams()) if rt.exporter else 0} "
                    f"partitions into {getattr(sink, 'endpoint', '?')}"))
