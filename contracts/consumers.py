"""The consumers of the streams as one table of plain data: one row per consumer (issue 33 item 2).

Everything outside a consumer's own package that names a consumer reads this table: the ACL
(`services/broker/acl.py`: exporter key families, role names), the CLI (`goose-ingest export <target>`
finds its subcommands here), the settings (each group name and each metrics port default), the
dead-letter vocabulary (`contracts/deadletters.py` REASONS_BY_CONSUMER) and the consumer contract's
harness (tests/consumers/harness.py). What cannot read it (deploy/redis/users.acl, the Prometheus
rules' job regex, the docs' port table) is held equal to it by tests/core/test_consumers_registry.py.
Adding a sink is a row here plus its package (docs/consumers.md "Adding a sink").

Plain tuples and strings: the only imports are other contracts (the worker's reasons live beside the
raw entry they describe, contracts/raw.py). The dead-letter reasons of the exporters are defined here,
as a column of their row; contracts/deadletters.py re-exports them.
"""

from __future__ import annotations

from typing import NamedTuple

from contracts.keys import KeyLayout
from contracts.raw import DEAD_LETTER_REASONS, INVALID_ENTRY, MAX_DELIVERIES

WORKER_REASONS: tuple[str, ...] = DEAD_LETTER_REASONS  # the worker's: they name what happens to a raw entry

# The exporters' dead-letter reasons (besides INVALID_ENTRY and MAX_DELIVERIES); prefixed with the
# exporter's name where the same word would mean a different check (contracts/deadletters.py).
OTLP_REJECTED = "otlp-rejected"  # the collector refused the content (HTTP 400/413): spans kept in `otlp`
POSTGRES_INVALID_ENTRY = "postgres-invalid-entry"  # not a topic entry the contract describes
POSTGRES_REJECTED = "postgres-rejected"  # the database refused the row (detail: SQLSTATE and message)
JSONL_INVALID_ENTRY = "jsonl-invalid-entry"  # its `data` is not a JSON object: nothing to write a line of

# Where a consumer's dead letters go.
DEADLETTER_WORKER = "worker"  # `<deadletter>[.<shard>]`: the raw log's (layout.deadletter_partitions)
DEADLETTER_OWN = "own"  # `<deadletter>.<name>[.<shard>]`: its own stream, the only one its ACL user may XADD to
DEADLETTER_NONE = "none"  # it has none (the archive stores every entry as it is)


class Consumer(NamedTuple):
    """One consumer of the streams: what names it, where its group and dead letters live."""

    # Its name in key names, ACL roles and dead-letter `exporter` fields (`otlp` -> `goose.deadletter.otlp`,
    # role `otlp-exporter`), and its key in REASONS_BY_CONSUMER.
    name: str
    # The CLI command that runs it (`goose-ingest <command>`), also its key in COMMAND_METRICS_PORTS.
    command: str
    # The module whose `register(subparsers)` adds the command.
    module: str
    # The Settings field that holds its consumer group's name (GOOSE_INGEST_<FIELD>), and its default.
    group_setting: str
    default_group: str
    # Its ACL role (deploy/redis/users.acl; the user is `goose-<role>`).
    role: str
    # An exporter: reads the topics with a group of its own and owns `export_*:<name>` key families
    # and `<deadletter>.<name>` (services/broker/acl.py KeyPatterns).
    exporter: bool
    # DEADLETTER_WORKER, DEADLETTER_OWN or DEADLETTER_NONE, and the reasons it may write.
    deadletter: str
    reasons: tuple[str, ...]
    # The metrics port when GOOSE_INGEST_METRICS_PORT is not set: distinct, so consumers share a host.
    metrics_port: int
    # The suffix of its Prometheus job (the chart's Service names, the compose jobs: `<...>-<suffix>`);
    # "" for the workers' job, which has none (deploy/prometheus/rules.yml job_component).
    job_suffix: str


WORKER = "worker"
OTLP = "otlp"
POSTGRES = "postgres"
ARCHIVE = "archive"
JSONL = "jsonl"

CONSUMERS: tuple[Consumer, ...] = (
    Consumer(WORKER, "worker", "services.worker.command", "group", "goose-ingest", "worker", exporter=False,
             deadletter=DEADLETTER_WORKER, reasons=WORKER_REASONS, metrics_port=9464, job_suffix=""),
    Consumer(OTLP, "export otlp", "services.export.otlp.command", "otlp_group", "goose-ingest-otlp", "otlp-exporter",
             exporter=True, deadletter=DEADLETTER_OWN, reasons=(INVALID_ENTRY, MAX_DELIVERIES, OTLP_REJECTED),
             metrics_port=9465, job_suffix="otlp"),
    Consumer(POSTGRES, "export postgres", "services.export.postgres.command", "postgres_group", "goose-ingest-postgres",
             "postgres-exporter", exporter=True, deadletter=DEADLETTER_OWN,
             reasons=(POSTGRES_INVALID_ENTRY, POSTGRES_REJECTED, MAX_DELIVERIES), metrics_port=9466,
             job_suffix="postgres"),
    Consumer(ARCHIVE, "archive", "services.archive.command", "archive_group", "goose-ingest-archive", "archive",
             exporter=False, deadletter=DEADLETTER_NONE, reasons=(), metrics_port=9467, job_suffix="archive"),
    Consumer(JSONL, "export jsonl", "services.export.jsonl.command", "jsonl_group", "goose-ingest-jsonl",
             "jsonl-exporter", exporter=True, deadletter=DEADLETTER_OWN, reasons=(JSONL_INVALID_ENTRY, MAX_DELIVERIES),
             metrics_port=9468, job_suffix="jsonl"),
)

BY_NAME: dict[str, Consumer] = {c.name: c for c in CONSUMERS}
BY_COMMAND: dict[str, Consumer] = {c.command: c for c in CONSUMERS}
EXPORTERS: tuple[str, ...] = tuple(c.name for c in CONSUMERS if c.exporter)
# Which reasons each consumer may write (a test holds every writer to its list).
REASONS_BY_CONSUMER: dict[str, tuple[str, ...]] = {c.name: c.reasons for c in CONSUMERS if c.deadletter != DEADLETTER_NONE}


def deadletter_streams(consumer: Consumer, layout: KeyLayout) -> list[str]:
    """Every partition of the dead-letter stream `consumer` writes to ([] when it has none)."""
    if consumer.deadletter == DEADLETTER_WORKER:
        return layout.deadletter_partitions()
    if consumer.deadletter == DEADLETTER_OWN:
        return layout.export_deadletter_partitions(consumer.name)
    return []
