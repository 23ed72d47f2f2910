"""Shipping the OTLP exporter: the chart's optional Deployment (off by default) and the compose service."""

from __future__ import annotations

import pytest

from tests.deploy.test_helm_chart import helm, kubeconfig, render, validate_core  # noqa: F401 (fixtures)

ON = {"otlpExporter": {"enabled": True, "endpoint": "http://otel-collector:4318", "replicaCount": 2,
                       "resourceAttributes": "deployment.environment=prod", "headersSecret": "otlp-auth"},
      "serviceMonitor": {"enabled": True}}


def exporter_objects(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "otlp-exporter"]


def test_off_by_default(helm, kubeconfig):  # noqa: F811
    assert exporter_objects(render(helm, kubeconfig)) == []


def test_enabled_renders_a_valid_deployment_service_and_monitor(helm, kubeconfig):  # noqa: F811
    objs = exporter_objects(render(helm, kubeconfig, ON))
    kinds = {o["kind"]: o for o in objs}
    assert set(kinds) == {"Deployment", "Service", "ServiceMonitor"}
    dep = kinds["Deployment"]
    for o in (dep, kinds["Service"]):
        validate_core(o)
    assert dep["spec"]["replicas"] == 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["export", "otlp"]
    env = {e["name"]: e for e in c["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector:4318"
    assert env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"]["value"] == "false"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {"name": "otlp-auth", "key": "otlp-headers"}
    assert "value" not in env["GOOSE_INGEST_REDIS_URL"]  # credentials only from the Secret
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # the exporter's pods are not the workers': distinct selectors
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel["app.kubernetes.io/component"] == "otlp-exporter"
    assert kinds["Service"]["spec"]["selector"] == sel
    assert kinds["ServiceMonitor"]["spec"]["selector"]["matchLabels"] == sel


def test_enabled_without_endpoint_fails_clearly(helm, kubeconfig):  # noqa: F811
    with pytest.raises(Exception, match="otlpExporter.endpoint is required"):
        render(helm, kubeconfig, {"otlpExporter": {"enabled": True}})


def test_compose_has_an_opt_in_exporter_service():
    import yaml

    from tests.support.fixtures import REPO

    services = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())["services"]
    svc = services["otlp-exporter"]
    assert svc["command"] == ["export", "otlp"] and svc["profiles"] == ["otlp"]
    assert svc["environment"]["GOOSE_INGEST_REDIS_URL"] == "redis://redis:6379/0"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in svc["environment"]
    assert services["phoenix"]["profiles"] == ["otlp"]  # the default target, also opt-in
