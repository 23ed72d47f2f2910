"""Every error-class alert fired from published runs, and its runbook's queries finding those runs.

Real worker processes, a real Prometheus on the rules time-scaled 60x (the stack of
tests/deploy/test_prometheus_live.py, the workers' ALERT_WINDOW_S scaled alike), and a real
`export postgres` into a database of its own. After a scaled hour of history (AgentExitSpike stays
silent before it has a baseline), a storm: per error class, two runs a second, spread over
ALERT_MIN_HOSTS hosts (the shipped defaults decide when they page), each run failing with that
class (a provider's text in goose's stream-json `error` record; `agent_exit`: an exit code 1).
Every class alert must fire in Prometheus with its class label. Then each alert's runbook entry
in docs/operations.md is run **as written**: its SQL against the export database, and its
`goose-ingest tail --no-follow --class C` as a process; both must name exactly the runs published
with that class, and their hosts. ~2.5 minutes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import orjson
import psycopg
import pytest
import redis

from services.sequencer import Entry
from services.settings import Settings
from tests.deploy.test_prometheus_live import MESSAGE, Stack, _baseline_window_s
from tests.export.test_export_postgres_live import start_sink
from tests.support import postgres as pg_support
from tests.support.pipeline import REPO, stop
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

OPERATIONS = REPO / "docs" / "operations.md"
# class -> (its alert, the line of a run that fails with it; None: the run exits 1)
CLASSES: dict[str, tuple[str, bytes | None]] = {
    "auth": ("GooseIngestAuthErrors", b"Authentication failed: 401 Unauthorized, invalid x-api-key"),
    "quota": ("GooseIngestQuotaExhausted", b"Your credit balance is too low to access the Anthropic API. "
                                           b"Please go to Plans & Billing to upgrade or purchase credits."),
    "provider_unavailable": ("GooseIngestProviderUnavailable", b"529 Overloaded: the provider is temporarily overloaded"),
    "rate_limit": ("GooseIngestRateLimited", b"Rate limit exceeded: 429 Too Many Requests"),
    "timeout": ("GooseIngestTimeouts", b"Request timed out: stream disconnected before completion"),
    "context_length": ("GooseIngestContextLengthErrors",
                       b"Context length exceeded: prompt is too long: 210000 tokens > 200000 maximum"),
    "agent_exit": ("GooseIngestAgentExitSpike", None),
}
HOSTS = tuple(f"fleet-{i}" for i in range(Settings.model_fields["alert_min_hosts"].default))
RUNS_PER_CLASS_PER_S = 2.0
FIRING_TIMEOUT_S = 90.0
CATCH_UP_TIMEOUT_S = 90.0


class Fleet(threading.Thread):
    """Publishes, while `storming`, runs failing with each class, round robin over HOSTS: raw
    entries XADDed as a tap writes them (run key, seq, ts, host and format labels, then eof)."""

    TICK_S = 0.25

    def __init__(self, settings: Settings):
        super().__init__(name="class-fleet", daemon=True)
        self.settings = settings
        self.halt = threading.Event()
        self.storming = threading.Event()
        self.published: dict[str, set[tuple[str, str]]] = {cls: set() for cls in CLASSES}
        self.error: BaseException | None = None
        self._client = redis.Redis.from_url(settings.redis_url)

    def _publish(self, pipe, cls: str, k: int) -> None:
        layout = self.settings.layout
        run, host = f"class/{cls}/{k}", HOSTS[k % len(HOSTS)]
        text = CLASSES[cls][1]
        lines = [MESSAGE] + ([orjson.dumps({"type": "error", "error": text.decode()})] if text else [])
        now = int(time.time() * 1000)
        stream = layout.raw_stream(layout.shard_of(run))
        for seq, line in enumerate(lines):
            pipe.xadd(stream, Entry.of_line(run, seq, now, line.decode(), host=host,
                                            format="goose" if seq == 0 else None).to_fields())
        pipe.xadd(stream, Entry.of_eof(run, len(lines), now, 0 if text else 1, host=host).to_fields())
        self.published[cls].add((run, host))

    def run(self) -> None:
        try:
            k = 0
            started = None
            while not self.halt.is_set():
                if self.storming.is_set():
                    started = started or time.monotonic()
                    due = int((time.monotonic() - started) * RUNS_PER_CLASS_PER_S) + 1
                    pipe = self._client.pipeline(transaction=False)
                    while k < due:
                        for cls in CLASSES:
                            self._publish(pipe, cls, k)
                        k += 1
                    pipe.execute()
                self.halt.wait(self.TICK_S)
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.error = exc
        finally:
            self._client.close()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"publisher thread failed: {self.error!r}") from self.error
        assert self.is_alive(), "publisher thread stopped"

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)


def runbook(alert: str) -> tuple[list[str], list[str]]:
    """The SQL statements and the `goose-ingest tail` command of an alert's runbook entry."""
    text = OPERATIONS.read_text()
    start = text.index(f"### {alert}\n")
    end = text.index("\n### ", start + 1)
    section = text[start:end]
    (block,) = re.findall(r"```sql\n(.*?)```", section, re.S)
    statements = [s.strip() for s in block.split(";") if s.strip()]
    commands = re.findall(r"`(goose-ingest tail [^`]+)`", section)
    return statements, commands


def test_runbook_entries_have_a_query_per_place():
    for cls, (alert, _) in CLASSES.items():
        statements, commands = runbook(alert)
        assert len(statements) == 2 and all(f"error_class = '{cls}'" in s for s in statements), alert
        assert commands == [f"goose-ingest tail --no-follow --class {cls}"], alert


@pytest.fixture
def stack(settings, tmp_path):
    s = Stack(settings, tmp_path)
    try:
        yield s
    finally:
        s.close()


def test_each_class_alert_fires_and_its_runbook_finds_the_runs_and_hosts(stack, settings, pg_dsn, tmp_path):
    prom = stack.prom
    sink = start_sink(settings, pg_dsn, tmp_path / "sink.log")
    fleet = Fleet(settings)
    fleet.start()
    try:
        # 1. a scaled hour of history: AgentExitSpike has a baseline (0 hosts), nothing fires
        base_range_s, base_offset_s = _baseline_window_s()
        end = time.monotonic() + base_range_s + base_offset_s + 5
        while time.monotonic() < end:
            fleet.check()
            assert sink.poll() is None, (tmp_path / "sink.log").read_text()[-3000:]
            time.sleep(0.5)
        assert prom.query("ALERTS") == [], prom.query("ALERTS")
        # 2. the storm: every class alert fires (AgentExitSpike only until its baseline catches up)
        fleet.storming.set()
        wanted = {alert: cls for cls, (alert, _) in CLASSES.items()}
        fired: dict[str, dict] = {}
        deadline = time.monotonic() + FIRING_TIMEOUT_S
        while set(fired) != set(wanted):
            fleet.check()
            assert time.monotonic() < deadline, (
                f"fired {sorted(fired)}, not {sorted(set(wanted) - set(fired))}\n"
                f"{[(s['metric'], s['value'][1]) for s in prom.query('goose_ingest_error_class_hosts > 0')]}\n"
                f"{stack.diagnostics()}")
            for alert in set(wanted) - set(fired):
                firing = [a for a in prom.alerts(alert) if a["state"] == "firing"]
                if firing:
                    fired[alert] = firing[0]
            time.sleep(0.25)
        fleet.stop()
        assert fleet.error is None, fleet.error
        for alert, cls in wanted.items():
            labels = fired[alert]["labels"]
            assert labels["class"] == cls and labels["job"] == stack.job, labels
            assert fired[alert]["annotations"]["runbook_url"] == f"docs/operations.md#{alert.lower()}"

        # 3. the runbooks, as written: PostgreSQL (once the sink has every published run)...
        published = fleet.published
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            for cls, (alert, _) in CLASSES.items():
                runs_sql, hosts_sql = runbook(alert)[0]
                while True:
                    rows = conn.execute(runs_sql).fetchall()
                    if {(r[0], r[1]) for r in rows} >= published[cls] or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                assert {(r[0], r[1]) for r in rows} == published[cls], (cls, sorted(rows)[:5], len(published[cls]))
                assert all(r[2] >= 1 for r in rows), rows
                hosts = conn.execute(hosts_sql).fetchall()
                assert {h[0] for h in hosts} == set(HOSTS), (cls, hosts)
                assert sum(h[1] for h in hosts) == len(published[cls]), (cls, hosts)
        # ... and the topics
        for cls, (alert, _) in CLASSES.items():
            (command,) = runbook(alert)[1]
            out = subprocess.run([sys.executable, "-m", "services.cli", *command.split()[1:]], cwd=REPO,
                                 env=cli_env(settings), capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            seen = {(m.group(1), m.group(2)) for m in re.finditer(r" (class/\S+)#\d+ host=(\S+) ", out.stdout)}
            assert seen == published[cls], (cls, out.stdout[-2000:])
            assert all(line.endswith(f"{cls}]") for line in out.stdout.splitlines()), out.stdout[-2000:]
    finally:
        fleet.stop()
        stop(sink)
