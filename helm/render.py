"""Print the manifest of helm/goose-ingest, as `helm template` would, without a helm binary or a cluster.

    pip install --ignore-requires-python helm-sdkpy pyyaml
    python helm/render.py [-f my-values.yaml ...] [--namespace NS] [--release NAME] > manifest.yaml

PyPI's `helm-sdkpy` bundles helm's own Go library (v4) but has no `template` action, and its install
needs an API server. So this script serves a tiny fake Kubernetes API on 127.0.0.1 (discovery
documents for the kinds the chart uses, 404 for every GET, echo for every create), runs a real
`helm install` against it through a throwaway kubeconfig and prints the manifest helm rendered:
values validated against values.schema.json, templates rendered by helm's engine. Nothing leaves the
machine. tests/deploy/test_helm_chart.py renders through the same code (docs/operations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parent / "goose-ingest"

# (group, version) -> [(resource, kind, namespaced)]: what the fake API server says it serves.
DISCOVERY: dict[tuple[str, str], list[tuple[str, str, bool]]] = {
    ("", "v1"): [
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("namespaces", "Namespace", False),
    ],
    ("apps", "v1"): [("deployments", "Deployment", True)],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    ("networking.k8s.io", "v1"): [("ingresses", "Ingress", True)],
    ("autoscaling", "v2"): [("horizontalpodautoscalers", "HorizontalPodAutoscaler", True)],
    ("monitoring.coreos.com", "v1"): [
        ("servicemonitors", "ServiceMonitor", True),
        ("prometheusrules", "PrometheusRule", True),
    ],
    ("keda.sh", "v1alpha1"): [
        ("scaledobjects", "ScaledObject", True),
        ("triggerauthentications", "TriggerAuthentication", True),
    ],
}


class FakeKube(BaseHTTPRequestHandler):
    """The least of an API server helm's install needs: discovery, no existing object, echo on create."""

    protocol_version = "HTTP/1.1"

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

    def do_GET(self) -> None:  # noqa: N802
        path, _, query = self.path.partition("?")
        discovery = self.server.discovery  # type: ignore[attr-defined]
        if path == "/version":
            return self._json(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "platform": "linux/amd64"})
        if path == "/api":
            return self._json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                    "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                }
                for (g, v) in discovery
                if g
            ]
            return self._json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        m = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if m:
            gv = ("", "v1") if m.group(1) else (m.group(2), m.group(3))
            if gv not in discovery:
                return self._not_found()
            resources = [
                {"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k,
                 "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                for n, k, ns in discovery[gv]
            ]
            return self._json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                    "groupVersion": f"{gv[0]}/{gv[1]}".lstrip("/"), "resources": resources})
        if "labelSelector" in query:  # helm's release history: none
            return self._json(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
        return self._not_found()  # no object exists yet

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            obj = json.loads(body)
        except ValueError:  # helm's release record arrives as protobuf: acknowledge it
            obj = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "release"}}
        obj.setdefault("metadata", {}).update(uid="00000000-0000-0000-0000-000000000000", resourceVersion="1")
        self._json(201, obj)

    do_PUT = do_POST
    do_PATCH = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def fake_cluster(directory: Path, discovery: dict[tuple[str, str], list[tuple[str, str, bool]]] | None = None,
                 namespace: str = "ingest") -> Iterator[str]:
    """A fake API server and the path of a kubeconfig naming it (written in `directory`)."""
    import yaml

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKube)
    server.discovery = DISCOVERY if discovery is None else discovery  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "fake", "user": {"token": "fake"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        "current-context": "fake",
    }))
    # helm writes its cache and config under these: keep them out of $HOME
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        if var not in os.environ:
            (directory / var.lower()).mkdir(exist_ok=True)
            os.environ[var] = str(directory / var.lower())
    try:
        yield str(path)
    finally:
        server.shutdown()
        server.server_close()


def render_manifest(kubeconfig: str, values: dict[str, Any] | None = None, release: str = "gi",
                    namespace: str = "ingest", chart: Path = CHART) -> str:
    """The manifest helm renders for `values` (helm-sdkpy against the fake cluster of `kubeconfig`)."""
    import helm_sdkpy

    cfg = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    result = asyncio.run(helm_sdkpy.Install(cfg).run(release, str(chart), values=values or None, wait=False, timeout=60))
    return str(result["manifest"])


def _merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """helm's rule for several -f files: maps merge key by key, anything else is replaced."""
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="helm/render.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", "--values", action="append", default=[], metavar="FILE",
                        help="a values file (YAML), as helm's -f; several are merged in order")
    parser.add_argument("--release", default="goose-ingest", help="release name (default: goose-ingest)")
    parser.add_argument("--namespace", "-n", default="ingest", help="namespace (default: ingest)")
    args = parser.parse_args(argv)
    try:
        import helm_sdkpy  # noqa: F401
        import yaml
    except ImportError as exc:
        print(f"helm/render.py: {exc.name} is missing: pip install --ignore-requires-python helm-sdkpy pyyaml",
              file=sys.stderr)
        return 2
    values: dict[str, Any] = {}
    for name in args.values:
        try:
            loaded = yaml.safe_load(Path(name).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            print(f"helm/render.py: {name}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(loaded, dict):
            print(f"helm/render.py: {name}: not a map of values", file=sys.stderr)
            return 2
        _merge(values, loaded)
    with tempfile.TemporaryDirectory(prefix="goose-ingest-render-") as tmp, fake_cluster(Path(tmp), None,
                                                                                           args.namespace) as kube:
        try:
            manifest = render_manifest(kube, values, args.release, args.namespace)
        except Exception as exc:  # helm's own refusal (schema, template): its first line
            print(f"helm/render.py: {' '.join(str(exc).split())[:600] or type(exc).__name__}", file=sys.stderr)
            return 1
    sys.stdout.write(manifest if manifest.endswith("\n") else manifest + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
