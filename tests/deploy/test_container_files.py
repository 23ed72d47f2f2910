"""Static checks of Dockerfile, .dockerignore, the locks and deploy/docker-compose.yml.

The image itself is built and run by tests/deploy/test_image.py (buildah/podman, deploy/image/build.sh);
these checks hold for the Dockerfile everyone else builds with `docker build`.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
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
    # the check reads the port the process bound (its port file), not only GOOSE_INGEST_METRICS_PORT
    assert hc[-1].endswith('CMD ["python", "-m", "services.metrics.healthcheck"]')
    env = " ".join(args_of(final, "ENV"))
    assert "GOOSE_INGEST_METRICS_PORT_FILE=/tmp/" in env and "GOOSE_INGEST_METRICS_PORT=9464" in env
    # tini is PID 1 (signals keep their default actions, zombies are reaped), copied as its static build
    assert args_of(final, "ENTRYPOINT") == ['["tini", "-e", "143", "--", "goose-ingest"]']
    assert "--from=builder /usr/bin/tini-static /usr/local/bin/tini" in args_of(final, "COPY")
    assert args_of(final, "CMD") == ['["worker"]']
    assert args_of(final, "EXPOSE") == ["9464 8080"]  # metrics and probes; the gateway's port


def test_final_stage_has_no_build_tools_and_only_copies_the_venv():
    final = stages()[-1]
    assert not args_of(final, "RUN"), "the runtime stage should install nothing"
    for instr, args in final:
        if instr in {"RUN", "COPY", "ADD"}:
            assert not BUILD_TOOLS.search(args), (instr, args)
    copies = args_of(final, "COPY")
    assert copies and all(c.startswith("--from=builder") for c in copies)
    assert any("/opt/venv" in c for c in copies)


def test_final_stage_carries_the_oci_labels():
    labels = " ".join(args_of(stages()[-1], "LABEL"))
    for key, arg in (("source", "SOURCE"), ("revision", "REVISION"), ("version", "VERSION")):
        assert f'org.opencontainers.image.{key}="${{{arg}}}"' in labels
        assert any(a.startswith(f"{arg}=") for a in args_of(stages()[-1], "ARG"))


def test_builder_installs_locked_deps_then_the_wheel():
    builder = stages()[0]
    runs = " ".join(args_of(builder, "RUN"))
    # exactly the lock (no resolution: --no-deps, then `pip check` proves the closure complete)
    assert "pip install --no-cache-dir --only-binary=:all: --no-deps -r requirements.lock" in runs
    assert "pip check" in runs
    # the build requirements pinned too, in a venv that is not shipped, and no isolated build resolving its own
    assert "/opt/build/bin/pip install --no-cache-dir --only-binary=:all: --no-deps -r requirements-build.lock" in runs
    assert "/opt/build/bin/pip wheel" in runs and "--no-build-isolation" in runs
    assert not any("/opt/build" in c for c in args_of(stages()[-1], "COPY"))
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


def read_lock(name: str) -> dict[str, tuple[str, Marker | None]]:
    """name -> (version, marker) of a lock: exact pins only, an environment marker allowed."""
    pins: dict[str, tuple[str, Marker | None]] = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==" and not req.extras, f"{name}: not an exact pin: {line!r}"
        pins[canonicalize_name(req.name)] = (spec[0].version, req.marker)
    return pins


# the interpreters the image runs: python:3.11-slim (a recent 3.11) and Debian 12's 3.11.2 (the local base)
IMAGE_PYTHONS = ("3.11.2", "3.11.14")


def marker_env(full: str) -> dict[str, str]:
    return {"python_version": "3.11", "python_full_version": full, "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "platform_machine": "x86_64", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


def closure_problems(lock: dict[str, tuple[str, Marker | None]], roots: list[str]) -> list[str]:
    """What the lock lacks or contradicts: roots (pyproject requirements) and, through the metadata of
    every pinned package installed here at its pinned version, their dependencies, for each image Python."""
    problems: list[str] = []
    for full in IMAGE_PYTHONS:
        env = marker_env(full)
        todo = [(Requirement(r), "pyproject.toml") for r in roots]
        seen: set[tuple[str, frozenset[str]]] = set()
        while todo:
            req, why = todo.pop()
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = canonicalize_name(req.name)
            if name not in lock or (lock[name][1] is not None and not lock[name][1].evaluate(env)):
                problems.append(f"{req} (needed by {why}, Python {full}) is not pinned")
                continue
            version = lock[name][0]
            if not req.specifier.contains(version, prereleases=True):
                problems.append(f"{name}=={version} violates {req} (needed by {why})")
            key = (name, frozenset(req.extras))
            if key in seen:
                continue
            seen.add(key)
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue  # not installed here: the image build's `pip check` covers it
            if canonicalize_name(dist.metadata["Name"]) != name or dist.version != version:
                continue  # another version here; its dependencies may differ: `pip check` in the build covers it
            for dep in dist.requires or []:
                d = Requirement(dep)
                if d.marker is not None:
                    active = any(d.marker.evaluate({**env, "extra": e}) for e in (req.extras or {""}))
                    if not active:
                        continue
                    d.marker = None
                todo.append((d, f"{name}=={version}"))
    return sorted(set(problems))


def test_requirements_lock_is_the_closure_of_pyproject_dependencies():
    lock = read_lock("requirements.lock")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert closure_problems(lock, project["dependencies"]) == []
    assert "hiredis" in lock  # extras pulled in by the dependencies we declare
    assert not {"pytest", "hypothesis", "testcontainers", "helm-sdkpy", "mypy", "setuptools"} & set(lock), \
        "test or build packages in the runtime lock"


def test_a_stale_lock_is_caught():
    lock = read_lock("requirements.lock")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    missing_dep = {k: v for k, v in lock.items() if k != "typing-inspection"}  # pydantic needs it
    assert any("typing-inspection" in p for p in closure_problems(missing_dep, project["dependencies"]))
    too_old = {**lock, "pydantic": ("2.0", None)}
    assert any("pydantic==2.0 violates" in p for p in closure_problems(too_old, project["dependencies"]))
    assert any("newpkg" in p for p in closure_problems(lock, [*project["dependencies"], "newpkg>=1"]))


def test_build_lock_pins_the_build_requirements_at_the_runtime_versions():
    build = read_lock("requirements-build.lock")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert closure_problems(build, requires) == []
    runtime = read_lock("requirements.lock")
    shared = set(build) & set(runtime)
    assert {"pydantic", "orjson"} <= shared
    assert {n: build[n][0] for n in shared} == {n: runtime[n][0] for n in shared}, "build and runtime disagree"


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


GOOSE_SERVICES = {"worker-1", "worker-2", "otlp-exporter", "postgres-exporter", "gateway", "archive"}


def test_every_goose_service_of_compose_runs_the_one_image(compose):
    """One image, every command: each goose-ingest service builds the root Dockerfile into the same
    tag and picks its command by arguments only (no entrypoint of its own replacing tini)."""
    goose = {name: svc for name, svc in compose["services"].items()
             if "build" in svc or str(svc.get("image", "")).startswith("goose-ingest")}
    assert set(goose) == GOOSE_SERVICES
    assert {svc["image"] for svc in goose.values()} == {"goose-ingest:local"}
    for name, svc in goose.items():
        build = svc["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (ROOT / "Dockerfile").resolve(), name
        assert "entrypoint" not in svc, name


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


def _scrape_targets(job: dict) -> set[str]:
    static = {t for st in job.get("static_configs", []) for t in st["targets"]}
    by_name = {f"{n}:{sd['port']}" for sd in job.get("dns_sd_configs", []) for n in sd["names"]}
    return static | by_name


# the compose command of each component -> the suffix of its job (the chart's Service names), which
# rules.yml uses to tell the workers' job from the others' (GooseIngestNoWorkers, ComponentDown)
COMPONENT_JOBS = {("export", "otlp"): "otlp", ("export", "postgres"): "postgres", ("gateway",): "gateway",
                  ("archive",): "archive"}


def test_prometheus_scrapes_every_goose_service_under_its_job_and_loads_the_rules(compose):
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {sc["job_name"]: sc for sc in prom["scrape_configs"]}
    workers, *others = prom["scrape_configs"]
    assert workers["job_name"] == "goose-ingest"  # first: the live Prometheus test scrapes its workers
    hostnames = {s["hostname"] for n, s in compose["services"].items() if n.startswith("worker")}
    assert _scrape_targets(workers) == {f"{h}:9464" for h in hostnames}
    scraped = {}
    for name, svc in compose["services"].items():
        component = COMPONENT_JOBS.get(tuple(svc.get("command", [])))
        if component is None:
            continue
        env = svc.get("environment", {})
        port = env.get("GOOSE_INGEST_GATEWAY_PORT") if component == "gateway" else env.get("GOOSE_INGEST_METRICS_PORT")
        job = jobs[f"goose-ingest-{component}"]
        assert _scrape_targets(job) == {f"{svc['hostname']}:{port}"}, name
        # a service of an opt-in profile is found by name: not started, no target (never a down one)
        assert ("dns_sd_configs" in job) == bool(svc.get("profiles")), name
        scraped[component] = name
    assert set(scraped) == set(COMPONENT_JOBS.values())
    assert len(others) == len(scraped)
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
