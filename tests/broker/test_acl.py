"""Least privilege: deploy/redis/users.acl loaded into a real redis-server, every command run under its
role's user (GOOSE_INGEST_REDIS_USERNAME/PASSWORD), and what a role must not do refused with NOPERM."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import orjson
import pytest
import redis

from contracts.keys import KeyLayout
from services.broker.acl import EXPORTERS, ROLE_NAMES, exporter_role, render, user_name
from services.broker.embedded import EmbeddedRedis, start_redis
from services.settings import Settings
from tests.support import postgres as pg_support
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.pipeline import stop, wait_until
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

# The PostgreSQL fixtures (tests/support/postgres.py), for the exporter's role.
pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn

SHIPPED = REPO / "deploy" / "redis" / "users.acl"
# Before the real ACL is loaded the server must answer our readiness probe as the default user.
BOOTSTRAP_ACL = "user default on nopass ~* &* +@all\n"
# The test's own superuser beside the roles (ACL LOG, ACL DRYRUN are beyond every role, admin included).
ROOT_USER, ROOT_PASSWORD = "test-root", f"root-{uuid4().hex}"
ROOT_LINE = f"user {ROOT_USER} on >{ROOT_PASSWORD} ~* &* +@all\n"
ACL_LOG_READ = 1000  # ACL LOG returns 10 entries unless asked for more (the server keeps up to 128)


@dataclass
class AclBroker:
    server: EmbeddedRedis
    acl_path: Path
    settings: Settings  # namespace, shards, spool of this test; no credentials
    passwords: dict[str, str]

    def user(self, role: str) -> str:
        return user_name(role, self.settings.namespace)

    def client(self, role: str) -> redis.Redis:
        return redis.Redis(port=self.server.port, username=self.user(role), password=self.passwords[role],
                           socket_timeout=10)

    def env(self, role: str, **extra: str) -> dict[str, str]:
        credentials = {"GOOSE_INGEST_REDIS_USERNAME": self.user(role), "GOOSE_INGEST_REDIS_PASSWORD": self.passwords[role]}
        return cli_env(self.settings, **{**credentials, **extra})

    def cli(self, role: str, *args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=self.env(role, **extra),
                              capture_output=True, text=True, timeout=timeout)

    def root(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, username=ROOT_USER, password=ROOT_PASSWORD, socket_timeout=10)

    def denials(self) -> list[dict]:
        """ACL LOG entries (every refused command or key since the ACL was loaded)."""
        return [{k: v.decode() if isinstance(v, bytes) else v for k, v in entry.items()}
                for entry in self.root().acl_log(count=ACL_LOG_READ)]


def load_acl(server: EmbeddedRedis, path: Path, text: str) -> None:
    """Replace the server's ACL with `text` (ACL LOAD validates it: a bad rule fails here)."""
    path.write_text(text)
    with redis.Redis(port=server.port, socket_timeout=10) as c:
        c.execute_command("ACL", "LOAD")


def start_acl_server(tmp_path: Path) -> tuple[EmbeddedRedis, Path]:
    acl_path = tmp_path / "users.acl"
    acl_path.write_text(BOOTSTRAP_ACL)
    server = start_redis(dir=str(tmp_path / "acl-redis"), extra_args=["--aclfile", str(acl_path)])
    return server, acl_path


@pytest.fixture
def acl_broker(tmp_path: Path):
    server, acl_path = start_acl_server(tmp_path)
    settings = Settings(redis_url=server.url, namespace=f"acl{uuid4().hex[:6]}", shards=2,
                        spool_dir=str(tmp_path / "spool"), host_label="acl-host")
    passwords = {role: f"pw-{role}-{uuid4().hex[:8]}" for role in ROLE_NAMES}
    try:
        load_acl(server, acl_path, render(settings.layout, passwords) + ROOT_LINE)
        yield AclBroker(server, acl_path, settings, passwords)
    finally:
        server.close()


def _runs_ended(broker: AclBroker) -> set[str]:
    admin = broker.client("admin")
    ended = set()
    for stream in broker.settings.layout.runs_partitions():
        for _, f in admin.xrange(stream):
            if f[b"state"] in (b"ended", b"abandoned"):
                ended.add(f[b"runId"].decode())
    return ended


# --- the shipped file ----------------------------------------------------------------------------
def test_the_shipped_acl_file_is_the_render_of_the_default_names_and_loads(tmp_path):
    assert SHIPPED.read_text() == render(KeyLayout()), "regenerate: goose-ingest acl > deploy/redis/users.acl"
    defaults = Settings.model_fields
    layout = KeyLayout()
    # the file's patterns are made from the settings' default names, not from copies of them
    assert (layout.raw_prefix, layout.control_prefix, layout.events_topic, layout.runs_topic, layout.deadletter_stream) == (
        defaults["raw_stream_prefix"].default, defaults["control_stream_prefix"].default,
        defaults["events_topic"].default, defaults["runs_topic"].default, defaults["deadletter_stream"].default)
    server, acl_path = start_acl_server(tmp_path)
    try:
        load_acl(server, acl_path, SHIPPED.read_text())
        # the default user is off and every role user exists but is off until given a password
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, socket_timeout=5).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, username="goose-worker", password="", socket_timeout=5).ping()
    finally:
        server.close()


def test_acl_command_prints_the_file_with_passwords_for_the_roles_given(tmp_path):
    pw = tmp_path / "tap.pw"
    pw.write_text("s3cret-tap\n")
    env = {"PATH": "/usr/bin:/bin", "GOOSE_INGEST_NAMESPACE": "fleet1"}
    out = subprocess.run([sys.executable, "-m", "services.cli", "acl", "--password-file", f"tap={pw}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == render(KeyLayout(namespace="fleet1"), {"tap": "s3cret-tap"})
    assert "s3cret-tap" not in out.stdout  # stored as its SHA-256
    tap_line = next(line for line in out.stdout.splitlines() if line.startswith("user fleet1-tap "))
    assert " on #" in tap_line and "%W~fleet1:goose.raw.*" in tap_line
    bad = subprocess.run([sys.executable, "-m", "services.cli", "acl", "--password-file", "root=/nope"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


# --- every command under its role ----------------------------------------------------------------
def test_every_command_runs_under_its_role_and_nothing_is_refused(acl_broker: AclBroker, tmp_path, fixture_db):
    b = acl_broker
    ns = b.settings.namespace
    # tap and publish as the tap user (before any worker exists: the worker's groups start at 0)
    tapped = b.cli("tap", "tap", "--run", "acl/tapped", "--quiet", "--", "cat", str(TRANSCRIPTS[0]))
    assert tapped.returncode == 0, tapped.stderr
    published = b.cli("tap", "publish", "--run", "acl/published", str(TRANSCRIPTS[1]))
    assert published.returncode == 0, published.stderr
    # a run that never ends: the worker abandons it (writes a control entry) under its own role
    left_open = b.cli("tap", "publish", "--run", "acl/left-open", "--no-eof", str(TRANSCRIPTS[2]))
    assert left_open.returncode == 0, left_open.stderr
    imported = b.cli("importer", "import-sessions", str(fixture_db), "--namespace", "aclimport", "--no-progress")
    assert imported.returncode == 0, imported.stderr

    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "worker"], cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        env=b.env("worker", GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_RUN_IDLE_TIMEOUT_S="2",
                  GOOSE_INGEST_SWEEP_INTERVAL_S="0.3", GOOSE_INGEST_CLAIM_IDLE_MS="1500"),
    )
    try:
        wanted = {"acl/tapped", "acl/published", "acl/left-open"}
        wait_until(lambda: wanted <= _runs_ended(b), timeout=60)
        imported_runs = {r for r in _runs_ended(b) if r.startswith("aclimport/")}
        assert imported_runs, "the imported session was not processed"
    finally:
        stop(worker)
    assert "NOPERM" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]

    # a reader of the topics: tail as the consumer
    tail = b.cli("consumer", "tail", "--no-follow", "--run", "acl/published")
    assert tail.returncode == 0, tail.stderr
    assert "RUN ENDED" in tail.stdout and "acl/published#0" in tail.stdout
    # a dashboard or ad-hoc reader: by id only (XREAD, XRANGE, XINFO), no consumer group of its own
    consumer = b.client("consumer")
    events = b.settings.layout.events_partitions()[0]
    got = consumer.xread({events: "0"}, count=5)
    assert got and len(got[0][1]) == 5 and consumer.xrange(events, count=1)
    assert consumer.xinfo_stream(events)["length"] >= 5 and isinstance(consumer.xinfo_groups(events), list)

    # the open runs, under the worker's role (ZRANGE ... REV, ZCARD, HGET, XREVRANGE, TIME) and the operator's
    for role in ("worker", "admin"):
        listed = b.cli(role, "runs")
        assert listed.returncode == 0 and "open run" in listed.stderr, (role, listed.stderr[-2000:])

    # replay as the operator
    replay = b.cli("admin", "replay")
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]

    denied = [(d.get("username"), d.get("object")) for d in b.denials()]
    assert denied == [], f"normal work was refused: {denied}"
    assert ns  # the namespace prefix was in force throughout


def test_each_exporter_runs_under_its_own_role(acl_broker: AclBroker, tmp_path, pg_dsn):
    """`export postgres` and `export otlp` (real processes, a real PostgreSQL and OTLP receiver), each as its own user."""
    import psycopg

    from tests.support.otlp_receiver import RunningReceiver

    b = acl_broker
    published = b.cli("tap", "publish", "--run", "acl/exported", str(TRANSCRIPTS[0]))
    assert published.returncode == 0, published.stderr
    logs = {name: tmp_path / f"{name}.log" for name in ("worker", "postgres", "otlp")}

    def start(role: str, args: list[str], log: Path, **env: str) -> subprocess.Popen:
        full = {k: v for k, v in b.env(role, GOOSE_INGEST_METRICS_PORT="0", **env).items()
                if not (k.startswith("OTEL_") and k not in env)}
        return subprocess.Popen([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=full,
                                stdout=log.open("ab"), stderr=subprocess.STDOUT)

    def rows() -> int:
        try:
            with psycopg.connect(pg_dsn, connect_timeout=3) as conn:
                query = "SELECT count(*) FROM runs WHERE run_key = 'acl/exported' AND state = 'ended'"
                return conn.execute(query).fetchone()[0]
        except psycopg.Error:
            return 0

    with RunningReceiver() as receiver:
        procs = [
            start("worker", ["worker"], logs["worker"]),
            start("postgres-exporter", ["export", "postgres"], logs["postgres"], GOOSE_INGEST_POSTGRES_DSN=pg_dsn),
            start("otlp-exporter", ["export", "otlp"], logs["otlp"], OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint,
                  GOOSE_INGEST_SWEEP_INTERVAL_S="0.5"),
        ]
        try:
            wait_until(lambda: "acl/exported" in _runs_ended(b), timeout=60)
            wait_until(lambda: rows() == 1, timeout=60)
            wait_until(lambda: any(s.name.startswith("invoke_agent") for s in receiver.spans), timeout=60)
            # A poison event (PostgreSQL refuses a \u0000 in text, 22P05) lands on the topic as a worker
            # would commit it, then a good run after it: the sink dead-letters the poison into its own
            # stream under its own user, and what follows it still arrives (finding 1 of issue 20).
            admin = b.client("admin")
            layout = b.settings.layout
            poison = {"eventId": "acl/poison:0", "runId": "acl/poison", "seq": 0, "type": "agent",
                      "timestamp": "2026-11-30T10:00:00.000Z", "lines": [0, 0], "message": "nul \u0000 here"}
            admin.xadd(layout.events_partition(layout.shard_of("acl/poison")),
                       {"eventId": "acl/poison:0", "runId": "acl/poison", "seq": "0", "type": "agent",
                        "data": orjson.dumps(poison)})
            after = b.cli("tap", "publish", "--run", "acl/after-poison", str(TRANSCRIPTS[1]))
            assert after.returncode == 0, after.stderr

            def after_rows() -> int:
                try:
                    with psycopg.connect(pg_dsn, connect_timeout=3) as conn:
                        query = "SELECT count(*) FROM runs WHERE run_key = 'acl/after-poison' AND state = 'ended'"
                        return conn.execute(query).fetchone()[0]
                except psycopg.Error:
                    return 0

            wait_until(lambda: after_rows() == 1, timeout=60)
            dead = [f for s in layout.export_deadletter_partitions("postgres") for _, f in admin.xrange(s)]
            assert [(f[b"reason"], f[b"raw.eventId"]) for f in dead] == [(b"postgres-rejected", b"acl/poison:0")]
            assert b"22P05" in dead[0][b"detail"]
            assert all(admin.xlen(s) == 0 for s in layout.deadletter_partitions())  # not the workers' stream
            assert procs[1].poll() is None, "the sink stopped on the poison event"
        finally:
            for proc in procs:
                stop(proc)
    text = {name: log.read_text(errors="replace") for name, log in logs.items()}
    assert not any("NOPERM" in t for t in text.values()), {k: v[-2000:] for k, v in text.items()}
    denied = [(d.get("username"), d.get("object")) for d in b.denials()]
    assert denied == [], f"normal work was refused: {denied}"


def test_each_exporter_dead_letters_an_entry_past_max_deliveries_under_its_own_role(acl_broker: AclBroker, tmp_path,
                                                                                      pg_dsn):
    """The consumer skeleton's reclaim (services/streams/pending.py) under least privilege: an entry
    delivered more than MAX_DELIVERIES times is dead-lettered `max-deliveries` into each exporter's
    own stream by its own user - `export postgres` at start (its own pending entries, stable name),
    `export otlp` by its sweep (another consumer's) - and nothing is refused."""
    from contracts.topics import TopicEntry
    from services.export.postgres.sink import DEFAULT_GROUP
    from tests.support.otlp_receiver import RunningReceiver

    b = acl_broker
    admin = b.client("admin")
    layout, s = b.settings.layout, b.settings
    run = "acl/max"
    event = {"eventId": f"{run}:0", "runId": run, "seq": 0, "type": "agent", "timestamp": "2026-11-30T10:00:00.000Z",
             "lines": [0, 0], "message": "m"}
    stream = layout.events_partition(layout.shard_of(run))
    entry_id = admin.xadd(stream, TopicEntry.of_event(event).to_fields()).decode()
    for group, consumer in ((DEFAULT_GROUP, "pg-fixed"), (s.otlp_group, "otlp-gone")):
        admin.xgroup_create(stream, group, id="0")
        admin.xreadgroup(group, consumer, {stream: ">"}, count=1)
        for _ in range(s.max_deliveries):
            admin.xreadgroup(group, consumer, {stream: "0"}, count=1)
    logs = {name: tmp_path / f"{name}.log" for name in ("postgres", "otlp")}

    def start(role: str, args: list[str], log: Path, **env: str) -> subprocess.Popen:
        full = {k: v for k, v in b.env(role, GOOSE_INGEST_METRICS_PORT="0", **env).items()
                if not (k.startswith("OTEL_") and k not in env)}
        return subprocess.Popen([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=full,
                                stdout=log.open("ab"), stderr=subprocess.STDOUT)

    def letters(exporter: str) -> list[dict]:
        return [f for p in layout.export_deadletter_partitions(exporter) for _, f in admin.xrange(p)]

    with RunningReceiver() as receiver:
        procs = [
            start("postgres-exporter", ["export", "postgres", "--consumer", "pg-fixed"], logs["postgres"],
                  GOOSE_INGEST_POSTGRES_DSN=pg_dsn),
            start("otlp-exporter", ["export", "otlp"], logs["otlp"], OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint,
                  GOOSE_INGEST_SWEEP_INTERVAL_S="0.5", GOOSE_INGEST_CLAIM_IDLE_MS="500"),
        ]
        try:
            wait_until(lambda: letters("postgres") and letters("otlp"), timeout=60)
            for exporter in ("postgres", "otlp"):
                [letter] = letters(exporter)
                assert (letter[b"reason"], letter[b"sourceId"], letter[b"exporter"]) == (
                    b"max-deliveries", entry_id.encode(), exporter.encode())
            assert letters("postgres")[0][b"raw.eventId"] == f"{run}:0".encode()
            wait_until(lambda: all(g["pending"] == 0 for g in admin.xinfo_groups(stream)
                                   if g["name"].decode() in (DEFAULT_GROUP, s.otlp_group)), timeout=30)
            assert all(admin.xlen(p) == 0 for p in layout.deadletter_partitions())  # never the workers' stream
            assert all(proc.poll() is None for proc in procs)
        finally:
            for proc in procs:
                stop(proc)
    text = {name: log.read_text(errors="replace") for name, log in logs.items()}
    assert not any("NOPERM" in t or "Traceback" in t for t in text.values()), {k: v[-2000:] for k, v in text.items()}
    denied = [(d.get("username"), d.get("object")) for d in b.denials()]
    assert denied == [], f"normal work was refused: {denied}"


# --- what each role must not do ------------------------------------------------------------------
def _forbidden(ns: str) -> list[tuple[str, tuple]]:
    layout = KeyLayout(namespace=ns, shards=2)
    raw, control = layout.raw_stream(0), layout.control_stream(0)
    events, runs, dead = layout.events_partition(0), layout.runs_partition(0), layout.deadletter_partition(0)
    state, export, other = layout.run_state("r"), layout.export_state("otlp", "r"), "other-tenant:harness.events"
    wipes = [("FLUSHALL",), ("FLUSHDB",), ("SWAPDB", "0", "1"), ("CLIENT", "KILL", "ID", "999999"),
             ("SCRIPT", "FLUSH"), ("KEYS", "*"), ("CONFIG", "SET", "appendonly", "no"), ("SAVE",), ("CLIENT", "LIST"),
             ("ACL", "SETUSER", "x", "on"), ("SHUTDOWN", "NOSAVE")]
    cases: list[tuple[str, tuple]] = []
    for role in ROLE_NAMES:
        cases += [(role, cmd) for cmd in wipes]
        cases.append((role, ("XRANGE", other, "-", "+")))  # another tenant's keys
    cases += [
        ("tap", ("XADD", control, "*", "kind", "abandon", "run", "victim", "through", "0")),  # forge a control entry
        ("tap", ("XADD", events, "*", "type", "agent")),
        ("tap", ("XADD", runs, "*", "state", "ended")),
        ("tap", ("XRANGE", raw, "-", "+")),  # write-only: a tap cannot read other runs' lines
        ("tap", ("DEL", raw)),
        ("tap", ("HSET", state, "v", "9")),
        ("importer", ("XADD", control, "*", "kind", "abandon")),
        ("importer", ("HSET", state, "v", "9")),
        ("importer", ("XRANGE", raw, "-", "+")),
        # a run state holds held raw lines, unredacted: the importer asks the active-run index instead
        ("importer", ("HGETALL", state)),
        ("importer", ("HGET", state, "s")),
        ("worker", ("XGROUP", "DESTROY", raw, "goose-ingest")),
        ("worker", ("XGROUP", "SETID", raw, "goose-ingest", "$")),
        ("worker", ("HSET", export, "x", "1")),
        ("consumer", ("XGROUP", "DESTROY", events, "goose-ingest")),
        ("consumer", ("XGROUP", "SETID", events, "analytics", "0")),
        # read-only: no consumer group command, so it cannot drain an exporter's group (finding 8)
        ("consumer", ("XGROUP", "CREATE", events, "analytics", "0", "MKSTREAM")),
        ("consumer", ("XREADGROUP", "GROUP", "goose-ingest-postgres", "c", "STREAMS", events, ">")),
        ("consumer", ("XACK", events, "goose-ingest-postgres", "1-1")),
        ("consumer", ("XCLAIM", events, "goose-ingest-otlp", "c", "0", "1-1")),
        ("consumer", ("XAUTOCLAIM", events, "goose-ingest-otlp", "c", "0", "0-0")),
        ("consumer", ("XGROUP", "DELCONSUMER", events, "goose-ingest-otlp", "c")),
        ("consumer", ("XPENDING", events, "goose-ingest-otlp")),
        ("consumer", ("XADD", events, "*", "type", "agent")),
        ("consumer", ("XDEL", events, "1-1")),
        ("consumer", ("XTRIM", events, "MAXLEN", "0")),
        ("consumer", ("DEL", events)),
        ("consumer", ("XRANGE", raw, "-", "+")),
        ("consumer", ("XRANGE", dead, "-", "+")),  # dead letters hold unredacted lines
        ("consumer", ("HGET", state, "s")),  # run states hold pending text
    ]
    for i, exporter in enumerate(EXPORTERS):  # each exporter of contracts/consumers.py against the next
        other = EXPORTERS[(i + 1) % len(EXPORTERS)]
        role = exporter_role(exporter)
        cases += [
            (role, ("XADD", events, "*", "type", "agent")),
            (role, ("DEL", events)),
            (role, ("XRANGE", dead, "-", "+")),
            (role, ("XADD", dead, "*", "reason", "forged")),  # the workers' dead letters
            (role, ("XRANGE", raw, "-", "+")),
            (role, ("HGET", state, "s")),
            # the other exporter's state and dead letters: one credential cannot mark the other's roots done
            (role, ("HSET", layout.export_state(other, "r"), "done", "1")),
            (role, ("DEL", layout.export_state(other, "r"))),
            (role, ("ZADD", layout.export_open_runs(other, 0), "1", "r")),
            (role, ("HSET", layout.export_group_state(other, "g", "r"), "done", "1")),
            (role, ("ZADD", layout.export_group_open_runs(other, "g", 0), "1", "r")),
            (role, ("RENAME", layout.export_group_state(other, "g", "r"), layout.export_group_state(other, "g", "s"))),
            (role, ("XADD", layout.export_deadletter_partition(other, 0), "*", "reason", "forged")),
        ]
    cases.append((exporter_role("postgres"), ("HSET", export, "x", "1")))  # the sink keeps no state in Redis
    cases.append((exporter_role("jsonl"), ("HSET", export, "x", "1")))  # its state is its files
    cases.append((exporter_role("postgres"), ("HSET", layout.export_group_state("otlp", "g", "r"), "x", "1")))
    # the OTLP exporter moves states of its own only: not a topic into its state, nor its state over a run's
    # the archive reads the log of record and must not be able to change it (docs/archive.md)
    cases += [("archive", cmd) for cmd in (
        ("XADD", raw, "*", "run", "forged"), ("XTRIM", raw, "MAXLEN", "0"), ("XDEL", raw, "1-0"), ("DEL", control),
        ("XADD", events, "*", "type", "agent"), ("XGROUP", "DESTROY", raw, "goose-ingest"),
        ("XGROUP", "SETID", raw, "goose-ingest-archive", "$"), ("HSET", state, "v", "9"),
        ("SET", layout.shard_lease(0), "me"), ("XADD", dead, "*", "reason", "forged"), ("XRANGE", dead, "-", "+"))]
    cases.append((exporter_role("otlp"), ("RENAME", events, layout.export_group_state("otlp", "g", "r"))))
    cases.append((exporter_role("otlp"), ("RENAME", layout.export_group_state("otlp", "g", "r"), state)))
    return cases


def test_forbidden_commands_fail_with_noperm(acl_broker: AclBroker):
    b = acl_broker
    b.root().config_set("acllog-max-len", ACL_LOG_READ)  # every role's refusals, not the last 128
    allowed = []
    for role, command in _forbidden(b.settings.namespace):
        client = b.client(role)
        try:
            client.execute_command(*command)
        except redis.exceptions.NoPermissionError:
            continue
        except redis.ResponseError as exc:  # refused for another reason: the role was allowed to run it
            allowed.append((role, command, str(exc)))
        else:
            allowed.append((role, command, "ok"))
        finally:
            client.close()
    assert allowed == []
    assert b.client("admin").ping()  # nothing above took the server down
    # the refusals are in the ACL LOG: an empty log in the tests above means nothing was refused
    assert {d["username"] for d in b.denials()} == {b.user(role) for role in ROLE_NAMES}


def test_what_each_role_needs_beyond_the_commands_is_allowed(acl_broker: AclBroker):
    b = acl_broker
    layout = b.settings.layout
    otlp = b.client("otlp-exporter")
    assert otlp.hset(layout.export_state("otlp", "r1"), "root", "abc") == 1
    assert otlp.delete(layout.export_state("otlp", "r1")) == 1
    assert otlp.zadd(layout.export_open_runs("otlp", 0), {"r1": 1}) == 1
    # its state per group, and the adoption of the state from before (RENAME between the two)
    assert otlp.hset(layout.export_state("otlp", "r2"), "n", "1") == 1
    assert otlp.rename(layout.export_state("otlp", "r2"), layout.export_group_state("otlp", "a:{g}", "r2"))
    assert otlp.zadd(layout.export_group_open_runs("otlp", "a:{g}", 1), {"r2": 1}) == 1
    assert otlp.delete(layout.export_group_state("otlp", "a:{g}", "r2")) == 1
    assert otlp.xadd(layout.export_deadletter_partition("otlp", 0), {"reason": "rejected"})
    sink = b.client("postgres-exporter")
    assert sink.xadd(layout.export_deadletter_partition("postgres", 1), {"reason": "rejected"})
    jsonl = b.client("jsonl-exporter")
    assert jsonl.xadd(layout.export_deadletter_partition("jsonl", 1), {"reason": "rejected"})
    for exporter in (otlp, sink, jsonl):
        with pytest.raises(redis.exceptions.NoPermissionError):  # the workers' dead letters are not its to write
            exporter.xadd(layout.deadletter_partition(0), {"reason": "forged"})
    admin = b.client("admin")
    admin.xgroup_create(layout.events_partition(0), "repair", id="0", mkstream=True)
    assert admin.xgroup_setid(layout.events_partition(0), "repair", "$")  # operators may rewind groups
    tap = b.client("tap")
    assert tap.xadd(layout.raw_stream(1), {"run": "x", "seq": "0", "kind": "line", "stream": "stdout", "line": "{}"})


def test_cluster_layout_names_get_the_same_permissions(acl_broker: AclBroker):
    """One file serves both layouts: ACL DRYRUN of each role's writes on the cluster names ({s<i>} tags)."""
    b = acl_broker
    layout = KeyLayout(namespace=b.settings.namespace, shards=4, cluster=True)
    root = b.root()

    def allowed(role: str, *command: str) -> bool:
        reply = root.execute_command("ACL", "DRYRUN", b.user(role), *command)
        return reply in (b"OK", "OK")

    for s in range(layout.shards):
        raw, control = layout.raw_stream(s), layout.control_stream(s)
        events, typed, runs = layout.events_partition(s), layout.type_partition("error", s), layout.runs_partition(s)
        dead, state, active = layout.deadletter_partition(s), layout.run_state(f"r{s}"), layout.active_runs(s)
        assert "{s" in raw and "{s" in events
        assert allowed("tap", "XADD", raw, "*", "f", "v")
        assert not allowed("tap", "XADD", control, "*", "kind", "abandon")
        assert allowed("worker", "XREADGROUP", "GROUP", "g", "c", "STREAMS", raw, ">")
        assert allowed("worker", "XADD", control, "*", "kind", "abandon")
        for topic in (events, typed, runs, dead):
            assert allowed("worker", "XADD", topic, "*", "f", "v")
            assert not allowed("tap", "XADD", topic, "*", "f", "v")
        assert allowed("worker", "HSET", state, "v", "1") and allowed("worker", "ZADD", active, "1", "r")
        for topic in (events, typed, runs):
            assert allowed("consumer", "XREAD", "STREAMS", topic, "0")
            assert not allowed("consumer", "XREADGROUP", "GROUP", "g", "c", "STREAMS", topic, ">")
            assert not allowed("consumer", "XADD", topic, "*", "f", "v")
            for role in map(exporter_role, EXPORTERS):
                assert allowed(role, "XREADGROUP", "GROUP", "g", "c", "STREAMS", topic, ">")
        assert not allowed("consumer", "XRANGE", dead, "-", "+")
        assert allowed("otlp-exporter", "HSET", layout.export_state("otlp", f"r{s}"), "k", "v")
        assert not allowed("postgres-exporter", "HSET", layout.export_state("otlp", f"r{s}"), "k", "v")
        assert allowed("otlp-exporter", "XADD", layout.export_deadletter_partition("otlp", s), "*", "f", "v")
        assert allowed("postgres-exporter", "XADD", layout.export_deadletter_partition("postgres", s), "*", "f", "v")
        assert not allowed("postgres-exporter", "XADD", layout.export_deadletter_partition("otlp", s), "*", "f", "v")
        assert not allowed("otlp-exporter", "XADD", layout.export_deadletter_partition("postgres", s), "*", "f", "v")
        for exporter in EXPORTERS:  # its own dead letters, nobody else's (contracts/consumers.py)
            role = exporter_role(exporter)
            assert not allowed(role, "XADD", dead, "*", "f", "v")
            for other in EXPORTERS:
                stream = layout.export_deadletter_partition(other, s)
                assert allowed(role, "XADD", stream, "*", "f", "v") == (other == exporter), (role, stream)
        assert allowed("otlp-exporter", "ZADD", layout.export_open_runs("otlp", s), "1", "r")
        assert allowed("otlp-exporter", "HSET", layout.export_group_state("otlp", "g", f"r{s}"), "k", "v")
        assert allowed("otlp-exporter", "ZADD", layout.export_group_open_runs("otlp", "g", s), "1", "r")
        assert not allowed("postgres-exporter", "HSET", layout.export_group_state("otlp", "g", f"r{s}"), "k", "v")
        assert allowed("importer", "HSET", layout.import_checkpoint(f"ns/r{s}"), "k", "v")
        assert not allowed("importer", "HGET", state, "s") and not allowed("importer", "HSET", state, "s", "x")
        assert allowed("importer", "ZSCORE", active, f"r{s}") and not allowed("importer", "ZADD", active, "1", "r")


# --- a command under the wrong role: one line, exit 2 --------------------------------------------
@pytest.mark.parametrize("role,command", [
    ("tap", ["tail", "--no-follow"]),
    ("consumer", ["replay"]),
    ("tap", ["worker"]),
    ("tap", ["import-sessions", "sessions.db", "--namespace", "wrongrole"]),
    ("consumer", ["tap", "--run", "acl/wrong-role", "--", "true"]),  # not started, nothing spooled
    ("consumer", ["publish", "--run", "acl/wrong-role", "lines.jsonl"]),  # stream lines: publish reads, then meets NOPERM
])
def test_a_command_under_a_role_without_its_permissions_is_one_line(acl_broker: AclBroker, role, command,
                                                                    fixture_db):
    lines = fixture_db.parent / "lines.jsonl"
    lines.write_text('{"type":"message","message":{"role":"assistant","content":[]}}\n')
    command = [str(fixture_db) if part == "sessions.db" else str(lines) if part == "lines.jsonl" else part
               for part in command]
    out = acl_broker.cli(role, *command, GOOSE_INGEST_METRICS_PORT="0")
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    # the worker may have logged its start before it met the refusal; the refusal itself is one line
    errors = [line for line in out.stderr.splitlines() if line.startswith(f"goose-ingest {command[0]}: ")]
    assert len(errors) == 1 and "NOPERM" in errors[0], out.stderr[-2000:]
    assert out.stdout == ""
    assert not (Path(acl_broker.settings.spool_dir) / "acl").exists()
    assert all(acl_broker.root().xlen(s) == 0 for s in acl_broker.settings.layout.raw_streams())
    assert acl_broker.passwords[role] not in out.stderr


@pytest.mark.parametrize("role,command", [
    ("consumer", ["tail", "--no-follow"]),
    ("worker", ["worker"]),  # waiting for the broker would not fix a password
    ("tap", ["tap", "--run", "acl/wrong-pw", "--", "true"]),  # nothing spooled that could never be delivered
    ("tap", ["publish", "--run", "acl/wrong-pw"]),
    ("importer", ["import-sessions", "sessions.db", "--namespace", "wrongpw"]),
])
def test_a_wrong_password_is_one_line_naming_the_settings(acl_broker: AclBroker, role, command, fixture_db):
    b = acl_broker
    lines = fixture_db.parent / "lines.jsonl"
    lines.write_text('{"type":"message","message":{"role":"assistant","content":[]}}\n')
    command = [str(fixture_db) if part == "sessions.db" else str(lines) if part == "lines.jsonl" else part
               for part in command]
    env = b.env(role, GOOSE_INGEST_REDIS_PASSWORD="not-the-password", GOOSE_INGEST_METRICS_PORT="0")
    out = subprocess.run([sys.executable, "-m", "services.cli", *command], cwd=REPO, env=env, input="",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "not-the-password" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith(f"goose-ingest {command[0]}: ")]
    assert len(errors) == 1 and "GOOSE_INGEST_REDIS_PASSWORD" in errors[0], out.stderr
    assert not (Path(b.settings.spool_dir) / "acl").exists()

