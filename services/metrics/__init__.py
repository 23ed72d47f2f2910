"""Prometheus metrics of one goose-ingest worker process, and the HTTP server that exposes them.

Every :class:`Metrics` owns its own ``CollectorRegistry``: a worker process serves its own
``/metrics`` port, so processes never share numbers (no multiprocess mode). Consequently
``faststream run --workers N`` must not be used — it puts N processes behind one port and each
scrape would see only one of them. Run N worker processes with N ports (or N pods).
"""

from services.metrics.registry import (
    DEAD_LETTER_REASONS,
    EVENT_TYPES,
    FORMAT_LABELS,
    METRIC_TOOLS_MAX,
    RAW_OUTCOMES,
    RUN_STATES,
    TOKEN_KINDS,
    TOOL_LABELS,
    TOOL_OUTCOMES,
    Metrics,
    metric_tools_problem,
    tool_label,
)
from services.metrics.server import MetricsServer, serve

__all__ = [
    "DEAD_LETTER_REASONS",
    "EVENT_TYPES",
    "FORMAT_LABELS",
    "METRIC_TOOLS_MAX",
    "RAW_OUTCOMES",
    "RUN_STATES",
    "TOKEN_KINDS",
    "TOOL_LABELS",
    "TOOL_OUTCOMES",
    "Metrics",
    "MetricsServer",
    "metric_tools_problem",
    "serve",
    "tool_label",
]
