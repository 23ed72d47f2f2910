"""No credential of a broker URL, a DSN or an OTLP endpoint reaches a log line of the exporters
(issue 20 item 9): `export postgres` and `export otlp` as real processes, on the real broker and
PostgreSQL, with a password in every address they are given, working and failing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from services.broker.connect import sync_client
from services.broker.url import redact_url
from services.settings import Settings
from tests.export.test_export_otlp import publish_events, run_events
from tests.support import postgres as pg_support
from tests.support.otlp_receiver import RunningReceiver
from tests.support.pipeline import REPO
from tests.support.postgres import free_port, wait_for
from tests.support.redis_server import cli_env

pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

SECRETS = ("rb-s3cret-pw", "pg-s3cret-pw", "pg-s3cret-sslpw", "ep-s3cret-pw", "ep-s3cret-token")


def test_redact_url_drops_userinfo_secret_query_values_and_the_fragment():
    assert redact_url("redis://user:s3cret@h:6379/0") == "redis://***@h:6379/0"
    assert redact_url("rediss://h:6380/0?password=s3cret&db=2&ssl_cert_reqs=none") == \
        "rediss://h:6380/0?password=***&db=2&ssl_cert_reqs=none"
    for name in ("token", "api_key", "X-Auth", "sig", "secret", "access_key", "newfangled"):
        shown = redact_url(f"redis://h/0?{name}=s3cret")
        assert "s3cret" not in shown and shown.endswith(f"{name}=***"), shown
    assert redact_url("redis://h/0?s3cret") == "redis://h/0?***"  # a bare parameter may be the secret itself
    assert redact_url("redis://h/0#s3cret") == "redis://h/0"
    assert redact_url("redis://h:6379") == "redis://h:6379"


def _with_password(settings: Settings) -> str:
    # The test broker's default user has no password: redis accepts any, so the URL still works.
    url = settings.redis_url or ""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://default:rb-s3cret-pw@{rest.rsplit('@', 1)[-1]}"


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.e2e
def test_no_password_of_any_address_reaches_an_exporters_log(settings, pg_dsn, tmp_path):
    broker = _with_password(settings)
    dead_broker = f"redis://default:rb-s3cret-pw@127.0.0.1:{free_port()}/0"
    dsn = make_conninfo(pg_dsn, password="pg-s3cret-pw", sslpassword="pg-s3cret-sslpw")
    dead_dsn = make_conninfo(dsn, port=str(free_port()), connect_timeout="2")
    postgres = [sys.executable, "-m", "services.cli", "export", "postgres", "--log-level", "DEBUG"]
    otlp = [sys.executable, "-m", "services.cli", "export", "otlp", "--log-level", "DEBUG"]
    r = sync_client(settings)
    publish_events(r, settings, run_events("secrets/run"))  # something for the dead collector to refuse
    r.close()
    logs: dict[str, Path] = {}
    with RunningReceiver() as rx:
        endpoint = f"http://spans:ep-s3cret-pw@127.0.0.1:{rx.port}/v1/traces?api_key=ep-s3cret-token"
        cases = {
            # working: started, serving (a span sent: urllib3 logs the request line at DEBUG), stopped
            "otlp": (otlp, {"GOOSE_INGEST_REDIS_URL": broker, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint},
                     r"POST /v1/traces"),
            "postgres": (postgres, {"GOOSE_INGEST_REDIS_URL": broker, "GOOSE_INGEST_POSTGRES_DSN": dsn}, r"metrics on"),
            # failing: the database, the broker, the collector unreachable
            "postgres-dead-db": (postgres + ["--migrate"], {"GOOSE_INGEST_REDIS_URL": broker,
                                                            "GOOSE_INGEST_POSTGRES_DSN": dead_dsn}, None),
            "postgres-dead-broker": (postgres, {"GOOSE_INGEST_REDIS_URL": dead_broker, "GOOSE_INGEST_POSTGRES_DSN": dsn}, None),
            "otlp-dead-broker": (otlp, {"GOOSE_INGEST_REDIS_URL": dead_broker,
                                        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}, None),
            "otlp-dead-collector": (otlp, {"GOOSE_INGEST_REDIS_URL": broker, "GOOSE_INGEST_OTLP_GROUP": "secrets-dead",
                                           "OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                                           f"http://spans:ep-s3cret-pw@127.0.0.1:{free_port()}/v1/traces?api_key=ep-s3cret-token"},
                                    r"collector unavailable"),
        }
        procs = {}
        for name, (cmd, extra, _) in cases.items():  # all at once: the machine's time is the longest case's
            log = logs[name] = tmp_path / f"{name}.log"
            env = cli_env(settings, GOOSE_INGEST_METRICS_PORT="0", **extra)
            env = {k: v for k, v in env.items() if not (k.startswith("OTEL_") and k not in extra)}
            procs[name] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        try:
            for name, (_, _, until) in cases.items():
                # until its log says `until`, or it has tried (and failed) for a few seconds
                pattern = until or r"unreachable|retry|waiting|Error|error"
                log, proc = logs[name], procs[name]
                wait_for(lambda p=pattern, log=log, proc=proc: re.search(p, log.read_text(errors="replace"))
                         or proc.poll() is not None, timeout=90)
            time.sleep(2)  # a few more attempts of the failing ones
        finally:
            for proc in procs.values():
                _stop(proc)
    for name, log in logs.items():
        text = log.read_text(errors="replace")
        assert text.strip(), f"{name}: nothing logged"
        leaked = [s for s in SECRETS if s in text]
        lines = [line for line in text.splitlines() if any(secret in line for secret in SECRETS)]
        assert not leaked, f"{name} logged {leaked}:\n" + "\n".join(lines[:10])
    assert "127.0.0.1" in logs["postgres-dead-db"].read_text()  # the failing address is still named
    assert "collector unavailable" in logs["otlp-dead-collector"].read_text()
