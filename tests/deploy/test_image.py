"""The container: signals and probes of the real processes, then the built image itself.

Part 1 runs everywhere (real `goose-ingest` processes, no image): /healthz answers within 2 s while
the broker is unreachable, /readyz says why it is not ready, the HEALTHCHECK module finds the port
the process bound, SIGTERM/SIGINT end the process with exit 0 while it waits and while it consumes.

Part 2 builds the image with deploy/image/build.sh (buildah/podman, cached layers) and runs it
--read-only with a tmpfs /tmp, as its non-root user, against a Redis on the host (--network=host).
Without the tools it skips saying what to install, and FAILS under CI (tests/support/needs.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support import postgres as pg_support
from tests.support.fixtures import FIXTURES
from tests.support.needs import missing
from tests.support.otlp_receiver import RunningReceiver
from tests.support.pipeline import ended_runs, events_by_run, expected_events, start_worker, wait_until
from tests.support.pipeline import stop as stop_worker
from tests.support.redis_server import cli_env

# The PostgreSQL fixtures (tests/support/postgres.py), made visible to this module.
pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "redis://127.0.0.1:1/0"  # port 1: refused at once
FIXTURE = FIXTURES / "a-read-edit-test-finish.jsonl"
STOP_TIMEOUT_S = 20  # a requested stop with nothing in flight; the chart allows 60


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start(args: list[str], env: dict[str, str], port_file: Path) -> subprocess.Popen[bytes]:
    full = {**os.environ, "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file), "GOOSE_INGEST_METRICS_HOST": "127.0.0.1",
            **env}
    return subprocess.Popen([sys.executable, "-m", "services.cli", *args, "--metrics-port", "0"], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_port(proc: subprocess.Popen[bytes], port_file: Path, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        if port_file.exists():
            host, port = port_file.read_text().split()
            try:
                status, _ = get(int(port), "/healthz")
            except OSError:  # the gateway hands its port from the early server to uvicorn: a reset, once
                continue
            if status == 200:
                return int(port)
        time.sleep(0.05)
    raise AssertionError(f"/healthz not served within {within_s}s")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, time.monotonic() - t0, err.decode()


# How soon a command serves /healthz: its imports, about 1 s on an idle machine. What the tests hold is
# that it answers while the broker does not (the silent broker never answers: the check would hang
# for ever), not an import time: on four xdist workers at the run's busiest minute the archive's and
# the gateway's imports took over 5 s.
STARTUP_S = 15.0


COMMANDS = [pytest.param(["worker"], {}, id="worker"),
            pytest.param(["export", "otlp"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, id="export-otlp")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize(("args", "env"), COMMANDS)
def test_probes_while_the_broker_is_unreachable_and_a_stop_exits_0(tmp_path, args, env, sig):
    port_file = tmp_path / "port"
    t0 = time.monotonic()
    proc = start(args, {"GOOSE_INGEST_REDIS_URL": UNREACHABLE, **env}, port_file)
    try:
        port = wait_port(proc, port_file, within_s=STARTUP_S)
        # import time dominates; on an idle machine it is ~1 s
        assert time.monotonic() - t0 < STARTUP_S
        time.sleep(0.5)  # at least one failed attempt: the reason names it
        status, body = get(port, "/readyz")
        assert status == 503 and "waiting for the broker redis://127.0.0.1:1/0" in body and "ConnectionError" in body
        # the image's HEALTHCHECK, as the container runs it: finds the bound port through the file
        check = subprocess.run([sys.executable, "-m", "services.metrics.healthcheck"], cwd=ROOT, timeout=30,
                               env={**os.environ, "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file),
                                    "GOOSE_INGEST_METRICS_PORT": "1"}, capture_output=True)
        assert check.returncode == 0, check.stderr
    finally:
        code, took, err = stop(proc, sig)
    assert code == 0, err
    assert took < 5.0, took
    assert "Traceback" not in err
    assert not port_file.exists(), "the port file outlives its server"
    # a dead process fails the check
    check = subprocess.run([sys.executable, "-m", "services.metrics.healthcheck"], cwd=ROOT, timeout=30,
                           env={**os.environ, "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file),
                                "GOOSE_INGEST_METRICS_PORT": str(port)}, capture_output=True)
    assert check.returncode == 1


@contextlib.contextmanager
def silent_broker():
    """A TCP port that completes the handshake and never answers: a hung broker, which a client
    waits on until its timeout (unlike port 1, refused at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


def start_plain(args: list[str], env: dict[str, str], port_file: Path) -> subprocess.Popen[bytes]:
    """`goose-ingest ARGS` with the port file and the settings as the image sets them (no --metrics-port)."""
    full = {**os.environ, "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file), "GOOSE_INGEST_METRICS_HOST": "127.0.0.1",
            "GOOSE_INGEST_METRICS_PORT": "0", "GOOSE_INGEST_GATEWAY_HOST": "127.0.0.1", "GOOSE_INGEST_GATEWAY_PORT": "0",
            **env}
    return subprocess.Popen([sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


EARLY = [pytest.param(["archive"], id="archive"), pytest.param(["gateway"], id="gateway")]


@pytest.mark.parametrize("args", EARLY)
def test_healthz_answers_from_the_first_second_while_the_broker_hangs(tmp_path, args):
    """The archive and the gateway check the broker at start (groups, shard count); against a broker
    that never answers that takes the client's timeout, and /healthz must answer all along."""
    port_file = tmp_path / "port"
    with silent_broker() as url:
        t0 = time.monotonic()
        proc = start_plain(args, {"GOOSE_INGEST_REDIS_URL": url,
                                  "GOOSE_INGEST_ARCHIVE_URL": f"file://{tmp_path}/archive"}, port_file)
        try:
            port = wait_port(proc, port_file, within_s=STARTUP_S)
            assert time.monotonic() - t0 < STARTUP_S
            status, body = get(port, "/readyz")
            assert status == 503 and "checking the broker" in body, (status, body)
            if args == ["gateway"]:
                # a tap posting to the gateway's port meanwhile is told to retry, as while Redis is away
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/raw", data=b"{}\n", method="POST")
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(req, timeout=5)
                assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        finally:
            proc.kill()
            proc.communicate(timeout=STOP_TIMEOUT_S)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("args", EARLY)
def test_archive_and_gateway_serve_healthz_while_the_broker_is_unreachable_and_stop_with_0(tmp_path, args, sig):
    port_file = tmp_path / "port"
    proc = start_plain(args, {"GOOSE_INGEST_REDIS_URL": UNREACHABLE,
                              "GOOSE_INGEST_ARCHIVE_URL": f"file://{tmp_path}/archive"}, port_file)
    try:
        port = wait_port(proc, port_file, within_s=STARTUP_S)
        time.sleep(1.0)  # past the start-up checks: the server answering now is the command's own
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/readyz")[0] == 503
    finally:
        code, took, err = stop(proc, sig)
    assert code == 0, err
    assert took < 10.0
    assert "Traceback" not in err


def test_export_postgres_says_why_it_is_not_ready_and_stops_with_0(tmp_path, settings):
    # the database refuses (port 1); the broker is fine: /readyz names the database without its password
    port_file = tmp_path / "port"
    dsn = "postgresql://sink:hunter2secret@127.0.0.1:1/analytics"
    proc = start(["export", "postgres"], {"GOOSE_INGEST_REDIS_URL": settings.redis_url,
                                          "GOOSE_INGEST_NAMESPACE": settings.namespace,
                                          "GOOSE_INGEST_POSTGRES_DSN": dsn}, port_file)
    try:
        port = wait_port(proc, port_file, within_s=10.0)
        body = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and "failed" in r[1] and r[1], timeout=20)
        assert "database 127.0.0.1:1/analytics failed: OperationalError" in body
        assert "hunter2secret" not in body
    finally:
        code, took, err = stop(proc)
    assert code == 0, err
    assert took < STOP_TIMEOUT_S
    assert "hunter2secret" not in err and "Traceback" not in err


def test_worker_consuming_becomes_ready_keeps_its_port_and_stops_with_0(tmp_path, settings):
    port_file = tmp_path / "port"
    proc = start(["worker"], {"GOOSE_INGEST_REDIS_URL": settings.redis_url, "GOOSE_INGEST_NAMESPACE": settings.namespace,
                              "GOOSE_INGEST_SHARDS": str(settings.shards)}, port_file)
    try:
        port = wait_port(proc, port_file, within_s=10.0)
        deadline = time.monotonic() + 20
        while get(port, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, get(port, "/readyz")
            time.sleep(0.1)
        # the early server was adopted: same port, now with the worker's metrics
        assert port_file.read_text().split()[1] == str(port)
        assert "goose_ingest_" in get(port, "/metrics")[1]
    finally:
        code, took, err = stop(proc)
    assert code == 0, err
    assert took < STOP_TIMEOUT_S


# ---------------------------------------------------------------------------------- the image
IMAGE = os.environ.get("GOOSE_INGEST_IMAGE", "localhost/goose-ingest:ci")
TOOLS = ("buildah", "podman", "runc", "mmdebstrap")
HOW = "apt-get install buildah podman runc mmdebstrap (Debian 12), as root; deploy/image/build.sh"


@pytest.fixture(scope="module")
def image() -> str:
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        missing(f"building the image needs {', '.join(absent)}", HOW)
    if os.geteuid() != 0:
        missing("building the image (podman storage, chroot isolation) needs root", HOW)
    t0 = time.monotonic()
    out = subprocess.run([str(ROOT / "deploy" / "image" / "build.sh")], cwd=ROOT, capture_output=True, text=True,
                         timeout=1800, env={**os.environ, "IMAGE": IMAGE})
    assert out.returncode == 0, out.stderr[-4000:]
    print(f"image build: {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return IMAGE


def podman_env() -> dict[str, str]:
    conf = os.environ.get("CONTAINERS_CONF") or "/var/tmp/goose-ingest-image/containers.conf"
    return {**os.environ, "CONTAINERS_CONF": conf}


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env())


def run_args(name: str, env: dict[str, str]) -> list[str]:
    out = ["run", "--rm", "--name", name, "--read-only", "--tmpfs", "/tmp", "--network=host", "--stop-timeout", "30"]
    for k, v in env.items():
        out += ["-e", f"{k}={v}"]
    return out


def test_image_metadata(image):
    info = json.loads(podman("image", "inspect", image).stdout)[0]
    labels = info["Config"]["Labels"] if "Config" in info else info["Labels"]
    import tomllib

    # what build.sh passes: the build context's commit and pyproject's version
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert labels["org.opencontainers.image.revision"] == head.stdout.strip()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels.get("org.opencontainers.image.source")
    assert info["Config"]["User"] == "10001:10001"
    assert info["Config"]["Entrypoint"] == ["tini", "-e", "143", "--", "goose-ingest"]
    out = podman("run", "--rm", "--read-only", "--tmpfs", "/tmp", image, "--version")
    assert out.returncode == 0 and "core: compiled" in out.stdout, out
    who = podman("run", "--rm", "--entrypoint", "id", image, "-u")
    assert who.stdout.strip() == "10001"


# What the image adds to its base (the venv and tini): measured 162 MB after deploy/image/slim-venv.sh
# (292 MB before it); docs/operations.md, "What the image is made of". The base is Debian's Python here
# (225 MB) and python:3.11-slim (~125 MB) elsewhere, so the limit is on what the Dockerfile adds.
ADDED_LIMIT_MB = 175
BASE = os.environ.get("BASE", "localhost/python-base:3.11-bookworm")


def test_image_adds_at_most_its_stated_size_to_the_base(image):
    def size(name: str) -> int:
        out = podman("image", "inspect", name, "--format", "{{.Size}}")
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    added = (size(image) - size(BASE)) / 1e6
    assert added <= ADDED_LIMIT_MB, f"the image adds {added:.0f} MB to its base (limit {ADDED_LIMIT_MB} MB)"


# Run inside the image: every module of the archive imports from the slimmed venv, a raw segment
# is written whole and row group by row group, stored through obstore on /tmp, listed, read back
# byte-exact; an S3 store can be made (no request); the gateway's zstd bodies decode.
ARCHIVE_CHECK = """
import importlib, pkgutil
import zstandard
import services.archive as archive
from obstore.store import LocalStore, S3Store
from services.archive import segments as sg
from services.archive.store import ArchiveStore, parse_store_url
from services.gateway.body import decompress
mods = [m.name for m in pkgutil.iter_modules(archive.__path__, "services.archive.")]
for name in mods:
    importlib.import_module(name)
entries = [sg.ArchivedEntry(shard=3, stream="raw", id=f"1790000000000-{i}",
                            fields={b"run": b"image/p", b"seq": str(i).encode(), b"ts": b"1790000000000",
                                    b"line": b'{"x":1}'}) for i in range(50)]
data = sg.encode_raw_segment(entries)
w = sg.RawSegmentWriter()
w.add(entries[:20])
w.add(entries[20:])
assert sg.decode_raw_segment(w.finish()) == entries
store = ArchiveStore(parse_store_url("file:///tmp/archive-check"), LocalStore("/tmp/archive-check", mkdir=True))
key = sg.raw_segment_key("raw", 3, entries[0].id, entries[-1].id)
store.put(key, data)
assert store.list("raw/") == [key]
assert sg.decode_raw_segment(store.get(key)) == entries
S3Store("bucket", config={"region": "eu-west-1", "endpoint": "http://127.0.0.1:1"}, client_options={"allow_http": True})
assert decompress(zstandard.ZstdCompressor().compress(b"x" * 1000), "zstd", 10_000) == b"x" * 1000
print(len(mods), zstandard.backend)
"""


def test_image_loads_every_archive_module_and_round_trips_a_parquet_segment(image):
    out = podman("run", "--rm", "--read-only", "--tmpfs", "/tmp", "--entrypoint", "python", image, "-c", ARCHIVE_CHECK)
    assert out.returncode == 0, out.stderr[-3000:]
    modules, backend = out.stdout.split()
    assert int(modules) >= 10 and backend == "cext"


@pytest.mark.parametrize("args", [["tail", "--help"], ["replay", "--help"], ["import-sessions", "--help"],
                                  ["acl", "--help"], ["export", "postgres", "--help"], ["gateway", "--help"],
                                  ["tokens", "--help"], ["runs", "--help"], ["archive", "--help"]], ids=lambda a: a[0])
def test_every_command_runs_from_the_image(image, args):
    out = podman("run", "--rm", "--read-only", "--tmpfs", "/tmp", image, *args)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()


class Container:
    """`podman run` of the image in the background (read-only, tmpfs /tmp, host network, a fresh name),
    killed at exit if still running; ``terminate`` is the SIGTERM every test ends with."""

    def __init__(self, image: str, args: list[str], env: dict[str, str]):
        self.name = f"gi-{uuid.uuid4().hex[:8]}"
        self.proc = subprocess.Popen(["podman", *run_args(self.name, env), image, *args], env=podman_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            podman("kill", self.name)
            self.proc.kill()

    def healthy(self, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if podman("healthcheck", "run", self.name).returncode == 0:
                return
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: HEALTHCHECK not passing within {within_s}s")

    def port(self, within_s: float) -> int:
        """The port the process in the container bound (port 0), from its port file."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            out = podman("exec", self.name, "cat", "/tmp/goose-ingest-metrics.port")
            if out.returncode == 0 and out.stdout.split():
                return int(out.stdout.split()[1])
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: no port file within {within_s}s")

    def process(self, within_s: float) -> int:
        """The host pid of goose-ingest in the container: the child of tini, the container's pid 1."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            out = podman("inspect", "--format", "{{.State.Pid}}", self.name)
            if out.returncode == 0 and out.stdout.strip() not in ("", "0"):
                init = out.stdout.strip()
                children = Path(f"/proc/{init}/task/{init}/children")
                with contextlib.suppress(OSError):
                    pids = children.read_text().split()
                    if pids:
                        return int(pids[0])
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: no goose-ingest process within {within_s}s")

    def ready(self, within_s: float) -> int:
        port = self.port(within_s)
        wait_until(lambda: get(port, "/readyz")[0] == 200, timeout=within_s)
        return port

    def terminate(self) -> str:
        """SIGTERM; the process must exit 0 within STOP_TIMEOUT_S. Its stderr."""
        assert podman("kill", "--signal", "TERM", self.name).returncode == 0
        _, err = self.proc.communicate(timeout=STOP_TIMEOUT_S)
        assert self.proc.returncode == 0, err.decode()[-2000:]
        return err.decode()


def golden_events() -> list[dict]:
    return [json.loads(x) for x in (ROOT / "tests" / "golden" / f"{FIXTURE.stem}.events.jsonl").read_text().splitlines()]


def on_host(settings) -> dict[str, str]:
    """The container's environment for the test's Redis on the host (port 0 for its server)."""
    return {"GOOSE_INGEST_REDIS_URL": settings.redis_url, "GOOSE_INGEST_NAMESPACE": settings.namespace,
            "GOOSE_INGEST_SHARDS": str(settings.shards), "GOOSE_INGEST_METRICS_PORT": "0"}


IMAGE_COMMANDS = [*COMMANDS,
                  pytest.param(["export", "postgres"], {"GOOSE_INGEST_POSTGRES_DSN": "postgresql://sink@127.0.0.1:1/analytics"},
                               id="export-postgres"),
                  pytest.param(["gateway"], {"GOOSE_INGEST_GATEWAY_PORT": "0", "GOOSE_INGEST_GATEWAY_HOST": "127.0.0.1"},
                               id="gateway"),
                  pytest.param(["archive"], {"GOOSE_INGEST_ARCHIVE_URL": "file:///tmp/archive"}, id="archive")]


@pytest.mark.parametrize(("args", "env"), IMAGE_COMMANDS)
def test_image_stops_with_0_while_the_broker_is_unreachable(image, args, env):
    with Container(image, args, {"GOOSE_INGEST_REDIS_URL": UNREACHABLE, "GOOSE_INGEST_METRICS_PORT": "0", **env}) as c:
        c.healthy(within_s=30)  # port 0: only the port file can say where to look
        t0 = time.monotonic()
        c.terminate()
        assert time.monotonic() - t0 < 10


def documented_podman_command() -> list[str]:
    """The podman line of docs/operations.md's "Check it", as a user would paste it."""
    text = (ROOT / "docs" / "operations.md").read_text()
    check = text[text.index("**Check it.**"):]
    line = next(line for line in check.splitlines() if line.startswith("podman run "))
    return shlex.split(line)


def test_the_documented_podman_command_runs_the_image(image, settings, tmp_path):
    """Word for word but for the Redis URL (the test's), the metrics port (0: a test must not take
    9464) and a name, with podman's own defaults (no CONTAINERS_CONF, so no `default_ulimits`): the
    command's `--ulimit`s are what let it start (without them rootful podman asks for limits above
    this machine's hard ones: exit 126)."""
    args = documented_podman_command()
    assert args[:2] == ["podman", "run"] and "--ulimit" in args and "--network=host" in args, args
    assert args[-1] == "localhost/goose-ingest:ci", args
    name = f"gi-doc-{uuid.uuid4().hex[:8]}"
    args = [f"GOOSE_INGEST_REDIS_URL={settings.redis_url}" if a.startswith("GOOSE_INGEST_REDIS_URL=") else a
            for a in args[:-1]] + [image]
    args[2:2] = ["--name", name, "-e", "GOOSE_INGEST_METRICS_PORT=0", "-e", f"GOOSE_INGEST_NAMESPACE={settings.namespace}",
                 "-e", f"GOOSE_INGEST_SHARDS={settings.shards}"]
    env = {k: v for k, v in os.environ.items() if k != "CONTAINERS_CONF"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            out = subprocess.run(["podman", "exec", name, "cat", "/tmp/goose-ingest-metrics.port"], env=env,
                                 capture_output=True, text=True, timeout=60)
            port = int(out.stdout.split()[1]) if out.returncode == 0 and out.stdout.split() else None
            time.sleep(0.3)
        assert port is not None, "no port file within 60 s"
        assert get(port, "/healthz")[0] == 200
        wait_until(lambda: get(port, "/readyz")[0] == 200, timeout=60)  # it reached the Redis on the host
        assert subprocess.run(["podman", "kill", "--signal", "TERM", name], env=env, capture_output=True,
                              timeout=60).returncode == 0
        _, err = proc.communicate(timeout=STOP_TIMEOUT_S)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        if proc.poll() is None:
            subprocess.run(["podman", "kill", name], env=env, capture_output=True, timeout=60)
            proc.kill()


def test_image_worker_stops_with_0_on_one_sigint(image):
    """SIGINT (Ctrl-C of `docker run -it`), sent once, stops the worker with 0 as SIGTERM does."""
    with Container(image, ["worker"], {"GOOSE_INGEST_REDIS_URL": UNREACHABLE, "GOOSE_INGEST_METRICS_PORT": "0"}) as c:
        c.healthy(within_s=30)
        assert podman("kill", "--signal", "INT", c.name).returncode == 0
        _, err = c.proc.communicate(timeout=STOP_TIMEOUT_S)
        assert c.proc.returncode == 0, err.decode()[-2000:]


# Run inside the archive's container: the raw entries of one run in the segments under /tmp/archive.
READ_ARCHIVE = """
import sys
from obstore.store import LocalStore
from services.archive import segments as sg
from services.archive.store import ArchiveStore, parse_store_url
store = ArchiveStore(parse_store_url("file:///tmp/archive"), LocalStore("/tmp/archive"))
run = sys.argv[1].encode()
print(sum(e.fields.get(b"run") == run for k in store.list("raw/") for e in sg.decode_raw_segment(store.get(k))))
"""


def test_image_archive_writes_a_published_run_readable_and_stops_with_0(image, settings):
    """`archive` from the image (file:///tmp/archive on the tmpfs, non-root, read-only root) becomes
    ready against the host's Redis, writes the raw entries of a run published from the host into
    Parquet segments that decode back to every entry, and stops with 0 on SIGTERM."""
    run = "image-archive/1"
    env = {**on_host(settings), "GOOSE_INGEST_ARCHIVE_URL": "file:///tmp/archive",
           "GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S": "1"}
    with Container(image, ["archive"], env) as c:
        c.healthy(within_s=60)
        c.ready(within_s=60)
        subprocess.run([sys.executable, "-m", "services.cli", "publish", "--run", run, str(FIXTURE)], cwd=ROOT,
                       env=cli_env(settings), check=True, capture_output=True, timeout=60)
        entries = len(FIXTURE.read_text().splitlines()) + 1  # the lines and the end of the run

        def archived() -> int:
            out = podman("exec", c.name, "python", "-c", READ_ARCHIVE, run)
            return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else -1

        wait_until(lambda: archived() == entries, timeout=90, interval=1.0)
        assert "Traceback" not in c.terminate()


def test_image_stops_with_0_on_a_sigterm_during_start_up(image):
    """SIGTERM as soon as the container runs, before Python has installed a handler: still exit 0."""
    with Container(image, ["worker"], {"GOOSE_INGEST_REDIS_URL": UNREACHABLE}) as c:
        wait_until(lambda: podman("kill", "--signal", "TERM", c.name).returncode == 0, timeout=30, interval=0.02)
        _, err = c.proc.communicate(timeout=STOP_TIMEOUT_S)
        assert c.proc.returncode == 0, err.decode()[-2000:]


def test_image_worker_consumes_and_stops_with_0(image, settings):
    with Container(image, ["worker"], on_host(settings)) as c:
        c.healthy(within_s=60)
        c.ready(within_s=30)
        # a fixture published from the host becomes events through the worker in the container
        subprocess.run([sys.executable, "-m", "services.cli", "publish", "--run", "image/1", str(FIXTURE)], cwd=ROOT,
                       env=cli_env(settings), check=True, capture_output=True, timeout=60)
        golden = golden_events()
        events = wait_until(lambda: (e := events_by_run(settings).get("image/1")) and len(e) >= len(golden) and e,
                            timeout=60)
        # the container's compiled core gives the contract's events: same types at the same seqs, in order, once each
        assert [e["type"] for e in events] == [g["type"] for g in golden]
        assert [e["seq"] for e in events] == [g["seq"] for g in golden]
        c.terminate()


def test_image_worker_and_both_exporters_deliver_a_run_and_stop_with_0(image, settings, pg_dsn):
    """The one image runs the worker and both exporters (read-only, non-root, port 0) against the host's
    Redis, PostgreSQL and an OTLP receiver: a published fixture reaches both targets, every container
    becomes ready, and each stops with 0 on SIGTERM."""
    import psycopg

    run = "image/exporters"
    golden = golden_events()
    with RunningReceiver() as rx, contextlib.ExitStack() as stack:
        containers = [stack.enter_context(Container(image, args, {**on_host(settings), **env})) for args, env in (
            (["worker"], {}),
            (["export", "otlp"], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.endpoint}),
            (["export", "postgres"], {"GOOSE_INGEST_POSTGRES_DSN": pg_dsn}))]
        for c in containers:
            c.healthy(within_s=60)
            c.ready(within_s=60)
        subprocess.run([sys.executable, "-m", "services.cli", "publish", "--run", run, str(FIXTURE)], cwd=ROOT,
                       env=cli_env(settings), check=True, capture_output=True, timeout=60)
        # OTLP: the run's root span arrives once, after its events
        roots = wait_until(lambda: [s for s in list(rx.spans) if s.name.startswith("invoke_agent")
                                    and s.attributes.get("gen_ai.conversation.id") == run], timeout=90)

        # PostgreSQL: every event of the run, once, and its run record ended
        def stored() -> bool:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                n = conn.execute("SELECT count(*), count(DISTINCT event_id) FROM events WHERE run_key = %s",
                                 (run,)).fetchone()
                state = conn.execute("SELECT state FROM runs WHERE run_key = %s", (run,)).fetchone()
            return n == (len(golden), len(golden)) and state is not None and state[0] == "ended"

        wait_until(stored, timeout=90)
        assert len(roots) == 1
        for c in containers:
            c.terminate()


def test_image_worker_stops_with_0_while_waiting_for_a_lease(image, settings, tmp_path):
    """One shard, held by a worker on the host: the worker in the container waits for a lease and
    stops with 0 on SIGTERM in that state."""
    one = {"GOOSE_INGEST_REDIS_URL": settings.redis_url, "GOOSE_INGEST_NAMESPACE": settings.namespace,
           "GOOSE_INGEST_SHARDS": "1"}
    host = start(["worker"], one, tmp_path / "host-port")
    try:
        host_port = wait_port(host, tmp_path / "host-port", within_s=10.0)
        wait_until(lambda: get(host_port, "/readyz")[0] == 200, timeout=30)
        with Container(image, ["worker"], {**one, "GOOSE_INGEST_METRICS_PORT": "0"}) as c:
            c.healthy(within_s=60)
            port = c.port(within_s=30)
            # connected, but the one shard is leased to the host's worker: this one holds none and waits
            wait_until(lambda: "goose_ingest_shard_leases_held 0.0" in get(port, "/metrics")[1], timeout=30)
            assert "goose_ingest_shard_leases_held 1.0" in get(host_port, "/metrics")[1]
            assert "Traceback" not in c.terminate()
    finally:
        code, _, err = stop(host)
    assert code == 0, err


def test_image_worker_stopped_mid_batch_exits_0_and_loses_nothing(image, settings, tmp_path):
    """SIGTERM while the worker in the container holds a batch it read and has not committed (proved:
    entries pending in its group at the SIGTERM): exit 0, and the next worker completes every run,
    every event once."""
    import redis

    from contracts.keys import shard_of

    lines = FIXTURE.read_text().splitlines()
    runs = [f"image/mid-{i}" for i in range(100)]
    r = redis.Redis.from_url(settings.redis_url)
    pipe = r.pipeline(transaction=False)
    for run in runs:
        stream = settings.layout.raw_stream(shard_of(run, settings.shards))
        for seq, line in enumerate(lines):
            pipe.xadd(stream, {"run": run, "seq": seq, "ts": 1_790_000_000_000 + seq, "line": line})
        pipe.xadd(stream, {"run": run, "seq": len(lines), "ts": 1_790_000_000_000 + len(lines), "kind": "eof", "exit": 0})
    pipe.execute()
    def pending() -> int:
        total = 0
        for stream in settings.layout.raw_streams():
            with contextlib.suppress(redis.ResponseError):  # no group yet
                total += int(r.xpending(stream, settings.group)["pending"])
        return total

    with Container(image, ["worker"], {**on_host(settings), "GOOSE_INGEST_BATCH_SIZE": "20"}) as c:
        proc = c.process(within_s=60)
        # Freeze the worker (SIGSTOP from the host) the moment it holds read, unacknowledged entries:
        # stopped, it acks nothing, so the SIGTERM below finds that batch in flight.
        seen = 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if pending() > 0:
                os.kill(proc, signal.SIGSTOP)
                seen = pending()
                if seen > 0:
                    break
                os.kill(proc, signal.SIGCONT)
            time.sleep(0.005)
        assert seen > 0, "the worker never held a read, unacknowledged batch"
        assert podman("kill", "--signal", "TERM", c.name).returncode == 0
        time.sleep(0.5)  # tini forwards it; the stopped worker has it pending when it goes on
        assert pending() >= seen  # still in flight at the SIGTERM: nothing acked while stopped
        os.kill(proc, signal.SIGCONT)
        _, err = c.proc.communicate(timeout=STOP_TIMEOUT_S)
        assert c.proc.returncode == 0, err.decode()[-2000:]
    second = start_worker(settings, tmp_path / "w.log")
    try:
        wait_until(lambda: set(runs) <= ended_runs(settings), timeout=90)
    finally:
        stop_worker(second)
    published = events_by_run(settings)
    for run in runs:
        assert published[run] == expected_events(settings, run)


def test_image_gateway_stores_a_posted_run_answers_its_probes_and_stops_with_0(image, settings):
    """`gateway` from the image (port 0, read-only, non-root): HEALTHCHECK finds its port, /readyz is
    200 against the host's Redis, a plain-HTTP post with a token is stored and a worker on the host
    turns it into events; SIGTERM ends it with 0."""
    token = subprocess.run([sys.executable, "-m", "services.cli", "tokens", "create", "--prefix", "image-gw/"],
                           cwd=ROOT, env=cli_env(settings), check=True, capture_output=True, text=True,
                           timeout=60).stdout.strip()
    env = {**on_host(settings), "GOOSE_INGEST_GATEWAY_PORT": "0", "GOOSE_INGEST_GATEWAY_HOST": "127.0.0.1"}
    with Container(image, ["gateway"], env) as c:
        c.healthy(within_s=60)
        port = c.ready(within_s=30)
        lines = FIXTURE.read_text().splitlines()
        body = "".join(json.dumps({"run": "image-gw/1", "seq": i, "ts": 1_790_000_000_000 + i, "line": line}) + "\n"
                       for i, line in enumerate(lines))
        body += json.dumps({"run": "image-gw/1", "seq": len(lines), "ts": 1_790_000_000_000 + len(lines),
                            "kind": "eof", "exit": 0}) + "\n"
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/raw", data=body.encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"})
        with urllib.request.urlopen(req, timeout=30) as r:
            reply = json.loads(r.read())
        assert reply["stored"] == len(lines) + 1 and reply["refused"] == 0, reply
        assert token not in c.terminate()
    golden = golden_events()
    worker = start_worker(settings, Path(os.devnull))
    try:
        events = wait_until(lambda: (e := events_by_run(settings).get("image-gw/1")) and len(e) >= len(golden) and e,
                            timeout=60)
    finally:
        stop_worker(worker)
    assert [e["type"] for e in events] == [g["type"] for g in golden]
