"""The archive ships like the rest (issue 23, Deliver 7): a Helm Deployment (off by default, one
replica with the Recreate strategy, its own Redis user and the store credentials from Secrets, never
in the ConfigMap) and a docker-compose service."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.test_helm_chart import env_of, helm, kubeconfig, render, validate_core  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
ON = {"archive": {"enabled": True, "redisSecret": "archive-redis", "existingSecret": "archive-s3"},
      "settings": {"archive_url": "s3://fleet-archive/goose", "archive_region": "eu-west-1"}}


def _archive(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "archive"]


def test_archive_is_off_by_default(helm, kubeconfig):  # noqa: F811
    assert _archive(render(helm, kubeconfig)) == []


def test_archive_deployment_one_replica_recreate_credentials_from_secrets(helm, kubeconfig):  # noqa: F811
    objs = render(helm, kubeconfig, ON)
    dep = next(o for o in _archive(objs) if o["kind"] == "Deployment")
    validate_core(dep)
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["archive"]
    env = env_of(dep)
    assert env["GOOSE_INGEST_REDIS_USERNAME"]["valueFrom"]["secretKeyRef"]["name"] == "archive-redis"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "archive-s3", "key": "access-key-id"}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "archive-s3", "key": "secret-access-key"}
    config = next(o for o in objs if o["kind"] == "ConfigMap" and "grafana_dashboard" not in o["metadata"]["labels"])["data"]
    # the URL goes to every pod (the workers bound their raw trim by it); no credential ever does
    assert config["GOOSE_INGEST_ARCHIVE_URL"] == "s3://fleet-archive/goose"
    assert not [k for k in config if k.startswith("AWS_") or "SECRET" in k]
    assert {o["kind"] for o in _archive(objs)} >= {"Deployment", "Service"}


def test_archive_without_secret_uses_the_ambient_identity(helm, kubeconfig):  # noqa: F811
    objs = render(helm, kubeconfig, {**ON, "archive": {"enabled": True, "redisSecret": "archive-redis"}})
    dep = next(o for o in _archive(objs) if o["kind"] == "Deployment")
    assert not [k for k in env_of(dep) if k.startswith("AWS_")]


@pytest.mark.parametrize("values,needs", [
    ({"archive": {"enabled": True, "redisSecret": "r"}}, "settings.archive_url"),
    ({"archive": {"enabled": True}, "settings": {"archive_url": "s3://b/p"}}, "archive.redisSecret"),
])
def test_archive_enabled_without_what_it_needs_fails_to_render(helm, kubeconfig, values, needs):  # noqa: F811
    with pytest.raises(helm.HelmError) as exc:
        render(helm, kubeconfig, values)
    assert needs in str(exc.value)


def test_compose_runs_the_archive_into_a_local_volume():
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    svc = compose["services"]["archive"]
    assert svc["command"][:1] == ["archive"] and "profiles" not in svc  # on by default, like the workers
    env = svc["environment"]
    assert env["GOOSE_INGEST_ARCHIVE_URL"] == "file:///archive"
    assert "archive-data:/archive" in svc["volumes"] and "archive-data" in compose["volumes"]
    # the workers see the same URL, so their raw trim waits for the archive
    for name, worker in compose["services"].items():
        if worker.get("command", [None])[:1] == ["worker"]:
            assert worker["environment"]["GOOSE_INGEST_ARCHIVE_URL"] == env["GOOSE_INGEST_ARCHIVE_URL"], name
