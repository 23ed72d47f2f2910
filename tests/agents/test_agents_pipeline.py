"""The real agent CLIs through the whole pipeline, every CI run (issue 36, item 3).

Each CLI runs scenarios under `goose-ingest tap` (a real process): some runs write straight to a
real Redis, the others go through a real `goose-ingest gateway` with a token; two real workers
normalize; the PostgreSQL sink (`export postgres`) and the OTLP exporter (`export otlp`, into the
loopback receiver of tests/support/otlp_receiver.py) read the topics. For every run:
- the events on the topics equal the scenario's expectation (tests/agents/scenarios.py),
- they equal one pure pass over the run's raw entries (tests/support/pipeline.py),
- they equal `normalize` of what the CLI printed (the capture the tap echoed), envelope aside,
- PostgreSQL holds exactly them and every tool event became an `execute_tool` span.
All runs start at once (threads); the CLIs spend their time in their own retry waits.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from uuid import uuid4

import psycopg
import pytest

from services.export.otlp import mapping as m
from services.gateway import tokens
from tests.agents.harness import capture, check, normalize
from tests.agents.install import CLIS, install, npm_missing
from tests.agents.recapture import projected
from tests.agents.scenarios import Scenario, scenario
from tests.gateway.test_gateway import start_gateway
from tests.support import postgres as pg_support
from tests.support.needs import missing
from tests.support.otlp_receiver import RunningReceiver
from tests.support.pipeline import (
    REPO,
    client,
    ended_runs,
    events_by_run,
    expected_events,
    start_worker,
    stop,
    topic,
    wait_until,
)
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

# (cli, scenario, through the gateway?): every CLI at least once each way, a tool run and a fault
# run each; none hit by a normalizer bug being fixed elsewhere (their view is tests/agents/test_agents_scenarios.py)
RUNS = [
    ("claude-code", "tools", False),
    ("claude-code", "rate-limit-429", True),
    ("codex", "tools", True),
    ("codex", "auth-401", False),
]
GATEWAY_PREFIX = "agents/gw/"


def _ready(cli: str) -> None:
    why = npm_missing()
    if why:
        missing("node and npm (the agent CLIs)", f"python3 -m tests.agents.install (.ci/run does it): {why}")
    try:
        install(CLIS[cli])
    except (RuntimeError, OSError) as exc:
        missing(f"the {cli} CLI", f"python3 -m tests.agents.install: {exc}")


def _tap(settings, run: str, sc: Scenario, gateway_url: str | None, token_file) -> tuple[list[str], dict[str, str]]:
    env = cli_env(settings)
    if gateway_url:
        env.update({"GOOSE_INGEST_ENDPOINT": gateway_url, "GOOSE_INGEST_TOKEN_FILE": str(token_file),
                    "GOOSE_INGEST_REDIS_URL": ""})  # an agent host with no broker credential
    tap_env = {k: v for k, v in env.items() if k.startswith("GOOSE_INGEST_") or k in ("PYTHONUNBUFFERED",)}
    tap_env["PYTHONPATH"] = str(REPO)
    # no --format: the tap recognises `claude`/`codex` from the command, as on a user's machine
    return [sys.executable, "-m", "services.cli", "tap", "--run", run, "--"], tap_env


def _db_events(dsn: str) -> dict[str, dict]:
    with psycopg.connect(dsn) as conn:
        return {eid: data for eid, data in conn.execute("SELECT event_id, data FROM events")}


def test_real_cli_runs_through_tap_gateway_workers_and_both_sinks(settings, pg_dsn, tmp_path):
    for cli in {cli for cli, _, _ in RUNS}:
        _ready(cli)
    token, _ = tokens.create(client(settings), settings.layout, GATEWAY_PREFIX, {})
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "pipeline.log"
    procs = []
    with RunningReceiver() as rx:
        try:
            procs.append(start_worker(settings, log))
            procs.append(start_worker(settings, log))
            gw = start_gateway(settings, tmp_path / "gateway.log")
            procs.append(gw.proc)
            procs.append(start_sink(settings, pg_dsn, log))
            procs.append(start_otlp(settings, log, rx.endpoint))
            runs: dict[str, tuple[Scenario, bool]] = {}
            with ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
                futures = {}
                for cli, name, via_gateway in RUNS:
                    sc = scenario(cli, name)
                    run = f"{GATEWAY_PREFIX if via_gateway else 'agents/direct/'}{cli}-{name}-{uuid4().hex[:6]}"
                    runs[run] = (sc, via_gateway)
                    outer, outer_env = _tap(settings, run, sc, gw.url if via_gateway else None, token_file)
                    futures[run] = pool.submit(capture, sc, CLIS[cli].pinned, None, outer, outer_env)
                caps = {run: f.result() for run, f in futures.items()}
            wait_until(lambda: ended_runs(settings) >= set(runs), timeout=120, interval=0.3)
            published = events_by_run(settings)
            for run, (sc, _) in runs.items():
                got = published[run]
                cap = caps[run]
                assert cap.exit_code not in (124, 137), f"{run}: the CLI hit the outer timeout"
                assert got == expected_events(settings, run), f"{run}: topics differ from one pure pass over the raw log"
                assert check(sc.expect, got, sc.final_text) == [], run
                # what the CLI printed (the tap echoes its stdout), normalized without the pipeline
                cli_stderr = [line for line in cap.stderr if not line.startswith("goose-ingest: ")]  # the tap's own
                direct = normalize(cap.stdout, cli_stderr, None, sc.cli)
                assert [x for x in projected(direct) if '"exited with' not in x] == \
                    [x for x in projected([e for e in got if "agent_exit" != e.get("errorClass")])], run
            ended = {r["runId"]: r for r in topic(settings, settings.layout.runs_partitions()) if r["state"] == "ended"}
            assert {run: ended[run].get("format") for run in runs} == {run: sc.cli for run, (sc, _) in runs.items()}
            tool_ids = {e["eventId"] for v in published.values() for e in v if m.is_tool_span(e)}
            assert len(tool_ids) >= 12  # the two tool runs: 6 tool events each
            all_events = {e["eventId"]: e for run in runs for e in published[run]}
            wait_until(lambda: set(_db_events(pg_dsn)) >= set(all_events), timeout=120, interval=0.5)
            db = _db_events(pg_dsn)
            assert {k: db[k] for k in all_events} == all_events
            wanted_spans = {f"{m.span_id_of(i):016x}" for i in tool_ids}
            wait_until(lambda: {s.span_id for s in rx.spans} >= wanted_spans, timeout=120, interval=0.5)
            roots = [s for s in rx.spans if s.name.startswith("invoke_agent")]
            assert len({s.trace_id for s in roots}) >= len(runs)
        finally:
            for p in reversed(procs):
                stop(p)


def start_sink(settings, dsn: str, log):
    return subprocess.Popen([sys.executable, "-m", "services.cli", "export", "postgres"], cwd=REPO,
                            env=cli_env(settings, GOOSE_INGEST_POSTGRES_DSN=dsn, GOOSE_INGEST_METRICS_PORT="0"),
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def start_otlp(settings, log, endpoint: str):
    env = {k: v for k, v in cli_env(settings, GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SWEEP_INTERVAL_S="0.5").items()
           if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    return subprocess.Popen([sys.executable, "-m", "services.cli", "export", "otlp"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)

