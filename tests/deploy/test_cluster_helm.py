"""The Helm chart in cluster mode: the ConfigMap turns cluster mode on with 16 shards by default, and
KEDA gets one redis-cluster-streams trigger per shard, on the stream names KeyLayout gives."""

from __future__ import annotations

import pytest

from contracts.keys import KeyLayout
from tests.deploy.test_helm_chart import by_kind, helm, kubeconfig, render  # noqa: F401 (fixtures)

CLUSTER_VALUES = {
    # the shard count is explicit (values.yaml's default of 4 is the single-node one)
    "settings": {"redis_cluster": True, "namespace": "prod", "shards": 16},
    "keda": {"enabled": True, "addresses": "redis-0.redis:6379,redis-1.redis:6379,redis-2.redis:6379"},
    "redis": {"existingSecret": "broker", "urlKey": "url", "passwordKey": "password"},
}


def test_cluster_values_render_a_trigger_per_shard_partition(helm, kubeconfig):  # noqa: F811
    objs = by_kind(render(helm, kubeconfig, CLUSTER_VALUES))
    config = objs["ConfigMap"]["data"]
    assert config["GOOSE_INGEST_REDIS_CLUSTER"] == "true"
    layout = KeyLayout(namespace="prod", shards=16, cluster=True)
    triggers = objs["ScaledObject"]["spec"]["triggers"]
    assert [t["metadata"]["stream"] for t in triggers] == layout.raw_streams()
    for t in triggers:
        assert t["type"] == "redis-cluster-streams"
        assert t["metadata"]["addresses"] == CLUSTER_VALUES["keda"]["addresses"]
        assert "address" not in t["metadata"] and "databaseIndex" not in t["metadata"]
        assert t["authenticationRef"]["name"].endswith("-redis")


def test_an_explicit_shard_count_wins_in_cluster_mode(helm, kubeconfig):  # noqa: F811
    values = {**CLUSTER_VALUES, "settings": {"redis_cluster": True, "shards": 32}}
    objs = by_kind(render(helm, kubeconfig, values))
    assert objs["ConfigMap"]["data"]["GOOSE_INGEST_SHARDS"] == "32"
    assert len(objs["ScaledObject"]["spec"]["triggers"]) == 32
    assert objs["ScaledObject"]["spec"]["triggers"][31]["metadata"]["stream"] == "goose.raw.{s31}"


def test_cluster_mode_without_keda_addresses_is_refused(helm, kubeconfig):  # noqa: F811
    values = {**CLUSTER_VALUES, "keda": {"enabled": True}}
    with pytest.raises(Exception, match="keda.addresses"):
        render(helm, kubeconfig, values)
