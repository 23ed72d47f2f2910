"""The gateway's metrics: bounded labels only (a status code, a fixed reason), never a token or a run."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.gateway.body import REFUSAL_REASONS


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("goose_ingest_gateway_requests", "Ingest requests by HTTP status",
                                ["status"], registry=self.registry)
        self.entries = Counter("goose_ingest_gateway_entries", "Entries stored, kept cut (oversize) or refused (reason) by the gateway",
                               ["result", "reason"], registry=self.registry)
        self.rate_limited = Counter("goose_ingest_gateway_rate_limited", "Requests refused 429 over a token's rate",
                                    registry=self.registry)
        # a count, not a label per token: ids are bounded only by the tokens created (one per agent host:
        # thousands of series); the log line of each 429 episode names the id
        self.tokens_at_limit = Gauge("goose_ingest_gateway_tokens_at_limit",
                                     "Tokens answered 429 over their rate on this replica within the last minute",
                                     registry=self.registry)
        self.redis_seconds = Histogram("goose_ingest_gateway_redis_seconds",
                                       "Time to write one request's entries to Redis (WAIT included)",
                                       buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                                       registry=self.registry)
        for status in ("200", "400", "401", "403", "408", "413", "415", "429", "503"):
            self.requests.labels(status)
        self.entries.labels("stored", "")
        self.entries.labels("cut", "oversize")  # also counted stored: kept cut, dead-lettered by the workers
        for reason in REFUSAL_REASONS:
            self.entries.labels("refused", reason)
