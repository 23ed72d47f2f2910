"""Static checks of Dockerfile, .dockerignore, requirements.lock and deploy/docker-compose.yml.

There is no Docker daemon on the development machines or in CI, so the image is never built here:
these tests check the properties we rely on instead.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6?-dev|apt-get|apk)\b")


# ------------------------------------------------------------------ Dockerfile parsing


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        instr, _, args = buf.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instr, args in dockerfile_instructions((ROOT / "Dockerfile").read_text()):
        if instr == "FROM":
            result.append([])
        if result:
            result[-1].append((instr, args))
    return result


def args_of(stage, instr: str) -> list[str]:
    return [a for i, a in stage if i == instr]


def test_dockerfile_is_multi_stage_on_python_311_slim():
    st = stages()
    assert len(st) >= 2
    assert [s[0][1].split()[0] for s in st] == ["python:3.11-slim"] * len(st)
    assert st[0][0][1].split()[-1] == "builder"


def test_final_stage_runs_as_non_root_numeric_user():
    final = stages()[-1]
    users = args_of(final, "USER")
    assert users, "final stage has no USER"
    m = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1])
    assert m, f"USER must be numeric uid[:gid], got {users[-1]!r}"
    assert int(m.group(1)) != 0 and (m.group(2) is None or int(m.group(2)) != 0)
    assert users[-1] == "10001:10001"
    # USER comes before ENTRYPOINT/CMD so the process really runs as it
    order = [i for i, _ in final]
    assert order.index("USER") < order.index("ENTRYPOINT")


def test_final_stage_has_healthcheck_entrypoint_and_port():
    final = stages()[-1]
    hc = args_of(final, "HEALTHCHECK")
    assert hc and "NONE" not in hc[-1].upper()
    assert "urllib" in hc[-1] and "127.0.0.1" in hc[-1] and "/healthz" in hc[-1] and "9464" in hc[-1]
    assert args_of(final, "ENTRYPOINT") == ['["goose-ingest"]']
    assert args_of(final, "CMD") == ['["worker"]']
    assert "9464" in args_of(final, "EXPOSE")


def test_final_stage_has_no_build_tools_and_only_copies_the_venv():
    final = stages()[-1]
    assert not args_of(final, "RUN"), "the runtime stage should install nothing"
    for instr, args in final:
        if instr in {"RUN", "COPY", "ADD"}:
            assert not BUILD_TOOLS.search(args), (instr, args)
    copies = args_of(final, "COPY")
    assert copies and all(c.startswith("--from=builder") for c in copies)
    assert any("/opt/venv" in c for c in copies)


def test_builder_installs_locked_deps_then_the_wheel():
    builder = stages()[0]
    runs = " ".join(args_of(builder, "RUN"))
    assert "-r requirements.lock" in runs
    assert "pip wheel" in runs and "--no-deps" in runs and "--no-cache-dir" in runs
    # The builder compiles the core (a C compiler, nothing more) and fails unless it did.
    assert not re.search(r"\bbuild-essential\b", runs)
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in runs
    assert "core_kind()" in runs and "'compiled'" in runs


def test_a_core_compiled_in_the_work_tree_is_not_sent_to_the_image():
    assert ignored("services/normalizer/shell.cpython-311-x86_64-linux-gnu.so")
    assert ignored("goose_ingest_core__mypyc.cpython-311-x86_64-linux-gnu.so")


def dockerignore_patterns() -> list[str]:
    return [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def ignored(path: str) -> bool:
    result = False
    for pat in dockerignore_patterns():
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        candidates = [pat, pat.replace("**/", "")]
        if any(fnmatch.fnmatch(path, c) or path.startswith(c + "/") for c in candidates):
            result = not neg
    return result


def test_copied_sources_exist_and_are_not_dockerignored():
    builder = stages()[0]
    for args in args_of(builder, "COPY"):
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        for src in parts[:-1]:
            if any(ch in src for ch in "*?["):
                continue  # optional glob (README.m[d])
            assert (ROOT / src).exists(), f"COPY source {src} does not exist"
            assert not ignored(src), f"COPY source {src} is excluded by .dockerignore"
    for heavy in (".venv", ".git", "tests", "helm", "deploy"):
        assert ignored(heavy), f"{heavy} should not be sent as build context"


def test_requirements_lock_pins_every_runtime_dependency():
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
        assert m, f"not an exact pin: {line!r}"
        pins[canonicalize_name(m.group(1))] = m.group(2)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} violates {req.specifier}"
    # extras pulled in by the dependencies we declare
    assert "hiredis" in pins
    assert not {"pytest", "hypothesis", "testcontainers", "helm-sdkpy"} & set(pins), "test-only packages in the runtime lock"


# ------------------------------------------------------------------ compose


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_compose_services(compose):
    services = compose["services"]
    assert {"redis", "worker-1", "worker-2", "prometheus", "grafana"} <= set(services)
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_cmd
    assert "--maxmemory-policy noeviction" in redis_cmd
    workers = [s for name, s in services.items() if name.startswith("worker")]
    assert len(workers) == 2
    assert len({w["hostname"] for w in workers}) == 2, "workers need different hostnames"
    for w in workers:
        assert w["environment"]["GOOSE_INGEST_REDIS_URL"] == "redis://redis:6379/0"
        build = w["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (ROOT / "Dockerfile").resolve()
        assert w["depends_on"]["redis"]["condition"] == "service_healthy"


def bind_mounts(compose: dict):
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            src, _, rest = vol.partition(":")
            if src.startswith((".", "/")):
                yield name, src, rest.split(":")[0]


def test_compose_bind_mounts_reference_existing_files(compose):
    mounts = list(bind_mounts(compose))
    assert mounts
    for service, src, _ in mounts:
        assert (DEPLOY / src).exists(), f"{service}: {src} does not exist"
    targets = {(s, t) for s, _, t in mounts}
    assert ("prometheus", "/etc/prometheus/rules.yml") in targets
    assert ("prometheus", "/etc/prometheus/prometheus.yml") in targets


def test_prometheus_scrapes_both_workers_and_loads_the_rules(compose):
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for sc in prom["scrape_configs"] for st in sc["static_configs"] for t in st["targets"]}
    hostnames = {s["hostname"] for n, s in compose["services"].items() if n.startswith("worker")}
    assert targets == {f"{h}:9464" for h in hostnames}
    # rule_files are relative to prometheus.yml; both are mounted into /etc/prometheus/
    mounted = {t for s, _, t in bind_mounts(compose) if s == "prometheus"}
    for rf in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / rf).exists()
        assert f"/etc/prometheus/{rf}" in mounted


def test_grafana_provisioning_loads_the_dashboard(compose):
    mounts = {t: s for svc, s, t in bind_mounts(compose) if svc == "grafana"}
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    prom_ds = [d for d in ds["datasources"] if d["type"] == "prometheus"]
    assert prom_ds and prom_ds[0]["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    dash_targets = [t for t, s in mounts.items() if s.endswith("dashboard.json")]
    assert dash_targets and all(t.startswith(path.rstrip("/") + "/") for t in dash_targets)
    assert "/etc/grafana/provisioning/datasources" in mounts and "/etc/grafana/provisioning/dashboards" in mounts
    # the dashboard's datasource variable defaults to the provisioned datasource
    import json

    dash = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    var = next(v for v in dash["templating"]["list"] if v["name"] == "datasource")
    assert var["current"]["value"] == prom_ds[0]["uid"]
