"""The consumers' table (contracts/consumers.py) against every place that names a consumer.

Adding a consumer is one row of that table plus its package: these tests fail until the settings
(its group and metrics port), the ACL (its role, its exporter key families, users.acl), the CLI
(`export <target>`), the dead-letter vocabulary, the Prometheus rules' job selector, the docs' port
table and the consumer contract's harness all agree with the table.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import re
from pathlib import Path

import pytest
import yaml

from contracts.consumers import (
    BY_COMMAND,
    CONSUMERS,
    DEADLETTER_NONE,
    DEADLETTER_OWN,
    DEADLETTER_WORKER,
    EXPORTERS,
    REASONS_BY_CONSUMER,
    deadletter_streams,
)
from contracts.deadletters import DEAD_LETTER_REASONS
from contracts.keys import KeyLayout
from services.broker import acl
from services.settings import COMMAND_METRICS_PORTS, DEFAULT_METRICS_PORT, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_rows_are_distinct():
    for column in ("name", "command", "module", "group_setting", "default_group", "role", "metrics_port"):
        values = [getattr(c, column) for c in CONSUMERS]
        assert len(values) == len(set(values)), column
    assert all(c.deadletter in (DEADLETTER_WORKER, DEADLETTER_OWN, DEADLETTER_NONE) for c in CONSUMERS)
    assert all(bool(c.reasons) == (c.deadletter != DEADLETTER_NONE) for c in CONSUMERS)


@pytest.mark.parametrize("row", CONSUMERS, ids=lambda c: c.name)
def test_every_group_name_is_a_setting_with_the_rows_default(row, monkeypatch):
    field = Settings.model_fields[row.group_setting]
    assert field.default == row.default_group
    monkeypatch.setenv(f"GOOSE_INGEST_{row.group_setting.upper()}", "g-from-env")
    assert getattr(Settings(), row.group_setting) == "g-from-env"


def test_the_metrics_ports_are_the_rows():
    assert COMMAND_METRICS_PORTS == {**{c.command: c.metrics_port for c in CONSUMERS}, "up": DEFAULT_METRICS_PORT}
    for row in CONSUMERS:
        assert Settings().for_command(row.command).metrics_port == row.metrics_port
    text = (ROOT / "docs" / "operations.md").read_text()
    for row in CONSUMERS:  # the operator's port table
        assert re.search(rf"`{row.command}`(\s+and `up`)?\s+\*\*{row.metrics_port}\*\*", text), row.command


def test_the_acl_roles_and_exporters_are_the_rows():
    assert acl.EXPORTERS == EXPORTERS == tuple(c.name for c in CONSUMERS if c.deadletter == DEADLETTER_OWN)
    roles = {r.name: r for r in acl.roles(KeyLayout())}
    assert tuple(roles) == acl.ROLE_NAMES
    for row in CONSUMERS:
        assert row.role in roles, row.role
        if row.exporter:
            assert acl.exporter_role(row.name) == row.role
    users = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    for row in CONSUMERS:
        assert f"user {acl.user_name(row.role)} " in users
    for role in acl.ROLE_NAMES:  # every role but the consumers' is a person's or a producer's
        assert role in {c.role for c in CONSUMERS} | {"tap", "gateway", "importer", "consumer", "admin"}


@pytest.mark.parametrize("row", [c for c in CONSUMERS if c.deadletter == DEADLETTER_OWN], ids=lambda c: c.name)
def test_an_exporter_may_write_its_own_dead_letters_and_no_others(row):
    layout = KeyLayout()
    role = {r.name: r for r in acl.roles(layout)}[row.role]
    patterns = [token.split("~", 1)[1].rstrip(")") for rule in role.rules for token in rule.split() if "~" in token]

    def may_touch(stream: str) -> bool:
        return any(fnmatch.fnmatchcase(stream, p) for p in patterns)

    assert may_touch(layout.export_deadletter_partition(row.name, 0))
    others = [s for other in CONSUMERS if other is not row for s in deadletter_streams(other, layout)]
    assert others and not [s for s in others if may_touch(s)]


def test_the_dead_letter_vocabulary_is_the_rows():
    assert REASONS_BY_CONSUMER == {c.name: c.reasons for c in CONSUMERS if c.deadletter != DEADLETTER_NONE}
    assert set(DEAD_LETTER_REASONS) == {r for c in CONSUMERS for r in c.reasons}
    from services.export.otlp.metrics import DEAD_LETTER_REASONS as OTLP_LABELS

    assert set(OTLP_LABELS) == set(BY_COMMAND["export otlp"].reasons)


@pytest.mark.parametrize("row", CONSUMERS, ids=lambda c: c.name)
def test_every_row_is_a_command_of_the_cli(row):
    from services.cli import build_parser

    parser = build_parser()
    # argparse exits 0 on --help only if every word of the command names a subparser
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([*row.command.split(), "--help"])
    assert exc.value.code == 0
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(row.module).register(sub)
    assert row.command.split()[-1] in sub.choices


def test_the_export_command_lists_the_export_rows():
    from services.export import command

    assert command._EXPORTER_MODULES == [c.module for c in CONSUMERS if c.command.startswith("export ")]


def test_the_prometheus_component_selector_is_the_rows():
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("record") == "job_component:goose_ingest_up:sum"]
    assert len(exprs) == 1
    match = re.search(r'"job", "\.\*-\(([^)]*)\)"', exprs[0])
    assert match, exprs[0]
    suffixes = set(match.group(1).split("|"))
    # every consumer's job suffix, and the gateway's (no consumer: an HTTP producer)
    assert suffixes == {c.job_suffix for c in CONSUMERS if c.job_suffix} | {"gateway"}
    assert BY_COMMAND["worker"].job_suffix == ""  # the workers' job has no component (GooseIngestNoWorkers)


def test_the_contract_harness_runs_every_row():
    from tests.consumers.harness import CONSUMERS as HARNESS
    from tests.consumers.harness import ROLES

    assert set(HARNESS) == set(BY_COMMAND)
    for command, consumer in HARNESS.items():
        row = BY_COMMAND[command]
        assert consumer.role == row.role and consumer.args == row.command.split()
        assert consumer.exporter == (row.name if row.exporter else "")
        assert row.role in ROLES
    from tests.consumers import test_contract

    contract = {cls.consumer.name for cls in vars(test_contract).values()
                if isinstance(cls, type) and issubclass(cls, test_contract.ConsumerContract) and hasattr(cls, "consumer")}
    assert contract == set(BY_COMMAND)


def test_the_consumers_own_modules_name_their_row():
    from services.export.postgres import sink as postgres_sink

    assert postgres_sink.EXPORTER in EXPORTERS
    assert postgres_sink.DEFAULT_GROUP == Settings.model_fields["postgres_group"].default


def test_the_docs_role_tables_have_a_row_per_consumer():
    """What each user may do (docs/architecture.md) and may destroy (docs/operations.md)."""
    may = (ROOT / "docs" / "architecture.md").read_text()
    destroy = (ROOT / "docs" / "operations.md").read_text()
    for row in CONSUMERS:
        user = acl.user_name(row.role)
        assert f"| `{user}` | `{row.command}`" in may, user
        assert f"(`{user}`) |" in destroy, user
