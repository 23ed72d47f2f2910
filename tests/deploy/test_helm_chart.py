"""helm/goose-ingest: rendered by helm's own engine, validated offline against Kubernetes schemas.

How it renders without a cluster or a helm binary
-------------------------------------------------
PyPI's `helm-sdkpy` wheel bundles helm's Go library (v4) but exposes no `template` action; its
`Install` needs a reachable API server. This test starts a tiny fake Kubernetes API server on
127.0.0.1 (discovery documents for the kinds the chart uses, 404 for every GET, echo for every
create) and runs a real `helm install` against it through a throwaway kubeconfig. Helm then loads
the chart directory (following the files/rules.yml symlink), validates the values against
values.schema.json, renders the templates and returns the manifest — exactly what `helm template`
would print. Nothing leaves the machine.

Every rendered object is validated with `kubernetes-validate` (strict: unknown fields are errors)
for Kubernetes 1.28 and 1.37; the CRD kinds (ServiceMonitor, PrometheusRule, ScaledObject,
TriggerAuthentication) get the structural checks below.

Needs (in .venv): helm-sdkpy (`pip install --ignore-requires-python helm-sdkpy`),
kubernetes-validate, jsonschema, pyyaml. Without helm-sdkpy the rendering tests skip locally and
FAIL when `CI` is set.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from services.settings import Settings
from tests.support.needs import missing

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "goose-ingest"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
K8S_VERSIONS = ("1.28.0", "1.37.0")
RELEASE = "gi"
FULLNAME = "gi-goose-ingest"
SETTINGS_NOT_IN_CONFIGMAP = {"redis_url", "redis_username", "redis_password", "metrics_port", "metrics_host",
                             "metrics_port_file",  # per process, like the port: the image sets it
                             "postgres_dsn",  # the DSN carries a password: postgresExporter.existingSecret
                             "gateway_host", "gateway_port",  # per process, like the metrics port
                             # the tap's side of the gateway: agent hosts' settings, not the cluster's
                             "endpoint", "token", "token_file", "endpoint_ca_file"}

ALL_ON = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "keda": {"enabled": True, "address": "redis-master.redis:6379"},
    "hpa": {"enabled": True},
    "redis": {"existingSecret": "broker", "urlKey": "url", "passwordKey": "password", "usernameKey": "user"},
    "settings": {"shards": 3, "namespace": "prod", "group": "gi", "max_line_bytes": 2097152, "run_idle_timeout_s": 600.5},
    "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
    "serviceAccount": {"create": True, "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ingest", "effect": "NoSchedule"}],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "goose-ingest"}},
                    },
                }
            ]
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "goose-ingest"}},
        }
    ],
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "imagePullSecrets": [{"name": "regcred"}],
    "priorityClassName": "ingest",
    "podAnnotations": {"example.com/team": "observability"},
}


# ------------------------------------------------------------------ fake API server
# One copy of it: helm/render.py, the documented way to print the chart's manifest without helm.
_spec = importlib.util.spec_from_file_location("chart_render", ROOT / "helm" / "render.py")
assert _spec is not None and _spec.loader is not None
chart_render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chart_render)
DISCOVERY = chart_render.DISCOVERY


@pytest.fixture(scope="module")
def helm():
    try:
        import helm_sdkpy
    except ImportError:
        missing("helm-sdkpy", "pip install --ignore-requires-python helm-sdkpy")
    return helm_sdkpy


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory):
    with chart_render.fake_cluster(tmp_path_factory.mktemp("kube"), DISCOVERY) as path:
        yield path


@pytest.fixture(scope="module")
def bare_kubeconfig(tmp_path_factory):
    """A cluster without the Prometheus Operator: no monitoring.coreos.com CRDs."""
    bare = {gv: r for gv, r in DISCOVERY.items() if gv[0] != "monitoring.coreos.com"}
    with chart_render.fake_cluster(tmp_path_factory.mktemp("kube"), bare) as path:
        yield path


def render(helm, kubeconfig: str, values: dict | None = None) -> list[dict]:
    manifest = chart_render.render_manifest(kubeconfig, values, RELEASE, "ingest", CHART)
    return [d for d in yaml.safe_load_all(manifest) if d]


def test_the_documented_script_prints_the_manifest_without_a_helm_binary(helm, tmp_path):
    """`python helm/render.py [-f values.yaml]` (docs/operations.md): the manifest on stdout, a values
    file merged as helm's -f, a value the schema refuses is exit 1 with helm's reason."""
    import subprocess
    import sys

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"settings": {"shards": 3}, "hpa": {"enabled": True}}))
    out = subprocess.run([sys.executable, str(ROOT / "helm" / "render.py"), "-f", str(values), "--release", "x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "ConfigMap", "Service", "HorizontalPodAutoscaler"} <= kinds, kinds
    assert any(o["kind"] == "ConfigMap" and o["data"].get("GOOSE_INGEST_SHARDS") == "3" for o in objs)
    values.write_text(yaml.safe_dump({"replicaCont": 3}))
    bad = subprocess.run([sys.executable, str(ROOT / "helm" / "render.py"), "-f", str(values)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout == "" and "replicaCont" in bad.stderr, bad.stderr[-2000:]


DASHBOARD = "ConfigMap/dashboard"  # by_kind's key for the Grafana dashboard's ConfigMap (the settings' is "ConfigMap")


def by_kind(objs: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for o in objs:
        kind = DASHBOARD if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"].get("labels", {}) else o["kind"]
        assert kind not in out, f"two {kind} objects"
        out[kind] = o
    return out


# ------------------------------------------------------------------ validation helpers

CORE_KINDS = {"ConfigMap", "Service", "ServiceAccount", "Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler"}


def validate_core(obj: dict) -> None:
    import kubernetes_validate

    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")


def check_metadata(obj: dict) -> None:
    md = obj["metadata"]
    assert DNS_LABEL.fullmatch(md["name"]) and len(md["name"]) <= 63, md["name"]
    for k, v in md.get("labels", {}).items():
        assert isinstance(v, str) and len(v) <= 63, (k, v)


def check_service_monitor(sm: dict, objs: dict[str, dict]) -> None:
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    spec = sm["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
    service = objs["Service"]
    sel = spec["selector"]["matchLabels"]
    assert sel.items() <= service["metadata"]["labels"].items(), "ServiceMonitor does not select the Service"
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for ep in spec["endpoints"]:
        assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings", "metricRelabelings", "honorLabels"}
        assert ep["port"] in port_names and ep["path"] == "/metrics"
        assert DURATION.fullmatch(ep["interval"]) and DURATION.fullmatch(ep["scrapeTimeout"])


def check_prometheus_rule(pr: dict) -> None:
    assert pr["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(pr["spec"]) == {"groups"}
    for g in pr["spec"]["groups"]:
        assert set(g) <= {"name", "interval", "rules", "limit"} and isinstance(g["name"], str)
        for r in g["rules"]:
            assert ("record" in r) != ("alert" in r), r
            assert isinstance(r["expr"], str) and r["expr"].strip()
            assert set(r) <= {"record", "alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
            if "for" in r:
                assert DURATION.fullmatch(r["for"])
            for k in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in r.get(k, {}).values())


def check_scaled_object(so: dict, deployment: dict) -> None:
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    for t in spec["triggers"]:
        assert t["type"] == "redis-streams"
        # KEDA's trigger metadata is map[string]string: a bare number or bool is rejected
        assert all(isinstance(v, str) for v in t["metadata"].values()), t["metadata"]
        assert {"address", "stream", "consumerGroup", "lagCount"} <= set(t["metadata"])
        assert "pendingEntriesCount" not in t["metadata"]  # scale on lag, not on pending


def check_trigger_auth(ta: dict) -> None:
    assert ta["apiVersion"] == "keda.sh/v1alpha1"
    for ref in ta["spec"]["secretTargetRef"]:
        assert set(ref) == {"parameter", "name", "key"}
        assert ref["parameter"] in {"password", "username"}


def validate_all(objs: list[dict]) -> dict[str, dict]:
    kinds = by_kind(objs)
    for o in objs:
        check_metadata(o)
        if o["kind"] in CORE_KINDS:
            validate_core(o)
        elif o["kind"] == "ServiceMonitor":
            check_service_monitor(o, kinds)
        elif o["kind"] == "PrometheusRule":
            check_prometheus_rule(o)
        elif o["kind"] == "ScaledObject":
            check_scaled_object(o, kinds["Deployment"])
        elif o["kind"] == "TriggerAuthentication":
            check_trigger_auth(o)
        else:
            pytest.fail(f"unexpected kind {o['kind']}")
    return kinds


def env_of(deployment: dict) -> dict[str, dict]:
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


# ------------------------------------------------------------------ tests: rendering


def test_validation_catches_bad_objects():
    """The validators used below do reject broken objects (guards against a vacuous pass)."""
    import kubernetes_validate

    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(bad)
    with pytest.raises(AssertionError):
        check_scaled_object(
            {"apiVersion": "keda.sh/v1alpha1", "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"},
             "minReplicaCount": 1, "maxReplicaCount": 2,
             "triggers": [{"type": "redis-streams", "metadata": {"address": "a", "stream": "s", "consumerGroup": "g", "lagCount": 5}}]}},
            {"metadata": {"name": "d"}},
        )


def test_default_render_without_the_operator_skips_the_rule_and_says_so(helm, bare_kubeconfig):
    # prometheusRule.enabled is on by default; a cluster without the Operator's CRD must still install
    # (no object of an unknown kind) and the release notes must say where the rules have to go instead
    cfg = helm.Configuration(namespace="ingest", kubeconfig=bare_kubeconfig)
    release = asyncio.run(helm.Install(cfg).run(RELEASE, str(CHART), values=None, wait=False, timeout=60))
    objs = [d for d in yaml.safe_load_all(release["manifest"]) if d]
    kinds = validate_all(objs)
    assert set(kinds) == {"ServiceAccount", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget", DASHBOARD}
    notes = json.dumps(release)
    assert "no PrometheusRule CRD" in notes and "deploy/prometheus/rules.yml" in notes
    assert "no ServiceMonitor CRD" in notes
    check_dashboard(kinds[DASHBOARD])


def check_dashboard(cm: dict) -> None:
    """The dashboard's ConfigMap: labelled for Grafana's sidecar, holding deploy/grafana/dashboard.json as it is."""
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (body,) = cm["data"].values()
    assert json.loads(body) == json.loads((ROOT / "deploy" / "grafana" / "dashboard.json").read_text())
    link = CHART / "files" / "dashboard.json"
    assert link.is_symlink() and os.readlink(link) == "../../../deploy/grafana/dashboard.json"


def test_default_render_with_the_operator_gives_a_working_dashboard(helm, kubeconfig):
    """Defaults only, on a cluster with the Operator's CRDs: the pods are scraped (ServiceMonitor), the
    recording rules the panels read are loaded (PrometheusRule), both labelled with the `release:`
    kube-prometheus-stack's Prometheus selects by, and the dashboard is there for Grafana's sidecar."""
    kinds = validate_all(render(helm, kubeconfig))
    assert {"ServiceMonitor", "PrometheusRule", DASHBOARD} <= set(kinds)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert kinds[kind]["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    check_dashboard(kinds[DASHBOARD])
    # each can be turned off
    off = by_kind(render(helm, kubeconfig, {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False},
                                            "grafanaDashboard": {"enabled": False}}))
    assert not {"ServiceMonitor", "PrometheusRule", DASHBOARD} & set(off)


def test_default_render_is_valid(helm, kubeconfig):
    objs = render(helm, kubeconfig)
    kinds = validate_all(objs)
    # the ServiceMonitor and PrometheusRule are on by default (the dashboard reads the scraped series and
    # the rules' recordings): this fake cluster has their CRDs
    assert set(kinds) == {"ServiceAccount", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget", "PrometheusRule",
                          "ServiceMonitor", DASHBOARD}

    dep = kinds["Deployment"]
    assert dep["metadata"]["name"] == FULLNAME
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 60
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["args"] == ["worker"]
    assert c["envFrom"] == [{"configMapRef": {"name": FULLNAME}}]
    env = env_of(dep)
    assert env["GOOSE_INGEST_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "goose-ingest-redis", "key": "redis-url"}
    assert "GOOSE_INGEST_REDIS_PASSWORD" not in env
    assert env["GOOSE_INGEST_METRICS_PORT"]["value"] == "9464"

    cm = kinds["ConfigMap"]["data"]
    assert cm == {"GOOSE_INGEST_SHARDS": "4", "GOOSE_INGEST_GROUP": "goose-ingest", "GOOSE_INGEST_BATCH_SIZE": "500"}
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == "metrics"
    assert kinds["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def test_all_features_render_is_valid(helm, kubeconfig):
    objs = render(helm, kubeconfig, ALL_ON)
    kinds = validate_all(objs)
    assert set(kinds) == {
        "ServiceAccount", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget",
        "ServiceMonitor", "PrometheusRule", "ScaledObject", "TriggerAuthentication", DASHBOARD,
    }
    # KEDA on: no HPA even though hpa.enabled, and the Deployment leaves replicas to the autoscaler
    assert "HorizontalPodAutoscaler" not in kinds
    assert "replicas" not in kinds["Deployment"]["spec"]

    so = kinds["ScaledObject"]["spec"]
    assert [t["metadata"]["stream"] for t in so["triggers"]] == ["prod:goose.raw.0", "prod:goose.raw.1", "prod:goose.raw.2"]
    assert {t["metadata"]["consumerGroup"] for t in so["triggers"]} == {"gi"}
    assert {t["authenticationRef"]["name"] for t in so["triggers"]} == {kinds["TriggerAuthentication"]["metadata"]["name"]}

    # PrometheusRule groups are the rules file, verbatim (through the symlink)
    assert kinds["PrometheusRule"]["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]

    env = env_of(kinds["Deployment"])
    assert env["GOOSE_INGEST_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "broker", "key": "url"}
    assert env["GOOSE_INGEST_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "broker", "key": "password"}
    assert env["GOOSE_INGEST_REDIS_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "broker", "key": "user"}

    cm = kinds["ConfigMap"]["data"]
    assert cm["GOOSE_INGEST_MAX_LINE_BYTES"] == "2097152"  # not 2.097152e+06
    assert cm["GOOSE_INGEST_RUN_IDLE_TIMEOUT_S"] == "600.5"
    assert cm["GOOSE_INGEST_NAMESPACE"] == "prod"
    # the ConfigMap parses back into Settings, and carries no credentials
    parsed = Settings(**{k.removeprefix("GOOSE_INGEST_").lower(): v for k, v in cm.items()})
    assert parsed.shards == 3 and parsed.max_line_bytes == 2097152
    assert not any("REDIS_URL" in k or "PASSWORD" in k or "USERNAME" in k for k in cm)
    assert kinds["PodDisruptionBudget"]["spec"] == {"minAvailable": 1, "selector": kinds["Deployment"]["spec"]["selector"]}


def test_gateway_renders_with_its_own_redis_user_service_ingress_and_hpa(helm, kubeconfig):
    values = {"gateway": {"enabled": True, "redisSecret": "gw-redis",
                          "ingress": {"enabled": True, "host": "goose-gw.example", "className": "nginx",
                                      "tls": [{"hosts": ["goose-gw.example"], "secretName": "gw-tls"}]},
                          "hpa": {"enabled": True}},
              "serviceMonitor": {"enabled": True}}
    objs = render(helm, kubeconfig, values)
    gw = by_kind([o for o in objs if o["metadata"]["labels"].get("app.kubernetes.io/component") == "gateway"])
    assert set(gw) == {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler", "ServiceMonitor"}
    for o in gw.values():
        check_metadata(o)
        if o["kind"] == "ServiceMonitor":
            check_service_monitor(o, gw)
        else:
            validate_core(o)  # Ingress too: a built-in kind
    assert "replicas" not in gw["Deployment"]["spec"]  # the HPA's
    env = env_of(gw["Deployment"])
    assert env["GOOSE_INGEST_REDIS_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "gw-redis", "key": "username"}
    assert env["GOOSE_INGEST_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "gw-redis", "key": "password"}
    assert gw["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"] == ["gateway"]
    paths = gw["Ingress"]["spec"]["rules"][0]["http"]["paths"]
    assert [p["path"] for p in paths] == ["/v1/"]  # /metrics, /healthz, /readyz stay inside
    default = render(helm, kubeconfig)
    assert not [o for o in default if o["metadata"]["labels"].get("app.kubernetes.io/component") == "gateway"]


def test_hpa_rendered_only_without_keda(helm, kubeconfig):
    kinds = validate_all(render(helm, kubeconfig, {"hpa": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}}))
    hpa = kinds["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == kinds["Deployment"]["metadata"]["name"]
    assert hpa["spec"]["maxReplicas"] == 6
    assert "replicas" not in kinds["Deployment"]["spec"]
    assert "ScaledObject" not in kinds


def test_keda_without_password_has_no_trigger_authentication(helm, kubeconfig):
    kinds = validate_all(render(helm, kubeconfig, {"keda": {"enabled": True}}))
    assert "TriggerAuthentication" not in kinds and "HorizontalPodAutoscaler" not in kinds
    triggers = kinds["ScaledObject"]["spec"]["triggers"]
    assert [t["metadata"]["stream"] for t in triggers] == [f"goose.raw.{i}" for i in range(4)]
    assert all("authenticationRef" not in t for t in triggers)


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCont": 3},  # typo at the top level
        {"settings": {"shard": 4}},  # typo inside settings
        {"settings": {"redis_url": "redis://u:p@h:6379/0"}},  # credentials never in the ConfigMap
        {"keda": {"enabled": True, "lagcount": 10}},
        {"image": {"repository": "x", "tagg": "1"}},
        {"resources": {"request": {"cpu": "1"}}},
    ],
)
def test_values_schema_rejects_typos(helm, kubeconfig, values):
    # python-side: the schema itself
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    for k, v in values.items():
        merged[k] = {**merged[k], **v} if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged, SCHEMA)
    # helm-side: helm refuses to render
    with pytest.raises(helm.HelmError) as exc:
        render(helm, kubeconfig, values)
    assert "schema" in str(exc.value).lower() or "additional" in str(exc.value).lower(), str(exc.value)


def test_helm_lint_passes(helm, kubeconfig):
    cfg = helm.Configuration(namespace="ingest", kubeconfig=kubeconfig)
    result = asyncio.run(helm.Lint(cfg).run(str(CHART)))
    # severities: 1 info, 2 warning, 3 error
    assert not result.get("Errors"), result
    assert all(m["Severity"] < 2 for m in result.get("Messages") or []), result


# ------------------------------------------------------------------ tests: static (no helm needed)


def test_default_values_satisfy_the_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), SCHEMA)
    jsonschema.validate(ALL_ON | {"image": {"repository": "r"}, "metrics": {"port": 9464}}, SCHEMA)


# Maps whose keys are free by nature (labels, annotations) and Kubernetes objects passed through
# verbatim (validated after rendering by kubernetes-validate instead).
FREE_FORM = {
    "properties.settings.properties.redaction_extra_rules",  # rule name -> regex, names checked by pattern
    "properties.service.properties.annotations",
    "properties.serviceMonitor.properties.labels",
    "properties.prometheusRule.properties.labels",
    "properties.grafanaDashboard.properties.labels",
    "properties.grafanaDashboard.properties.annotations",
    "properties.serviceAccount.properties.annotations",
    "properties.podAnnotations",
    "properties.gateway.properties.ingress.properties.annotations",
    "properties.gateway.properties.ingress.properties.tls.items",  # Kubernetes IngressTLS objects
    "properties.podLabels",
    "properties.nodeSelector",
    "properties.tolerations.items",
    "properties.topologySpreadConstraints.items",
    "properties.affinity.properties.nodeAffinity",
    "properties.affinity.properties.podAffinity",
    "properties.affinity.properties.podAntiAffinity",
}


def object_schemas(node, path=""):
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            yield path.lstrip("."), node
        for k, v in node.items():
            if k in ("properties",):
                for name, sub in v.items():
                    yield from object_schemas(sub, f"{path}.properties.{name}")
            elif k == "items":
                yield from object_schemas(v, f"{path}.items")


def test_schema_forbids_additional_properties_everywhere():
    seen = set()
    for path, node in object_schemas(SCHEMA):
        seen.add(path)
        if path in FREE_FORM:
            continue
        assert node.get("additionalProperties") is False, f"{path or '<root>'} allows unknown keys"
    assert FREE_FORM <= seen


def test_schema_settings_are_the_non_secret_settings_fields():
    allowed = set(SCHEMA["properties"]["settings"]["properties"])
    assert allowed == set(Settings.model_fields) - SETTINGS_NOT_IN_CONFIGMAP


def test_rules_file_is_a_symlink_to_the_single_source():
    link = CHART / "files" / "rules.yml"
    assert link.is_symlink(), "helm/goose-ingest/files/rules.yml must stay a symlink, not a copy"
    assert os.readlink(link) == "../../../deploy/prometheus/rules.yml"
    assert link.resolve() == RULES.resolve()


def test_optional_alertmanager_config_is_the_shipped_file_with_the_given_webhooks(helm, kubeconfig):
    pager, tickets = "https://pager.example.com/hook", "https://chat.example.com/hook"
    objs = render(helm, kubeconfig, {"alertmanagerConfig": {"enabled": True, "pagerWebhookUrl": pager,
                                                            "ticketsWebhookUrl": tickets}})
    (secret,) = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-alertmanager")]
    validate_core(secret)
    rendered = yaml.safe_load(secret["stringData"]["alertmanager.yaml"])
    shipped = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in rendered["receivers"]}
    assert urls == {"goose-ingest-pager": pager, "goose-ingest-tickets": tickets}
    for r in rendered["receivers"] + shipped["receivers"]:
        r["webhook_configs"][0]["url"] = "-"
    assert rendered == shipped  # routes, grouping and inhibitions exactly as shipped
    link = CHART / "files" / "alertmanager.yml"
    assert link.is_symlink() and os.readlink(link) == "../../../deploy/alertmanager/alertmanager.yml"
    # off by default
    assert not [o for o in render(helm, kubeconfig) if o["kind"] == "Secret"]


# ------------------------------------------------------------------ probes and grace vs the processes
# After SIGTERM a worker lets its in-flight batches finish for FastStream's graceful_timeout, then
# gives its shard leases back and closes its client (one broker round trip each, bounded by the
# socket timeout): the pod's grace must cover that, or the kubelet SIGKILLs a worker mid-commit.
STOP_AFTER_DRAIN_S = 10  # lease release + client close + interpreter exit, with room for a slow broker
HEALTHCHECK_TIMEOUT_S = 3  # the Dockerfile's HEALTHCHECK --timeout; /healthz answers from a thread, at once


def shutdown_budget_s() -> float:
    """The worker's and the OTLP exporter's stop time, from their real FastStream brokers."""
    from services.export.otlp.app import build_app as build_exporter
    from services.export.otlp.config import mapping_config_from_env
    from services.worker.app import build_app

    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    worker, _ = build_app(settings)
    exporter, _ = build_exporter(settings, object(), mapping_config_from_env())  # type: ignore[arg-type]
    graceful = [b.config.graceful_timeout for app in (worker, exporter) for b in app.brokers]
    assert all(g is not None and g > 0 for g in graceful), "an unbounded drain: no grace period can cover it"
    return max(graceful) + STOP_AFTER_DRAIN_S


# The other processes' stop, each after SIGTERM (STOP_AFTER_DRAIN_S on top of each):
# - export postgres: the writer commits the batch in hand, then waits for its reader thread at most
#   30 s (`reader.join(timeout=30)` in services/export/postgres/sink.py);
# - archive: writes what it read (flush_on_stop), one object request bounded by archive_store_timeout_s
#   (more objects on a hung store can exceed it: then the kill leaves their entries pending, and the
#   next start writes the same objects again, services/archive/segments.py);
# - gateway: uvicorn finishes the requests in flight, a body read within gateway_body_timeout_s and
#   its Redis write within the client's socket timeout (5 s, services/gateway/command.py).
POSTGRES_READER_JOIN_S = 30
GATEWAY_REDIS_SOCKET_TIMEOUT_S = 5


def shutdown_budgets_s() -> dict[str, float]:
    """The stop time of each Deployment's process, by the container's first argument(s)."""
    defaults = Settings()
    worker_like = shutdown_budget_s()
    return {"worker": worker_like, "export otlp": worker_like,
            "export postgres": POSTGRES_READER_JOIN_S + STOP_AFTER_DRAIN_S,
            "archive": defaults.archive_store_timeout_s + STOP_AFTER_DRAIN_S,
            "gateway": defaults.gateway_body_timeout_s + GATEWAY_REDIS_SOCKET_TIMEOUT_S + STOP_AFTER_DRAIN_S}


def test_compose_stop_grace_covers_each_process_budget():
    services = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())["services"]
    budgets = shutdown_budgets_s()
    role = {"worker-1": "worker", "worker-2": "worker", "otlp-exporter": "export otlp",
            "postgres-exporter": "export postgres", "gateway": "gateway", "archive": "archive"}
    for name, r in role.items():
        grace = services[name]["stop_grace_period"]
        assert grace.endswith("s") and float(grace[:-1]) >= budgets[r], (name, grace, budgets[r])


def test_every_deployment_of_the_chart_runs_the_one_image(helm, kubeconfig):
    objs = render(helm, kubeconfig, {"otlpExporter": {"enabled": True, "endpoint": "http://c:4318"},
                                      "postgresExporter": {"enabled": True, "existingSecret": "pg"},
                                      "archive": {"enabled": True, "redisSecret": "archive-redis"},
                                      "gateway": {"enabled": True, "redisSecret": "gw-redis"},
                                      "settings": {"archive_url": "s3://fleet-archive/goose"},
                                      "image": {"repository": "registry.example.com/team/goose-ingest", "tag": "0.1.0"}})
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    assert len(deployments) == 5
    images = {c["image"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example.com/team/goose-ingest:0.1.0"}
    for d in deployments:
        assert all("command" not in c for c in d["spec"]["template"]["spec"]["containers"]), d["metadata"]["name"]


def test_termination_grace_and_probes_agree_with_the_processes(helm, kubeconfig):
    budgets = shutdown_budgets_s()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["terminationGracePeriodSeconds"] >= max(budgets.values()), (values["terminationGracePeriodSeconds"], budgets)
    objs = render(helm, kubeconfig, {"otlpExporter": {"enabled": True, "endpoint": "http://c:4318"},
                                      "postgresExporter": {"enabled": True, "existingSecret": "pg"},
                                      "archive": {"enabled": True, "redisSecret": "archive-redis"},
                                      "gateway": {"enabled": True, "redisSecret": "gw-redis"},
                                      "settings": {"archive_url": "s3://fleet-archive/goose"}})
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    by_role = {" ".join(d["spec"]["template"]["spec"]["containers"][0].get("args", ["worker"])[:2]).split(" --")[0]: d
               for d in deployments}
    assert len(deployments) == 5 and set(by_role) == set(budgets), sorted(by_role)
    for role, dep in by_role.items():
        pod = dep["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] >= budgets[role], (role, pod["terminationGracePeriodSeconds"])
        (c,) = pod["containers"]
        # probes on the port the process binds: the named container port is GOOSE_INGEST_METRICS_PORT,
        # and nothing on the command line moves it elsewhere
        # the gateway serves its probes on its own port (GOOSE_INGEST_GATEWAY_PORT), the others on metrics
        name, setting = ("http", "GOOSE_INGEST_GATEWAY_PORT") if role == "gateway" else ("metrics", "GOOSE_INGEST_METRICS_PORT")
        port = {p["name"]: p["containerPort"] for p in c["ports"]}[name]
        assert env_of(dep)[setting]["value"] == str(port)
        assert not any(a.startswith(("--metrics-port", "--port")) for a in c.get("args", []))
        assert "command" not in c, "a command replaces the image's tini entrypoint"
        live, ready = c["livenessProbe"], c["readinessProbe"]
        assert live["httpGet"]["port"] == ready["httpGet"]["port"] == name
        # /healthz is served from the first second whatever the broker does: a worker waiting for its
        # broker is never restarted, so liveness may start early; it fails only for a hung process
        assert live["timeoutSeconds"] >= HEALTHCHECK_TIMEOUT_S
        assert live["initialDelaySeconds"] + live["periodSeconds"] * live["failureThreshold"] >= 30
        # readiness reacts faster than liveness (a broker outage takes a pod out of the Service first)
        assert ready["periodSeconds"] * ready["failureThreshold"] < live["periodSeconds"] * live["failureThreshold"]
