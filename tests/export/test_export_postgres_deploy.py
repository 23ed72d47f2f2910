"""Shipping the PostgreSQL sink: the chart's optional Deployment, the compose services, and the Grafana
dashboard, whose every query is run against the real views."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from services.export.postgres.store import Store
from tests.deploy.test_helm_chart import helm, kubeconfig, render, validate_core  # noqa: F401 (fixtures)
from tests.export.test_export_postgres import known_fleet
from tests.support import postgres as pg_support
from tests.support.fixtures import REPO

# The PostgreSQL fixtures (tests/support/postgres.py), made visible to this module.
pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "analytics-dashboard.json"
ON = {"postgresExporter": {"enabled": True, "existingSecret": "analytics-db", "replicaCount": 2},
      "settings": {"postgres_retention_days": 30}, "serviceMonitor": {"enabled": True}}


def exporter_objects(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "postgres-exporter"]


# ---------------------------------------------------------------------------------- helm


def test_chart_has_no_postgres_exporter_by_default(helm, kubeconfig):  # noqa: F811
    assert exporter_objects(render(helm, kubeconfig)) == []


def test_enabled_renders_a_valid_deployment_with_the_dsn_from_the_secret(helm, kubeconfig):  # noqa: F811
    objs = render(helm, kubeconfig, ON)
    kinds = {o["kind"]: o for o in exporter_objects(objs)}
    assert set(kinds) == {"Deployment", "Service", "ServiceMonitor"}
    dep = kinds["Deployment"]
    for o in (dep, kinds["Service"]):
        validate_core(o)
    assert dep["spec"]["replicas"] == 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["export", "postgres"]
    env = {e["name"]: e for e in c["env"]}
    assert env["GOOSE_INGEST_POSTGRES_DSN"] == {"name": "GOOSE_INGEST_POSTGRES_DSN",
                                                "valueFrom": {"secretKeyRef": {"name": "analytics-db", "key": "dsn"}}}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel["app.kubernetes.io/component"] == "postgres-exporter"
    assert kinds["Service"]["spec"]["selector"] == sel
    # the settings' ConfigMap (the other one is the Grafana dashboard's)
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and "grafana_dashboard" not in o["metadata"]["labels"]]
    assert cm["data"]["GOOSE_INGEST_POSTGRES_RETENTION_DAYS"] in ("30", "30.0")
    assert not any("POSTGRES_DSN" in k for k in cm["data"])


def test_enabled_without_a_secret_fails_clearly(helm, kubeconfig):  # noqa: F811
    with pytest.raises(Exception, match="postgresExporter.existingSecret"):
        render(helm, kubeconfig, {"postgresExporter": {"enabled": True}})


def test_schema_keeps_the_dsn_out_of_the_configmap_values(helm, kubeconfig):  # noqa: F811
    with pytest.raises(Exception, match="postgres_dsn|additional"):
        render(helm, kubeconfig, {"settings": {"postgres_dsn": "postgresql://u:p@h/db"}})


# ---------------------------------------------------------------------------------- compose and grafana


def test_compose_has_opt_in_analytics_services_and_grafana_reads_them():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    sink = services["postgres-exporter"]
    assert sink["command"] == ["export", "postgres"] and sink["profiles"] == ["analytics"]
    assert sink["environment"]["GOOSE_INGEST_REDIS_URL"] == "redis://redis:6379/0"
    assert "@postgres:5432/analytics" in sink["environment"]["GOOSE_INGEST_POSTGRES_DSN"]
    assert sink["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["postgres"]["profiles"] == ["analytics"]
    mounts = [v.split(":")[1] for v in services["grafana"]["volumes"] if v.startswith("./")]
    assert "/var/lib/grafana/dashboards/goose-ingest/analytics-dashboard.json" in mounts
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "postgres.yml").read_text())
    (source,) = ds["datasources"]
    dash = json.loads(DASHBOARD.read_text())
    (var,) = dash["templating"]["list"]
    assert var["type"] == "datasource" and var["query"] == source["type"] and var["current"]["value"] == source["uid"]
    assert source["jsonData"]["database"] == services["postgres"]["environment"]["POSTGRES_DB"]
    assert "password" not in source and source["secureJsonData"]["password"].startswith("$")


def grafana_to_sql(query: str) -> str:
    """Grafana's SQL macros, expanded as Grafana would for a range covering the test data."""
    query = re.sub(r"\$__timeFilter\(([^()]*(?:\([^()]*\)[^()]*)*)\)",
                   r"\1 BETWEEN '2026-01-01T00:00:00Z' AND '2027-01-01T00:00:00Z'", query)
    assert "$__" not in query, f"unexpanded macro in {query}"
    return query


def test_every_dashboard_query_runs_on_the_views(pg_dsn):
    store = Store(pg_dsn)
    try:
        store.migrate()
        known_fleet(store)
        dash = json.loads(DASHBOARD.read_text())
        queries = {p["title"]: t["rawSql"] for p in dash["panels"] for t in p["targets"]}
        assert len(queries) == len(dash["panels"]) >= 10
        answers = {}
        for title, query in queries.items():
            answers[title] = store.connect().execute(grafana_to_sql(query)).fetchall()
        # Spot checks against the known fleet (4 runs: 1 abandoned, 1 exit 2; 3 shell calls, 1 failed).
        assert answers["Runs started"] == [(4,)]
        assert answers["Abandoned or non-zero exit"] == [(2,)]
        assert answers["Tool calls failed"] == [(0.25,)]
        assert [r[0] for r in answers["Slowest commands"]] == ["pytest -q", "ls"]
        assert {r[1] for r in answers["Abandoned and non-zero-exit runs"]} == {"B", "C"}
        for title in ("Tokens per day by model (agent when the records name no model)", "Tool failure rate by tool and week"):
            assert answers[title], title  # time series with data points
    finally:
        store.close()
