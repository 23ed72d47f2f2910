"""Every run as an OpenTelemetry trace: `goose-ingest export otlp` (docs/otel.md)."""
