"""TLS to the broker (issue 22 part 4): every command, as a real subprocess, against a real
``redis-server --tls-port`` with a throw-away CA (tests/support/tls.py).

Two servers for the whole module: one that requires client certificates (``--tls-auth-clients
yes``; the full pipeline runs against it, so every client also presents a certificate) and one
that does not (``rediss://`` alone, ``GOOSE_INGEST_REDIS_TLS=true``, the failure lines).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest
import redis

from services.broker.embedded import EmbeddedRedis
from services.broker.url import BrokerTLSError, TlsOptions, parse_broker_url, tls_options
from services.settings import Settings
from tests.support import postgres as pg_support
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.needs import missing
from tests.support.pipeline import stop, wait_until
from tests.support.redis_server import cli_env
from tests.support.tls import TlsFiles, make_tls_files, start_tls_redis, untrusted_server_cert

pytestmark = pytest.mark.e2e

pg_database = pg_support.pg_database
pg_dsn = pg_support.pg_dsn


@dataclass
class TlsBroker:
    server: EmbeddedRedis
    tls_port: int
    files: TlsFiles

    def plain(self) -> redis.Redis:
        """The server's plain port: how the tests look at what a command wrote."""
        return redis.Redis(port=self.server.port, socket_timeout=10)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_broker(tls_files: TlsFiles, tmp_path_factory) -> Iterator[TlsBroker]:
    """Client certificates not required."""
    server, port = start_tls_redis(tmp_path_factory.mktemp("tls-redis"), tls_files, auth_clients="no")
    try:
        yield TlsBroker(server, port, tls_files)
    finally:
        server.close()


@pytest.fixture(scope="module")
def mtls_broker(tls_files: TlsFiles, tmp_path_factory) -> Iterator[TlsBroker]:
    """Client certificates required."""
    server, port = start_tls_redis(tmp_path_factory.mktemp("mtls-redis"), tls_files, auth_clients="yes")
    try:
        yield TlsBroker(server, port, tls_files)
    finally:
        server.close()


def _settings(url: str, tmp_path: Path) -> Settings:
    return Settings(redis_url=url, namespace=f"tls{uuid4().hex[:8]}", shards=2,
                    spool_dir=str(tmp_path / "spool"), host_label="tls-host")


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = cli_env(settings, GOOSE_INGEST_METRICS_PORT="0", **extra)
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):  # only where a test sets them
        if name not in extra:
            env.pop(name, None)
    return {k: v for k, v in env.items() if not k.startswith("OTEL_") or k in extra}


def _cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _cli_all(runs: dict[str, tuple[dict[str, str], list[str]]], timeout: float = 90) -> dict[str, subprocess.CompletedProcess]:
    """Run several commands at once (each its env and args); their results by name."""
    procs = {name: subprocess.Popen([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (env, args) in runs.items()}
    results: dict[str, subprocess.CompletedProcess] = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            results[name] = subprocess.CompletedProcess(runs[name][1], proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _start(env: dict[str, str], args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _ended(client: redis.Redis, settings: Settings) -> set[str]:
    return {f[b"runId"].decode() for s in settings.layout.runs_partitions() for _, f in client.xrange(s)
            if f[b"state"] in (b"ended", b"abandoned")}


def _one_line(res: subprocess.CompletedProcess, command: str, *needles: str) -> str:
    """The command failed as a configuration error: exit 2, one line on stderr naming every needle."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert lines[0].startswith(f"goose-ingest {command}: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _run_the_consumers(env: dict[str, str], settings: Settings, reader: redis.Redis, runs: set[str], pg_dsn: str,
                       logs_dir: Path, *, imported: str | None = None) -> None:
    """The worker, `export postgres` and `export otlp` (a real receiver), one process each, side by side:
    each becomes ready and does its job on the published runs (ended in the runs topic, rows in
    PostgreSQL, an agent span at the receiver), with no traceback. `reader` looks at the topics."""
    import psycopg

    from tests.support.otlp_receiver import RunningReceiver

    def rows() -> int:
        try:
            with psycopg.connect(pg_dsn, connect_timeout=3) as conn:
                query = "SELECT count(*) FROM runs WHERE run_key = ANY(%s) AND state = 'ended'"
                return conn.execute(query, (sorted(runs),)).fetchone()[0]
        except psycopg.Error:
            return 0

    logs = {name: logs_dir / f"{name}.log" for name in ("worker", "postgres", "otlp")}
    with RunningReceiver() as receiver:
        procs = [
            _start(env, ["worker"], logs["worker"]),
            _start({**env, "GOOSE_INGEST_POSTGRES_DSN": pg_dsn}, ["export", "postgres"], logs["postgres"]),
            _start({**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint, "GOOSE_INGEST_SWEEP_INTERVAL_S": "0.5"},
                   ["export", "otlp"], logs["otlp"]),
        ]
        try:
            wait_until(lambda: runs <= _ended(reader, settings)
                       and (imported is None or any(r.startswith(imported) for r in _ended(reader, settings))), timeout=90)
            wait_until(lambda: rows() == len(runs), timeout=60)
            wait_until(lambda: any(s.name.startswith("invoke_agent") for s in receiver.spans), timeout=60)
            assert all(p.poll() is None for p in procs), {k: v.read_text()[-2000:] for k, v in logs.items()}
        finally:
            for proc in procs:
                stop(proc)
    text = {name: log.read_text(errors="replace") for name, log in logs.items()}
    assert not any("Traceback" in t for t in text.values()), {k: v[-3000:] for k, v in text.items()}


# --- every command over TLS, with a CA file and client certificates ---------------------------------------
def test_every_command_works_over_tls_with_client_certificates(mtls_broker: TlsBroker, tmp_path, fixture_db, pg_dsn):
    """tap, publish, import-sessions (redis-py sync), worker (redis.asyncio + FastStream's RedisBroker),
    export postgres, export otlp, tail and replay, all through `rediss://` with a CA file and a client
    certificate the server requires."""
    b = mtls_broker
    settings = _settings(f"rediss://localhost:{b.tls_port}/0", tmp_path)
    env = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(b.files.ca),
               GOOSE_INGEST_REDIS_TLS_CERT_FILE=str(b.files.client_cert),
               GOOSE_INGEST_REDIS_TLS_KEY_FILE=str(b.files.client_key))
    producers = _cli_all({
        "tap": (env, ["tap", "--run", "tls/tapped", "--quiet", "--", "cat", str(TRANSCRIPTS[0])]),
        "publish": (env, ["publish", "--run", "tls/published", str(TRANSCRIPTS[1])]),
        "import-sessions": (env, ["import-sessions", str(fixture_db), "--namespace", "tlsimport", "--no-progress"]),
    })
    for name, res in producers.items():
        assert res.returncode == 0, (name, res.stderr[-3000:])

    _run_the_consumers(env, settings, b.plain(), {"tls/tapped", "tls/published"}, pg_dsn, tmp_path, imported="tlsimport/")

    readers = _cli_all({"tail": (env, ["tail", "--no-follow", "--run", "tls/published"]),
                        "replay": (env, ["replay", "--run", "tls/published"])})
    tail, replay = readers["tail"], readers["replay"]
    assert tail.returncode == 0, tail.stderr[-3000:]
    assert "RUN ENDED" in tail.stdout and "tls/published#0" in tail.stdout
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]


def test_a_broker_requiring_client_certificates_refuses_none_in_one_line(mtls_broker: TlsBroker, tmp_path, pg_dsn):
    b = mtls_broker
    settings = _settings(f"rediss://localhost:{b.tls_port}/0", tmp_path)
    env = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(b.files.ca), GOOSE_INGEST_POSTGRES_DSN=pg_dsn)
    results = _cli_all({"tail": (env, ["tail", "--no-follow"]),
                        "publish": (env, ["publish", "--run", "tls/no-cert", str(TRANSCRIPTS[0])]),
                        "worker": (env, ["worker"]),
                        "export otlp": (env, ["export", "otlp"]),
                        "export postgres": (env, ["export", "postgres"])})
    for name, res in results.items():
        _one_line(res, name.split()[0], "client certificate", "GOOSE_INGEST_REDIS_TLS_CERT_FILE", f"localhost:{b.tls_port}")


# --- the other ways to turn TLS on ---------------------------------------------------------------------------
def test_redis_tls_true_with_a_redis_url_and_a_ca_file(tls_broker: TlsBroker, tmp_path, pg_dsn):
    """publish, tail and replay; then the worker and both exporters process the run."""
    b = tls_broker
    settings = _settings(f"redis://localhost:{b.tls_port}/0", tmp_path)
    env = _env(settings, GOOSE_INGEST_REDIS_TLS="true", GOOSE_INGEST_REDIS_TLS_CA_FILE=str(b.files.ca))
    published = _cli(env, "publish", "--run", "tls/flag", str(TRANSCRIPTS[0]))
    assert published.returncode == 0, published.stderr[-3000:]
    readers = _cli_all({"tail": (env, ["tail", "--no-follow", "--json"]), "replay": (env, ["replay"])})
    tail, replay = readers["tail"], readers["replay"]
    assert tail.returncode == 0 and tail.stdout == "", tail.stderr[-3000:]  # nothing processed: empty topics, read over TLS
    # no worker ran: the rebuilt run differs from the (absent) events, exit 1
    assert "replay: 1 run rebuilt from the raw log" in replay.stdout, replay.stdout + replay.stderr[-3000:]
    raw = [f for s in settings.layout.raw_streams() for _, f in b.plain().xrange(s)]
    assert raw and {f[b"run"] for f in raw} == {b"tls/flag"}
    _run_the_consumers(env, settings, b.plain(), {"tls/flag"}, pg_dsn, tmp_path)


def test_rediss_alone_trusts_the_ca_given_by_ssl_cert_file(tls_broker: TlsBroker, tmp_path, pg_dsn):
    """No GOOSE_INGEST_REDIS_TLS_* at all: the system's trust store decides (here OpenSSL's SSL_CERT_FILE),
    for the tap's own client and redis-py's alike; the worker (redis.asyncio, FastStream) and both
    exporters then process the run."""
    b = tls_broker
    settings = _settings(f"rediss://localhost:{b.tls_port}/0", tmp_path)
    env = _env(settings, SSL_CERT_FILE=str(b.files.ca))
    results = _cli_all({"publish": (env, ["publish", "--run", "tls/alone", str(TRANSCRIPTS[0])]),
                        "tail": (env, ["tail", "--no-follow", "--json"]),
                        "untrusted": (_env(settings), ["tail", "--no-follow"])})  # the same URL without SSL_CERT_FILE
    assert results["publish"].returncode == 0, results["publish"].stderr[-3000:]
    assert results["tail"].returncode == 0, results["tail"].stderr[-3000:]
    assert b.plain().exists(settings.layout.meta())  # the tap recorded the deployment facts over TLS
    _one_line(results["untrusted"], "tail", "certificate does not verify", "GOOSE_INGEST_REDIS_TLS_CA_FILE")
    _run_the_consumers(env, settings, b.plain(), {"tls/alone"}, pg_dsn, tmp_path)


# --- failures: one line, exit 2 -------------------------------------------------------------------------------
WRONG_CA_COMMANDS: dict[str, list[str]] = {  # every command that talks to the broker, by its name on stderr
    "tail": ["tail", "--no-follow"],
    "replay": ["replay"],
    "publish": ["publish", "--run", "tls/wrong-ca", str(TRANSCRIPTS[0])],
    "tap": ["tap", "--run", "tls/wrong-ca-tap", "--quiet", "--", "true"],
    "import-sessions": ["import-sessions", "SESSIONS_DB", "--namespace", "tlsimport", "--no-progress"],
    "worker": ["worker"],
    "export otlp": ["export", "otlp"],
    "export postgres": ["export", "postgres"],
}


def test_a_wrong_ca_is_one_line_for_every_command(tls_broker: TlsBroker, tmp_path, fixture_db, pg_dsn):
    """export postgres gets a reachable database, so the line it prints is the broker's TLS failure."""
    b = tls_broker
    settings = _settings(f"rediss://localhost:{b.tls_port}/0", tmp_path)
    env = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(b.files.other_ca), GOOSE_INGEST_POSTGRES_DSN=pg_dsn)
    results = _cli_all({name: (env, [str(fixture_db) if a == "SESSIONS_DB" else a for a in args])
                         for name, args in WRONG_CA_COMMANDS.items()})
    for name, res in results.items():
        _one_line(res, name.split()[0], f"TLS to the broker localhost:{b.tls_port} failed", "certificate does not verify",
                  "GOOSE_INGEST_REDIS_TLS_CA_FILE")
    assert not b.plain().exists(settings.layout.meta())  # nothing was written


def test_a_server_that_does_not_speak_tls_is_one_line(tls_broker: TlsBroker, tmp_path):
    """rediss:// to the plain port: the plain server never answers a ClientHello; after the connect
    timeout (5 s; asyncio: its handshake timeout, 4 s) that is one line, not a wait or a hang."""
    b = tls_broker
    settings = _settings(f"rediss://localhost:{b.server.port}/0", tmp_path)
    env = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(b.files.ca))
    started = time.monotonic()
    results = _cli_all({"tail": (env, ["tail", "--no-follow"]),  # redis-py sync
                        "publish": (env, ["publish", "--run", "tls/plain", str(TRANSCRIPTS[0])]),  # the tap's client
                        "worker": (env, ["worker"])})  # redis.asyncio
    for name, res in results.items():
        _one_line(res, name, f"TLS to the broker localhost:{b.server.port} failed", "TLS port")
    assert time.monotonic() - started < 40


def test_unreadable_tls_files_are_one_line_before_connecting(tls_files: TlsFiles, tmp_path):
    """Checked when the target is parsed (the CLI's settings check does that first), naming the variable;
    the CLI prints any BrokerConfigError as one line, exit 2 (the subprocess tests above)."""
    from services.broker.url import target

    base = Settings(redis_url="rediss://localhost:1/0")
    cases = [
        ({"redis_tls_ca_file": str(tmp_path / "missing.pem")}, "GOOSE_INGEST_REDIS_TLS_CA_FILE .*missing.pem: no such file"),
        ({"redis_tls_ca_file": str(tls_files.client_key)}, "GOOSE_INGEST_REDIS_TLS_CA_FILE"),  # a key, not a CA
        ({"redis_tls_cert_file": str(tls_files.client_cert), "redis_tls_key_file": str(tls_files.server_key)},
         "GOOSE_INGEST_REDIS_TLS_CERT_FILE / GOOSE_INGEST_REDIS_TLS_KEY_FILE .*do not load"),
        ({"redis_tls_key_file": str(tls_files.client_key)}, "GOOSE_INGEST_REDIS_TLS_KEY_FILE is set without"),
    ]
    for update, message in cases:
        with pytest.raises(BrokerTLSError, match=message):
            target(base.model_copy(update=update))
    # not TLS: the files are not looked at (a plain URL with a stale CA variable still works)
    assert target(Settings(redis_url="redis://localhost:1/0", redis_tls_ca_file=str(tmp_path / "missing.pem"))).tls is False


# --- the one source of TLS options ---------------------------------------------------------------------------
def test_every_client_kind_gets_the_same_tls_options(tls_files: TlsFiles):
    from redis.asyncio.connection import SSLConnection as AsyncSSLConnection

    from services.broker.connect import AsyncTLSConnection, TLSConnection, connection_kwargs, single_node_kwargs, target

    s = Settings(redis_url="rediss://h:6380/0", redis_tls_ca_file=str(tls_files.ca),
                 redis_tls_cert_file=str(tls_files.client_cert), redis_tls_key_file=str(tls_files.client_key))
    wanted = {"ssl_ca_certs": str(tls_files.ca), "ssl_certfile": str(tls_files.client_cert),
              "ssl_keyfile": str(tls_files.client_key), "ssl_cert_reqs": "required", "ssl_check_hostname": True}
    assert tls_options(s).redis_kwargs() == wanted
    sync = single_node_kwargs(s, target(s), asyncio=False)
    assert sync["connection_class"] is TLSConnection and "ssl" not in sync and wanted.items() <= sync.items()
    faststream = connection_kwargs(s)  # what make_broker gives RedisBroker
    assert faststream["connection_class"] is AsyncTLSConnection and issubclass(AsyncTLSConnection, AsyncSSLConnection)
    cluster = connection_kwargs(s.model_copy(update={"redis_cluster": True}))
    assert cluster["ssl"] is True and "connection_class" not in cluster and wanted.items() <= cluster.items()
    assert connection_kwargs(Settings(redis_url="redis://h:6379/0")) == {}
    # a unix socket is local: GOOSE_INGEST_REDIS_TLS does not apply to it
    assert parse_broker_url("unix:///tmp/r.sock", cluster=False, tls=True).tls is False
    assert TlsOptions().redis_kwargs() == {"ssl_cert_reqs": "required", "ssl_check_hostname": True}


def test_the_faststream_broker_connects_over_tls(tls_broker: TlsBroker):
    """The worker's FastStream RedisBroker, built by make_broker from the settings, talks TLS (its
    constructor used to fail on 'ssl'); then a wrong CA is the same one line from it too."""
    import asyncio

    from services.broker.cluster import make_broker

    b = tls_broker
    s = Settings(redis_url=f"rediss://localhost:{b.tls_port}/0", redis_tls_ca_file=str(b.files.ca))

    async def ping(settings: Settings) -> object:
        broker = make_broker(settings)
        try:
            client = await broker.connect()
            return await client.ping()
        finally:
            await broker.stop()

    assert asyncio.run(ping(s)) is True
    with pytest.raises(BrokerTLSError, match="certificate does not verify"):
        asyncio.run(ping(s.model_copy(update={"redis_tls_ca_file": str(b.files.other_ca)})))


def test_the_taps_own_client_verifies_the_server_with_the_ca_file(tls_broker: TlsBroker):
    """Moved from tests/tap/test_tap_conn.py: the tap's RespConnection, with and without the CA."""
    from services.tap.conn import RespConnection

    b = tls_broker
    target = parse_broker_url(f"rediss://localhost:{b.tls_port}/0", cluster=False)
    trusted = RespConnection(target, connect_timeout=5, socket_timeout=5, tls=TlsOptions(ca_file=str(b.files.ca)))
    try:
        assert trusted.execute("PING") == b"PONG"
    finally:
        trusted.close()
    unverified = RespConnection(target, connect_timeout=5, socket_timeout=5)
    with pytest.raises(BrokerTLSError, match="certificate does not verify"):
        unverified.execute("PING")


# --- a Redis Cluster that speaks only TLS ----------------------------------------------------------------------
def test_a_tls_cluster_requiring_client_certificates_serves_every_command(tls_files: TlsFiles, tmp_path, fixture_db,
                                                                           pg_dsn):
    """A Redis Cluster that speaks only TLS and requires client certificates (``--tls-auth-clients yes``):
    redis-py's sync and asyncio RedisCluster, FastStream's RedisClusterBroker and the tap's own cluster
    client. tap, publish and import-sessions write, a worker processes, both exporters export (a real
    OTLP receiver, a real PostgreSQL), tail and replay read back; a wrong CA is one line for every
    command. The commands of each step run side by side (the machine has 2 cores)."""
    from services.broker.connect import sync_client
    from tests.support.redis_cluster import ClusterUnavailable
    from tests.support.tls import start_tls_cluster, stop_nodes

    try:
        nodes = start_tls_cluster(tmp_path / "tls-cluster", tls_files, auth_clients="yes")
    except (ClusterUnavailable, OSError) as exc:
        missing("a local TLS Redis Cluster", f"redis-server with TLS and redis-cli on the PATH; {exc}")
    try:
        seeds = ",".join(f"127.0.0.1:{port}" for _, port in nodes[:2])
        settings = Settings(redis_url=f"rediss://{seeds}", redis_cluster=True, namespace=f"tlsc{uuid4().hex[:6]}",
                            shards=4, spool_dir=str(tmp_path / "spool"), host_label="tls-host")
        certs = {"GOOSE_INGEST_REDIS_TLS_CERT_FILE": str(tls_files.client_cert),
                 "GOOSE_INGEST_REDIS_TLS_KEY_FILE": str(tls_files.client_key)}
        env = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(tls_files.ca), **certs)
        wrong = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(tls_files.other_ca), **certs,
                     GOOSE_INGEST_POSTGRES_DSN=pg_dsn)  # a reachable database: the broker's failure is what it prints
        first = _cli_all({
            **{f"wrong {name}": (wrong, [str(fixture_db) if a == "SESSIONS_DB" else a for a in args])
               for name, args in WRONG_CA_COMMANDS.items()},
            "publish": (env, ["publish", "--run", "tls/cluster", str(TRANSCRIPTS[0])]),
            "tap": (env, ["tap", "--run", "tls/cluster-tap", "--quiet", "--", "cat", str(TRANSCRIPTS[1])]),
            "import-sessions": (env, ["import-sessions", str(fixture_db), "--namespace", "tlscimport", "--no-progress"]),
        })
        for name in WRONG_CA_COMMANDS:
            _one_line(first[f"wrong {name}"], name.split()[0], "certificate does not verify", "GOOSE_INGEST_REDIS_TLS_CA_FILE")
        for name in ("publish", "tap", "import-sessions"):
            assert first[name].returncode == 0, (name, first[name].stderr[-3000:])

        client = sync_client(settings.model_copy(update={"redis_tls_ca_file": str(tls_files.ca),
                                                         "redis_tls_cert_file": str(tls_files.client_cert),
                                                         "redis_tls_key_file": str(tls_files.client_key)}))

        _run_the_consumers(env, settings, client, {"tls/cluster", "tls/cluster-tap"}, pg_dsn, tmp_path,
                           imported="tlscimport/")

        readers = _cli_all({"tail": (env, ["tail", "--no-follow", "--run", "tls/cluster"]),
                            "replay": (env, ["replay", "--run", "tls/cluster"])})
        tail, replay = readers["tail"], readers["replay"]
        assert tail.returncode == 0 and "RUN ENDED" in tail.stdout, tail.stderr[-3000:]
        assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]
    finally:
        stop_nodes(nodes)


def test_a_running_tap_spools_and_retries_through_a_tls_failure(tls_broker: TlsBroker, tmp_path, caplog):
    """Mid-run (past the start check) a certificate that does not verify is an outage for the tap:
    the sender keeps retrying with the reason logged, nothing is lost, and a publisher that trusts the
    CA later delivers the spooled run."""
    import logging

    from services.tap.publisher import Publisher

    b = tls_broker
    settings = _settings(f"rediss://localhost:{b.tls_port}/0", tmp_path)
    untrusting = settings.model_copy(update={"redis_tls_ca_file": str(b.files.other_ca)})
    spool = tmp_path / "run-spool"
    with caplog.at_level(logging.WARNING, logger="goose_ingest"):
        pub = Publisher(untrusting, "tls/mid-run", {"host": "h"}, spool_dir=str(spool))
        try:
            pub.add_line(b"kept while TLS fails")
            assert pub.flush(timeout=1.5) is False  # not delivered, and
            assert pub.sender_alive  # the sender did not die on the TLS error
        finally:
            pub.close(timeout=0.5)
    messages = [r.getMessage() for r in caplog.records]
    assert any("certificate does not verify" in m for m in messages), messages
    assert not any(r.exc_info for r in caplog.records)  # no traceback logged
    with Publisher(settings.model_copy(update={"redis_tls_ca_file": str(b.files.ca)}), "tls/mid-run", {"host": "h"},
                   spool_dir=str(spool)) as resumed:
        resumed.add_eof(0)
    lines = [f.get(b"line") for s in settings.layout.raw_streams() for _, f in b.plain().xrange(s)]
    assert lines == [b"kept while TLS fails", None]


def test_export_postgres_waits_out_a_certificate_it_does_not_trust_mid_run(tls_files: TlsFiles, tmp_path, pg_dsn):
    """The broker's certificate is rotated mid-run to one signed by a CA the sink does not trust (and
    its connections dropped, as a restart would): the sink stays up, /readyz says 503 with the TLS
    failure as its reason, and once the trusted certificate is back it exports what was written
    meanwhile: every event once, nothing lost, nothing doubled, nothing left pending."""
    import psycopg

    from services.export.postgres.sink import DEFAULT_GROUP
    from tests.export.test_export_postgres_live import add_run, metrics_port

    server, tls_port = start_tls_redis(tmp_path / "rotating-redis", tls_files)
    bad_cert, bad_key = untrusted_server_cert(tls_files, tmp_path / "rotated")
    plain = redis.Redis(port=server.port, socket_timeout=10)
    settings = _settings(f"rediss://localhost:{tls_port}/0", tmp_path)
    env = _env(settings, GOOSE_INGEST_REDIS_TLS_CA_FILE=str(tls_files.ca), GOOSE_INGEST_POSTGRES_DSN=pg_dsn)
    log = tmp_path / "sink.log"

    def readyz() -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def event_ids() -> list[str]:
        try:
            with psycopg.connect(pg_dsn, connect_timeout=3) as conn:
                return [row[0] for row in conn.execute("SELECT event_id FROM events")]
        except psycopg.errors.UndefinedTable:  # before the sink's migrations ran
            return []

    def pending() -> int:
        streams = settings.layout.events_partitions() + settings.layout.runs_partitions()
        return sum(int(g["pending"]) for s in streams for g in plain.xinfo_groups(s) if g["name"] == DEFAULT_GROUP.encode())

    add_run(plain, settings, "rotation/before", 5)
    sink = _start(env, ["export", "postgres"], log)
    try:
        port = metrics_port(log)
        wait_until(lambda: readyz()[0] == 200 and len(event_ids()) == 5, timeout=60)
        # both at once: a certificate without its key is refused
        plain.execute_command("CONFIG", "SET", "tls-cert-file", str(bad_cert), "tls-key-file", str(bad_key))
        plain.client_kill_filter(_type="normal", skipme=True)  # the sink must reconnect, and meets the new certificate
        add_run(plain, settings, "rotation/during", 7)
        # first the dropped connection (an outage), then at the reconnection the certificate's reason
        wait_until(lambda: readyz()[0] == 503 and "certificate does not verify" in readyz()[1], timeout=60)
        status, body = readyz()
        assert status == 503 and "GOOSE_INGEST_REDIS_TLS_CA_FILE" in body, body  # the reason names the fix
        time.sleep(2)  # a few retries: still up, still nothing of the second run
        assert sink.poll() is None and len(event_ids()) == 5, log.read_text(errors="replace")[-3000:]
        plain.execute_command("CONFIG", "SET", "tls-cert-file", str(tls_files.server_cert),
                              "tls-key-file", str(tls_files.server_key))
        wait_until(lambda: len(event_ids()) == 12 and pending() == 0 and readyz()[0] == 200, timeout=90)
        ids = event_ids()
        assert len(ids) == len(set(ids)) == 12  # 0 lost, 0 doubled
        assert sorted(ids) == sorted([f"rotation/before:{n}" for n in range(5)] + [f"rotation/during:{n}" for n in range(7)])
    finally:
        stop(sink)
        server.close()
    text = log.read_text(errors="replace")
    assert sink.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "certificate does not verify" in text, text[-3000:]
    assert "thread failed" not in text, text[-3000:]


def test_a_close_right_after_the_handshake_is_read_as_a_missing_client_certificate_only_then():
    """The race a broker requiring client certificates leaves us (its alert, or just EOF on our first
    write): EOF right after our handshake, without a certificate of ours, is that; anything else is not."""
    import ssl

    from services.broker.url import tls_failure

    def wrapped(inner: BaseException) -> Exception:
        try:
            try:
                raise inner
            except OSError as exc:
                raise redis.ConnectionError(f"Error while writing to localhost:1: {exc}") from exc
        except redis.ConnectionError as outer:
            return outer

    eof = wrapped(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    failure = tls_failure(eof, "localhost:1", closed_after_handshake=True)
    assert failure is not None and "GOOSE_INGEST_REDIS_TLS_CERT_FILE" in str(failure)
    assert tls_failure(eof, "localhost:1") is None  # mid-run, or with a certificate: an outage, retried
    assert tls_failure(wrapped(ConnectionRefusedError(111, "refused")), "localhost:1", closed_after_handshake=True) is None
    assert tls_failure(redis.AuthenticationError("invalid username-password pair"), "h:1", closed_after_handshake=True) is None
