"""The one configuration class of goose-ingest (env prefix ``GOOSE_INGEST_``)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.consumers import BY_NAME as CONSUMER
from contracts.consumers import CONSUMERS, WORKER
from contracts.keys import KeyLayout
from contracts.raw import DEFAULT_MAX_HELD_BYTES, DEFAULT_MAX_PENDING_TOOL_BYTES

if TYPE_CHECKING:  # imported where used: commands that never redact do not compile the rules
    from services.redaction import Redactor

@lru_cache(maxsize=64)
def _layout(
    namespace: str,
    shards: int,
    cluster: bool,
    raw_prefix: str,
    control_prefix: str,
    events_topic: str,
    runs_topic: str,
    deadletter_stream: str,
) -> KeyLayout:
    return KeyLayout(namespace, shards, cluster, raw_prefix, control_prefix, events_topic, runs_topic, deadletter_stream)


SINGLE_NODE_SHARDS = 4
CLUSTER_SHARDS = 16  # enough to spread over many primaries; see docs/scaling.md
ENV_PREFIX = "GOOSE_INGEST_"


# Default metrics port of each long-running command when GOOSE_INGEST_METRICS_PORT is not set: distinct, so
# a worker (or `up`) and the exporters run side by side on one host without a collision. Containers and
# the chart set the variable explicitly (one process per container, one port for every probe).
# The consumers' ports are their rows of contracts/consumers.py; `up` runs a worker.
DEFAULT_METRICS_PORT = CONSUMER[WORKER].metrics_port
COMMAND_METRICS_PORTS = {**{c.command: c.metrics_port for c in CONSUMERS}, "up": DEFAULT_METRICS_PORT}


# GOOSE_INGEST_* variables that are read outside Settings (build, tests, tools): not worth a warning.
ENV_NOT_SETTINGS = frozenset({
    "PURE_PYTHON", "REDIS_SERVER", "SHARED", "PHOENIX_VENV", "IMAGE", "IMPORT_TEST_CRASH_AFTER",
})


def unknown_env_variables(environ: dict[str, str] | Any) -> list[tuple[str, str | None]]:
    """(variable, the setting it probably meant or None) for every GOOSE_INGEST_* variable no setting
    reads: a typo there silently leaves the default in force."""
    known = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    known |= {f"{ENV_PREFIX}{name}" for name in ENV_NOT_SETTINGS}
    out = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper.startswith(f"{ENV_PREFIX}TEST_"):
            continue
        import difflib  # only for a variable to explain: a tap pays for no import it does not use

        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        out.append((name, close[0] if close else None))
    return out


class ConfigError(Exception):
    """A misconfiguration found at run time: the CLI prints its message as one line and exits 2."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    namespace: str = Field(
        default="",
        description="Prefix '<namespace>:' for every key and stream name (isolates tenants and test runs).",
    )

    # --- broker -------------------------------------------------------------
    redis_url: str | None = Field(
        default=None,
        description="redis:// or rediss:// URL. Unset: commands that need a broker start an embedded redis-server.",
    )
    redis_username: str | None = Field(default=None, description="ACL user (overrides the URL's).")
    redis_password: SecretStr | None = Field(default=None, description="Password (overrides the URL's); never logged.")
    redis_tls: bool = Field(default=False, description="Use TLS even with a redis:// URL (rediss:// always does).")
    redis_tls_ca_file: str | None = Field(
        default=None,
        description="CA bundle (PEM) that signed the broker's certificate, trusted besides the system's CAs.",
    )
    redis_tls_cert_file: str | None = Field(
        default=None, description="Client certificate (PEM) for brokers that require one (--tls-auth-clients yes)."
    )
    redis_tls_key_file: str | None = Field(
        default=None, description="Private key (PEM) of REDIS_TLS_CERT_FILE, when the certificate file does not hold it."
    )
    redis_tls_check_hostname: bool = Field(
        default=True, description="Check that the broker's certificate names the host of REDIS_URL (the chain is always verified)."
    )
    redis_cluster: bool = Field(
        default=False,
        description="The broker is a Redis Cluster; REDIS_URL names one or more seed nodes (comma-separated host:port).",
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Taps count a batch as sent only once this many replicas acknowledged it (WAIT): "
        "closes the loss window of a failover (docs/scaling.md). 0: off.",
    )
    redis_wait_timeout_ms: int = Field(
        default=1000, ge=1, description="How long a tap's WAIT for replicas may block before the batch is retried."
    )

    # --- raw log ------------------------------------------------------------
    shards: int = Field(
        default=SINGLE_NODE_SHARDS,  # CLUSTER_SHARDS when redis_cluster is set (_default_shards)
        ge=1,
        le=1024,
        description="Raw streams goose.raw.<0..N-1>; run -> crc32(run) % N. Default 4 (single node) or 16 (cluster).",
    )
    raw_stream_prefix: str = Field(default="goose.raw", description="Raw shard streams are <prefix>.<shard>.")
    control_stream_prefix: str = Field(
        default="goose.control", description="Worker-only control streams (abandon markers) <prefix>.<shard>."
    )
    group: str = Field(default=CONSUMER["worker"].default_group, description="Consumer group of the workers on every raw shard.")
    max_line_bytes: int = Field(default=1_048_576, ge=1024, description="Larger raw entries are dead-lettered.")

    # --- worker -------------------------------------------------------------
    batch_size: int = Field(default=500, ge=1, le=10_000, description="XREADGROUP COUNT per shard read.")
    block_ms: int = Field(default=200, ge=1, description="XREADGROUP BLOCK: how long an idle read waits.")
    claim_idle_ms: int = Field(default=30_000, ge=100, description="Pending entries idle this long are reclaimed.")
    shard_leases: bool = Field(
        default=True,
        description="One worker reads a shard at a time (services/worker/leases.py); off: every worker reads every shard.",
    )
    lease_ttl_ms: int = Field(
        default=10_000, ge=1_000,
        description="A shard lease not renewed this long expires (a killed worker's shards move after this).",
    )
    max_deliveries: int = Field(default=5, ge=1, description="An entry delivered more often is dead-lettered.")
    run_idle_timeout_s: float = Field(default=900.0, gt=0, description="A run with no input this long is abandoned.")
    sweep_interval_s: float = Field(default=5.0, gt=0, description="How often idle runs, reclaim and retention are checked.")
    max_span_chars: int = Field(default=262_144, ge=16, description="Cap on an accumulating agent/reasoning span.")
    max_pending_tools: int = Field(default=256, ge=1, description="Cap on unanswered tool calls per run.")
    max_pending_tool_bytes: int = Field(
        default=DEFAULT_MAX_PENDING_TOOL_BYTES,
        ge=1024,
        description="Cap on the bytes of unanswered tool calls per run; beyond it the oldest becomes `unknown`.",
    )
    max_buffered_entries: int = Field(default=10_000, ge=1, description="Cap on out-of-order entries a run may hold.")
    max_held_bytes: int = Field(
        default=DEFAULT_MAX_HELD_BYTES,
        ge=1024,
        description="Cap on the bytes of out-of-order entries a run may hold; beyond it they are dead-lettered hold-limit.",
    )
    run_cache_size: int = Field(
        default=16_384,
        ge=0,
        description="Run sequencers a worker keeps in memory between batches (LRU); bounds the worker's RSS, not the fleet. 0: none.",
    )
    metrics_port: int = Field(
        default=DEFAULT_METRICS_PORT, ge=0, le=65535,
        description="HTTP port of /metrics, /healthz, /readyz (0: any free port). Unset: 9464 for `worker` and `up`, "
        "9465 for `export otlp`, 9466 for `export postgres`, 9467 for `archive`.",
    )
    metrics_host: str = Field(default="0.0.0.0", description="Bind address of the metrics server.")
    metrics_port_file: str = Field(
        default="",
        description="File the metrics server writes its bound `host port` to (read by the image's HEALTHCHECK); \"\": none.",
    )
    metric_tools: list[str] = Field(
        default_factory=list,
        description='Extension or MCP tool names (as in the events\' `tool`, e.g. ["github__create_issue"]) '
                    "that keep their own `tool` metric label instead of `mcp`/`other`; JSON list, capped (docs/operations.md).",
    )

    # Pages counted in runs and hosts (docs/operations.md "Pages counted in runs and hosts"): the workers
    # export how many distinct runs and hosts failed per error class and per tool within the window,
    # and the thresholds below, which the rules compare against.
    alert_window_s: float = Field(
        default=300.0, ge=1, le=86_400,
        description="Window of the runs/hosts gauges: a run or host counts while its last failure of a class (tool) is this recent.",
    )
    alert_min_runs: int = Field(
        default=5, ge=1, le=1_000_000, description="An error-class or tool page needs failures in at least this many distinct runs.",
    )
    alert_min_hosts: int = Field(
        default=3, ge=2, le=1_000_000,
        description="... and from at least this many distinct hosts (>= 2: one host never pages on its own).",
    )

    # --- redaction ----------------------------------------------------------
    redaction_enabled: bool = Field(default=True, description="Redact credentials in every published event (never in the raw log).")
    redaction_disable: list[str] = Field(default_factory=list, description='Built-in rules to turn off, JSON list, e.g. ["jwt"].')
    redaction_extra_rules: dict[str, str] = Field(
        default_factory=dict, description='Extra rules, JSON object name -> regex (a group named "secret" limits the replacement).'
    )

    # --- topics -------------------------------------------------------------
    events_topic: str = Field(default="harness.events", description="All harness events; per-type topics are <this>.<type>.")
    runs_topic: str = Field(default="harness.runs", description="Run lifecycle records.")
    deadletter_stream: str = Field(default="goose.deadletter", description="Entries that could not be processed, with reason.")

    # --- retention ----------------------------------------------------------
    raw_retention_hours: float = Field(default=168.0, gt=0, description="Committed raw entries older than this are trimmed (never uncommitted ones).")
    topic_retention_hours: float = Field(
        default=72.0, gt=0,
        description="Topic entries older than this are trimmed, once every registered consumer group has read them.",
    )
    topic_max_unread_hours: float = Field(
        default=168.0, gt=0,
        description="Hard cap: topic entries older than this are trimmed even if a registered group has not read them "
        "(counted per group in goose_ingest_topic_trimmed_unread_total).",
    )
    deadletter_retention_hours: float | None = Field(
        default=None, gt=0,
        description="Dead letters older than this are trimmed by the script that writes them (every consumer's: "
        "services/streams/deadletter.py, the worker's housekeeping). Unset: TOPIC_RETENTION_HOURS.",
    )
    run_state_ttl_hours: float = Field(default=168.0, gt=0, description="How long an ended run's state is kept to recognise late duplicates.")

    # --- tap ----------------------------------------------------------------
    spool_dir: str = Field(default="~/.local/state/goose-ingest/spool", description="Where the tap spools entries while the broker is down.")
    publish_batch: int = Field(default=256, ge=1, description="Entries per pipelined XADD batch.")
    host_label: str | None = Field(default=None, description="`host` label on raw entries (default: the hostname).")

    # --- the tap through an ingest gateway (docs/gateway.md) ------------------
    endpoint: str | None = Field(
        default=None,
        description="https:// URL of an ingest gateway: tap, publish and import-sessions send there instead of to Redis.",
    )
    token: SecretStr | None = Field(default=None, description="Bearer token for ENDPOINT; never logged.")
    token_file: str | None = Field(default=None, description="File whose first line is the token (instead of TOKEN).")
    endpoint_ca_file: str | None = Field(default=None, description="CA bundle that signs the gateway's TLS certificate.")

    # --- gateway (`goose-ingest gateway`, docs/gateway.md) ---------------------
    gateway_host: str = Field(default="0.0.0.0", description="Bind address of the ingest gateway.")
    gateway_port: int = Field(default=8080, ge=0, le=65535, description="Port of the ingest gateway (0: any free port).")
    gateway_max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024,
        description="Largest request body, as sent and after decompression (413 beyond).",
    )
    # Sized from an agent's measured burst (docs/scaling.md, "Per-token gateway limits"): ~30x the largest.
    gateway_rate_lines_per_s: float = Field(default=1_000.0, ge=0, description="Entries per second per token and replica (429 beyond); 0: no limit.")
    gateway_rate_bytes_per_s: float = Field(
        default=4 * 1024 * 1024, ge=0,
        description="Body bytes per second per token and replica, as sent then decoded (429 beyond); 0: no limit.")
    gateway_token_cache_s: float = Field(default=5.0, ge=0, description="How long a replica trusts a token lookup (a revocation takes effect within this).")
    gateway_body_timeout_s: float = Field(default=30.0, gt=0, description="A request head or body not received within this is refused (408; a late head also closes its connection).")
    gateway_max_connections: int = Field(default=2048, ge=1, description="Concurrent connections per replica (503 beyond).")
    gateway_retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 503 while Redis is unavailable.")
    gateway_tls_cert_file: str | None = Field(default=None, description="Serve HTTPS with this certificate (chain) file; unset: plain HTTP.")
    gateway_tls_key_file: str | None = Field(default=None, description="The private key of GATEWAY_TLS_CERT_FILE.")

    # --- export postgres ----------------------------------------------------
    postgres_dsn: SecretStr | None = Field(
        default=None, description="libpq DSN/URL of the analytics database (`export postgres`); never logged."
    )
    postgres_retention_days: float = Field(
        default=90.0, gt=0, description="Monthly events partitions wholly older than this are dropped."
    )
    postgres_group: str = Field(default=CONSUMER["postgres"].default_group,
                                description="Consumer group of the PostgreSQL sink on every topic partition (--group overrides).")

    # --- export jsonl (docs/consumers.md "Adding a sink") ---------------------
    jsonl_dir: str | None = Field(default=None, description="Directory `export jsonl` appends its JSON-lines files to (--path overrides).")
    jsonl_group: str = Field(default=CONSUMER["jsonl"].default_group,
                             description="Consumer group of the JSON-lines sink on every topic partition.")

    # --- OTLP exporter (`export otlp`; the OTLP endpoint itself comes from the standard OTEL_* variables)
    otlp_group: str = Field(default=CONSUMER["otlp"].default_group, description="Consumer group of the OTLP exporter on every topic partition.")
    otlp_root_timeout_s: float = Field(
        default=3600.0, gt=0, description="A trace whose run never ends is closed (marked) after this long without news of it."
    )
    otlp_retry_max_s: float = Field(default=30.0, gt=0, description="Longest wait between retries while the collector is unreachable.")

    # --- archive (`goose-ingest archive`, docs/archive.md; S3 credentials from the standard AWS_* variables)
    archive_url: str | None = Field(
        default=None,
        description="Where the archive writes: file:///dir or s3://bucket/prefix; unset: no archive (and no archive bound on raw trim).",
    )
    archive_endpoint: str | None = Field(
        default=None, description="S3 endpoint URL (an S3-compatible store); unset: AWS_ENDPOINT_URL or AWS's own."
    )
    archive_region: str | None = Field(default=None, description="S3 region; unset: AWS_REGION / AWS_DEFAULT_REGION.")
    archive_group: str = Field(default=CONSUMER["archive"].default_group, description="Consumer group of the archive on the raw, control and topic streams.")
    archive_segment_max_entries: int = Field(default=100_000, ge=1, description="A segment is cut at this many entries.")
    archive_segment_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, le=512 * 1024 * 1024,
        description="A segment is cut at this many bytes of field values (before compression).",
    )
    archive_segment_max_age_s: float = Field(
        default=300.0, gt=0, description="A segment is cut when its first entry was read this long ago (bounds the archive's lag at low rates)."
    )
    archive_buffer_max_bytes: int = Field(
        default=128 * 1024 * 1024, ge=1024 * 1024,
        description="Field bytes the archive holds as objects across its open segments; past it the largest raw stream becomes a row group, the largest lake segment is cut (bounds its memory).",
    )
    archive_store_timeout_s: float = Field(default=30.0, gt=0, description="One request to the object store fails after this long.")

    @field_validator("metric_tools")
    @classmethod
    def _metric_tools(cls, names: list[str]) -> list[str]:
        if not names:
            return names  # the default: a tap never imports the metrics or the redaction rules
        from contracts.tool_labels import metric_tools_problem
        from services.redaction import Redactor

        # A label value is published in every scrape and alert: a name a redaction rule would hide
        # is refused without quoting it (the error line must not leak what it looks like).
        redactor = Redactor()
        for i, name in enumerate(names):
            if redactor.redact_text(name)[0] != name:
                raise ValueError(f"entry {i + 1} looks like a credential (a redaction rule matches it)")
        problem = metric_tools_problem(names)
        if problem is not None:
            raise ValueError(problem)
        return names

    @model_validator(mode="before")
    @classmethod
    def _default_shards(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("shards") in (None, ""):
            try:
                cluster = TypeAdapter(bool).validate_python(data.get("redis_cluster", False))
            except ValidationError:
                cluster = False  # reported by the field's own validation
            data = {**data, "shards": CLUSTER_SHARDS if cluster else SINGLE_NODE_SHARDS}
        return data

    @property
    def layout(self) -> KeyLayout:
        """Every key and stream name (contracts/keys.py).

        Not a cached_property: `model_copy(update=...)` copies the instance dict, cache included,
        and would keep the names of the settings it was copied from. The layout is memoised by
        value instead (KeyLayout is frozen and hashable).
        """
        return _layout(
            self.namespace,
            self.shards,
            self.redis_cluster,
            self.raw_stream_prefix,
            self.control_stream_prefix,
            self.events_topic,
            self.runs_topic,
            self.deadletter_stream,
        )

    @property
    def deadletter_keep_hours(self) -> float:
        """How long dead letters are kept (the one retention rule of every consumer's dead letters)."""
        return self.topic_retention_hours if self.deadletter_retention_hours is None else self.deadletter_retention_hours

    def redactor(self) -> Redactor | None:
        """The configured Redactor, or None when redaction is off (raises ValueError on a bad rule)."""
        if not self.redaction_enabled:
            return None
        from services.redaction import Redactor

        return Redactor(self.redaction_extra_rules, self.redaction_disable)

    def for_command(self, command: str) -> Settings:
        """These settings with `command`'s own default metrics port, unless GOOSE_INGEST_METRICS_PORT was set."""
        if "metrics_port" in self.model_fields_set:
            return self
        return self.model_copy(update={"metrics_port": COMMAND_METRICS_PORTS.get(command, DEFAULT_METRICS_PORT)})

    def key(self, name: str) -> str:
        return self.layout.key(name)

