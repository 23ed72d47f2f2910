"""End to end: goose transcripts -> real worker process -> real `export otlp` process -> a real backend.

The backend is Arize Phoenix (a local process on loopback, tests/support/phoenix_server.py);
spans are read back through its REST API. The unreachable-collector case uses the small real
OTLP receiver (tests/support/otlp_receiver.py) so it can be started late on a fixed port.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from redis.exceptions import ResponseError

from services.broker.connect import sync_client
from services.export.otlp import mapping as m
from services.settings import Settings
from tests.support.fixtures import FIXTURES
from tests.support.needs import missing
from tests.support.otlp_receiver import RunningReceiver
from tests.support.phoenix_server import Phoenix, PhoenixUnavailable, free_port
from tests.support.pipeline import REPO, events_by_run, start_worker, stop, wait_until
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

TRANSCRIPTS = ["a-read-edit-test-finish.jsonl", "b-tool-error-error-notification.jsonl", "c-mcp-todo-skill-unparseable.jsonl"]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    try:
        server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    except PhoenixUnavailable as exc:
        missing("Arize Phoenix", f"python3 -m tests.support.phoenix_server --install; {exc}")
    yield server
    server.close()


def start_exporter(settings, log: Path, endpoint: str, metrics_port: int, **env: str) -> subprocess.Popen:
    base = {
        "GOOSE_INGEST_METRICS_PORT": str(metrics_port),
        "GOOSE_INGEST_SWEEP_INTERVAL_S": "0.5",
        "OTEL_RESOURCE_ATTRIBUTES": f"{m.GI}test=1",
    }
    if endpoint:
        base["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    base.update(env)
    full = {k: v for k, v in cli_env(settings, **base).items() if not (k.startswith("OTEL_") and k not in base)}
    return subprocess.Popen([sys.executable, "-m", "services.cli", "export", "otlp"], cwd=REPO, env=full,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def publish(settings, run: str, path: Path) -> None:
    subprocess.run([sys.executable, "-m", "services.cli", "publish", "--run", run, str(path)], cwd=REPO,
                   env=cli_env(settings), check=True, capture_output=True, timeout=60)


def http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def backlog(settings, group: str) -> int | None:
    """Pending + undelivered entries of the group over every partition; None until it exists everywhere."""
    r = sync_client(settings)
    total = 0
    try:
        for stream in settings.layout.events_partitions() + settings.layout.runs_partitions():
            try:
                groups = [g for g in r.xinfo_groups(stream) if g["name"] in (group, group.encode())]
            except ResponseError:  # the stream does not exist yet
                return None
            if not groups:
                return None
            total += int(groups[0]["pending"]) + int(groups[0]["lag"] or 0)
        return total
    finally:
        r.close()


def group_settled(settings, group: str) -> bool:
    return backlog(settings, group) == 0


def test_runs_become_traces_in_phoenix_with_stable_ids_across_a_re_export(settings, phoenix, tmp_path):
    project = f"goose-{settings.namespace}"
    exporter_env = {"OTEL_RESOURCE_ATTRIBUTES": f"{m.GI}test=1,openinference.project.name={project}"}
    worker = start_worker(settings, tmp_path / "worker.log")
    mport = free_port()
    exporter = start_exporter(settings, tmp_path / "exporter.log", phoenix.endpoint, mport, **exporter_env)
    runs = {f"e2e/{name.split('.')[0]}": FIXTURES / name for name in TRANSCRIPTS}
    try:
        for run, path in runs.items():
            publish(settings, run, path)

        def roots():
            return [s for s in phoenix.spans(project) if s["name"].startswith("invoke_agent")]

        wait_until(lambda: len(roots()) == len(runs), timeout=120, interval=0.5)
        wait_until(lambda: group_settled(settings, settings.otlp_group), timeout=60)
        spans = phoenix.spans(project)
        events = events_by_run(settings)
        by_id = {s["context"]["span_id"]: s for s in spans}
        for run in runs:
            trace = f"{m.trace_id_of(run):032x}"
            root_id = f"{m.root_span_id_of(run):016x}"
            root = by_id[root_id]
            assert root["context"]["trace_id"] == trace and root["parent_id"] is None
            assert root["name"] == "invoke_agent goose"
            assert root["attributes"]["gen_ai.conversation.id"] == run
            assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
            assert root["span_kind"] == "AGENT"  # Phoenix reads the GenAI conventions
            tools = [e for e in events[run] if m.is_tool_span(e)]
            assert tools, run
            for e in tools:
                span = by_id[f"{m.span_id_of(e['eventId']):016x}"]
                assert span["parent_id"] == root_id and span["context"]["trace_id"] == trace
                assert span["name"] == f"execute_tool {e['tool']}"
                assert span["attributes"]["gen_ai.tool.call.id"] == e["toolCallId"]
                assert (span["status_code"] == "ERROR") == (e.get("isSuccess") is False)
            others = [e for e in events[run] if not m.is_tool_span(e)]
            assert len(root["events"]) == len(others)
            assert all("gen_ai.output.messages" not in ev["attributes"] for ev in root["events"])  # capture is off
        assert len(spans) == sum(1 + len([e for e in events[r] if m.is_tool_span(e)]) for r in runs)

        status, text = http(f"http://127.0.0.1:{mport}/metrics")
        assert status == 200 and 'goose_ingest_otlp_spans_exported_total{kind="root"} 3.0' in text
        assert http(f"http://127.0.0.1:{mport}/readyz")[0] == 200
        before = sorted((s["context"]["trace_id"], s["context"]["span_id"], s["name"]) for s in spans)

        # A re-export from scratch is a new group, nothing else (the first group's state stays: each
        # group has its own): every span again with the same ids.
        stop(exporter)
        assert exporter.returncode == 0
        exporter = start_exporter(settings, tmp_path / "exporter2.log", phoenix.endpoint, free_port(),
                                  GOOSE_INGEST_OTLP_GROUP="second", **exporter_env)
        wait_until(lambda: group_settled(settings, "second") and len(roots()) >= len(runs), timeout=120, interval=0.5)
        time.sleep(1.0)  # Phoenix inserts asynchronously
        after = sorted((s["context"]["trace_id"], s["context"]["span_id"], s["name"]) for s in phoenix.spans(project))
        assert after == before  # Phoenix keeps one span per span id: the repeat changed nothing
    finally:
        stop(exporter)
        stop(worker)


def test_exporter_process_waits_for_an_unreachable_collector_and_loses_nothing(settings, tmp_path):
    port = free_port()
    mport = free_port()
    worker = start_worker(settings, tmp_path / "worker.log")
    exporter = start_exporter(settings, tmp_path / "exporter.log", f"http://127.0.0.1:{port}/v1/traces", mport)
    run = "e2e/down"
    try:
        wait_until(lambda: http(f"http://127.0.0.1:{mport}/readyz")[0] == 200, timeout=60)
        publish(settings, run, FIXTURES / TRANSCRIPTS[0])
        wait_until(lambda: http(f"http://127.0.0.1:{mport}/readyz")[0] == 503, timeout=60)
        assert backlog(settings, settings.otlp_group)  # held back, unacknowledged
        status, text = http(f"http://127.0.0.1:{mport}/metrics")
        assert 'goose_ingest_otlp_ready 0.0' in text
        with RunningReceiver(port) as rx:
            wait_until(lambda: any(s.name.startswith("invoke_agent") for s in rx.spans), timeout=120, interval=0.5)
            wait_until(lambda: group_settled(settings, settings.otlp_group), timeout=60)
            wait_until(lambda: http(f"http://127.0.0.1:{mport}/readyz")[0] == 200, timeout=60)
            tools = [e for e in events_by_run(settings)[run] if m.is_tool_span(e)]
            assert {s.span_id for s in rx.spans} >= {f"{m.span_id_of(e['eventId']):016x}" for e in tools}
        text = http(f"http://127.0.0.1:{mport}/metrics")[1]
        assert 'goose_ingest_otlp_spans_retried_total{kind="tool"}' in text
        assert 'goose_ingest_otlp_spans_retried_total{kind="tool"} 0.0' not in text
    finally:
        stop(exporter)
        stop(worker)
    assert exporter.returncode == 0


def test_the_endpoints_credentials_never_reach_a_log_line(settings, tmp_path):
    """An endpoint with a password in its userinfo and a token in its query (issue 20, finding 10)."""
    mport = free_port()
    log = tmp_path / "exporter.log"
    with RunningReceiver() as rx:
        endpoint = f"http://spans:pw-s3cret-user@127.0.0.1:{rx.port}/v1/traces?api_key=qs3cret-token"
        worker = start_worker(settings, tmp_path / "worker.log")
        exporter = start_exporter(settings, log, endpoint, mport)
        try:
            publish(settings, "e2e/secret", FIXTURES / TRANSCRIPTS[0])
            wait_until(lambda: any(s.name.startswith("invoke_agent") for s in rx.spans), timeout=120, interval=0.5)
        finally:
            stop(exporter)
            stop(worker)
    text = log.read_text(errors="replace")
    assert f"127.0.0.1:{rx.port}/v1/traces" in text  # where spans go is still said
    assert "pw-s3cret-user" not in text and "qs3cret-token" not in text, text[-3000:]


def test_an_exporter_started_while_redis_is_at_maxmemory_waits_with_one_line(private_redis, tmp_path):
    """XGROUP CREATE refused with OOM (maxmemory, noeviction): one warning, no traceback, and the
    exporter starts once memory is freed (issue 20, finding 3)."""
    import redis

    settings = Settings(redis_url=private_redis.url, namespace="oom", shards=2, spool_dir=str(tmp_path / "spool"))
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    mport = free_port()
    log = tmp_path / "exporter.log"
    with RunningReceiver() as rx:
        exporter = start_exporter(settings, log, rx.endpoint, mport)
        try:
            wait_until(lambda: "waiting for it" in log.read_text(errors="replace"), timeout=60)
            time.sleep(2)
            assert exporter.poll() is None
            admin.config_set("maxmemory", "0")
            wait_until(lambda: http(f"http://127.0.0.1:{mport}/readyz")[0] == 200, timeout=60)
        finally:
            stop(exporter)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert len([line for line in text.splitlines() if "refuses to create the consumer groups" in line]) == 1
    assert all(settings.otlp_group.encode() in {g["name"] for g in admin.xinfo_groups(s)}
               for s in settings.layout.events_partitions())


def test_sigterm_while_the_collector_is_down_exits_and_leaves_the_batch_pending(settings, tmp_path):
    port = free_port()
    worker = start_worker(settings, tmp_path / "worker.log")
    exporter = start_exporter(settings, tmp_path / "exporter.log", f"http://127.0.0.1:{port}/v1/traces", free_port())
    try:
        publish(settings, "e2e/term", FIXTURES / TRANSCRIPTS[0])
        wait_until(lambda: backlog(settings, settings.otlp_group), timeout=60)
        time.sleep(1.0)
        started = time.monotonic()
        exporter.terminate()
        exporter.wait(timeout=60)
        assert time.monotonic() - started < 30
        assert exporter.returncode == 0
        r = sync_client(settings)
        pending = sum(r.xpending(s, settings.otlp_group)["pending"] for s in settings.layout.events_partitions())
        r.close()
        assert pending > 0  # nothing acked that was not exported: any replica takes it over later
    finally:
        stop(exporter)
        stop(worker)


def test_demo_with_otlp_prints_trace_ids_that_phoenix_shows(phoenix, tmp_path):
    project = f"demo-{tmp_path.name[-12:]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOSE_INGEST_", "OTEL_"))}
    env["OTEL_RESOURCE_ATTRIBUTES"] = f"openinference.project.name={project}"
    env["GOOSE_INGEST_SPOOL_DIR"] = str(tmp_path / "spool")
    proc = subprocess.run([sys.executable, "-m", "services.cli", "demo", "--otlp", phoenix.url, str(FIXTURES / TRANSCRIPTS[0])],
                          cwd=REPO, env=env, capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    traces = [line.split() for line in proc.stdout.decode().splitlines() if line.startswith("trace ")]
    assert len(traces) == 1
    _, trace_id, run = traces[0]
    assert trace_id == f"{m.trace_id_of(run):032x}"
    wait_until(lambda: any(s["name"].startswith("invoke_agent") for s in phoenix.spans(project)), timeout=30, interval=0.5)
    spans = phoenix.spans(project)
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}
    assert any(s["name"].startswith("execute_tool") for s in spans)


def test_grpc_protocol_reaches_phoenix_too(settings, phoenix, tmp_path):
    import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401 - in the test extra: fails, never skips, when missing
    project = f"grpc-{settings.namespace}"
    worker = start_worker(settings, tmp_path / "worker.log")
    exporter = start_exporter(settings, tmp_path / "exporter.log", "", free_port(),
                              OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.grpc_endpoint,
                              OTEL_EXPORTER_OTLP_INSECURE="true",
                              OTEL_RESOURCE_ATTRIBUTES=f"openinference.project.name={project}")
    run = "e2e/grpc"
    try:
        publish(settings, run, FIXTURES / TRANSCRIPTS[0])
        wait_until(lambda: any(s["name"].startswith("invoke_agent") for s in phoenix.spans(project)), timeout=120, interval=0.5)
        spans = phoenix.spans(project)
        assert {s["context"]["trace_id"] for s in spans} == {f"{m.trace_id_of(run):032x}"}
        assert any(s["name"].startswith("execute_tool") for s in spans)
    finally:
        stop(exporter)
        stop(worker)
