"""The smaller traps of issue 38 item 6, each as a user meets it: a collector outage in two log lines,
an OTLP endpoint that is no URL refused, `up` saying that 6379 was taken, /metrics without `_created`
series, `tokens list` with a header (tests/gateway/test_gateway.py)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from services.broker.connect import sync_client
from services.broker.embedded import free_port
from tests.e2e.test_first_hour_traps import clean_env, goose_ingest, one_line
from tests.export.test_export_otlp import publish_events, run_events
from tests.support.fixtures import REPO
from tests.support.otlp_receiver import RunningReceiver
from tests.support.pipeline import wait_until
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
@pytest.mark.parametrize("value", ["not-a-url", "127.0.0.1:4318", "ftp://collector:21", "http://:4318", "http://h:port"])
def test_an_otlp_endpoint_that_is_not_an_http_url_is_one_line(settings, variable, value):
    line = one_line(goose_ingest("export", "otlp", env=cli_env(settings, GOOSE_INGEST_METRICS_PORT="0", **{variable: value})))
    assert variable in line and "http://" in line, line


def test_a_collector_outage_is_one_line_down_and_one_line_back(settings, tmp_path):
    """The SDK logged each retry ("Transient error ... retrying in 2s": 12 per 30 s outage) and the
    exporter each backoff; now: one warning when it goes, one line when it is back."""
    port = free_port()
    r = sync_client(settings)
    publish_events(r, settings, run_events("outage/run"))
    log = tmp_path / "otlp.log"
    env = cli_env(settings, GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_OTLP_RETRY_MAX_S="0.5",
                  OTEL_EXPORTER_OTLP_TIMEOUT="1", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{port}/v1/traces")
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "export", "otlp"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    receiver = None
    try:
        wait_until(lambda: "collector unavailable" in log.read_text(errors="replace") or proc.poll() is not None,
                   timeout=90)
        time.sleep(8)  # several attempts of the SDK and of the exporter's backoff
        receiver = RunningReceiver(port)
        wait_until(lambda: "collector reachable again" in log.read_text(errors="replace") or proc.poll() is not None,
                   timeout=90)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        if receiver is not None:
            receiver.close()
    text = log.read_text(errors="replace")
    assert text.count("collector unavailable") == 1, text[-4000:]
    assert text.count("collector reachable again") == 1, text[-4000:]
    assert "Transient error" not in text and "Failed to export" not in text, text[-4000:]


def test_metrics_have_no_created_series():
    from prometheus_client import generate_latest

    from services.metrics import Metrics

    metrics = Metrics()
    text = generate_latest(metrics.registry).decode()
    assert "_total" in text and "_bucket" in text
    assert not [line for line in text.splitlines() if "_created" in line.split(" ")[0]]


def test_up_says_that_6379_was_taken_and_where_it_listens_instead(tmp_path):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 6379))
        holder.listen(1)
    except OSError:  # held by another process of this machine already: taken all the same
        holder.close()
        holder = None
    env = clean_env(GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"))
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("embedded redis-server at" in s for s in seen):
            line = proc.stderr.readline() if proc.stderr else ""
            if not line and proc.poll() is not None:
                break
            seen.append(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        if holder is not None:
            holder.close()
    taken = [s for s in seen if "port 6379 is taken" in s]
    url = re.search(r"embedded redis-server at redis://127\.0\.0\.1:(\d+)/0", "".join(seen))
    assert url and url.group(1) != "6379", seen
    assert len(taken) == 1 and f"listens on {url.group(1)} instead" in taken[0], seen

