"""Exporters: consumers of the harness topics that write them to other systems (OTLP, PostgreSQL)."""
