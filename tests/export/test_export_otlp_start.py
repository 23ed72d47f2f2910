"""`export otlp` started through a proxy that answers PING past FastStream's 3 s subscriber start
(issue 20): it says so in one line, starts the subscriber again, and exports every run once.

Same case as tests/worker/test_start_under_load.py for the worker: the exporter's subscribers go
through the same start (services/streams/groups.py `start_through_refusals`, `hold_reads_until`).
Before the fix the process exited 1 with a TimeoutError traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from services.broker.connect import sync_client
from services.streams.faststream_adapter import FASTSTREAM_START_S
from tests.export.test_export_otlp import publish_events, publish_records, run_events, run_records
from tests.support.otlp_receiver import RunningReceiver
from tests.support.pipeline import REPO, stop, wait_until
from tests.support.redis_server import cli_env
from tests.support.slow_proxy import SlowProxy

pytestmark = pytest.mark.e2e

SLOW_LINK_S = FASTSTREAM_START_S + 0.5  # how late the proxy passes every PING on


def _start_exporter(settings, log: Path, endpoint: str) -> subprocess.Popen:
    env = {k: v for k, v in cli_env(settings, GOOSE_INGEST_METRICS_PORT="0").items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    return subprocess.Popen([sys.executable, "-m", "services.cli", "export", "otlp"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def test_an_exporter_whose_subscriber_start_outlasts_3_s_starts_again_and_exports_every_run(settings, tmp_path):
    runs = [f"otlpstart/run-{i}" for i in range(4)]
    r = sync_client(settings)
    publish_events(r, settings, [e for run in runs for e in run_events(run)])
    publish_records(r, settings, [rec for run in runs for rec in run_records(run)])
    r.close()
    broker = urlsplit(settings.redis_url)
    # every PING answered after 3.5 s from the start: the subscriber's start waits for one (the
    # broker's first check does too, with no limit); a delay switched on later raced the start
    proxy = SlowProxy(broker.port or 6379, target_host=broker.hostname or "127.0.0.1", only=b"PING",
                      delay_s=SLOW_LINK_S)
    through_proxy = settings.model_copy(update={"redis_url": broker._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()})
    log = tmp_path / "otlp.log"
    with RunningReceiver() as rx:
        exporter = _start_exporter(through_proxy, log, rx.endpoint)
        try:
            wait_until(lambda: exporter.poll() is not None or "starting it again" in log.read_text(errors="replace"),
                       timeout=240, interval=0.2)
            assert exporter.poll() is None, f"exited {exporter.returncode} at start:\n" + log.read_text(errors="replace")[-3000:]
            proxy.delay_s = 0.0

            def roots() -> list[str]:
                return [s.attributes["gen_ai.conversation.id"] for s in list(rx.spans) if s.name.startswith("invoke_agent")]

            wait_until(lambda: exporter.poll() is not None or set(roots()) >= set(runs), timeout=120, interval=0.3)
            assert exporter.poll() is None, log.read_text(errors="replace")[-3000:]
        finally:
            proxy.delay_s = 0.0
            stop(exporter)
            proxy.close()
        exported = roots()
    text = log.read_text(errors="replace")
    assert exporter.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert sorted(exported) == sorted(runs), exported  # each root once: no second reader after the retry
