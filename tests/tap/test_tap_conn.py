"""The single-node tap's own connection (services/tap/conn.py) against a real redis-server, and the
tap's import chain (no redis-py, no FastStream, no redaction rules: issue 13 part 3)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from contracts.keys import shard_of
from services.broker.url import parse_broker_url
from services.tap.conn import AuthFailed, NoPermission, ReplyError, RespConnection
from services.tap.publisher import Publisher
from services.tap.spool import spool_path
from tests.support.redis_server import cli_env

ROOT = Path(__file__).resolve().parents[2]
TAP_PASSWORD = "tap-s3cret"

pytestmark = pytest.mark.timeout(120)


def conn_for(url: str, **kw) -> RespConnection:
    return RespConnection(parse_broker_url(url, cluster=False, **kw), connect_timeout=2, socket_timeout=5)


def root_client(server) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def raw_entries(client: redis.Redis, settings, run: str) -> list[dict[bytes, bytes]]:
    rows = client.xrange(settings.layout.raw_stream(shard_of(run, settings.shards)))
    return [f for _, f in rows if f.get(b"run") == run.encode()]


@pytest.fixture()
def acl_server(private_redis):
    """The private server with a user of the tap role's commands (deploy/redis/users.acl) and one without XADD."""
    root = root_client(private_redis)
    root.execute_command("ACL", "SETUSER", "tapper", "on", f">{TAP_PASSWORD}", "+ping", "+select", "+hgetall",
                         "+hsetnx", "+xadd", "+wait", "~*")
    root.execute_command("ACL", "SETUSER", "reader", "on", f">{TAP_PASSWORD}", "+ping", "+select", "+hgetall", "~*")
    root.close()
    return private_redis


def test_auth_with_an_acl_user_and_the_settings_override_the_url(acl_server):
    url = f"redis://nobody:wrong@127.0.0.1:{acl_server.port}/0"
    conn = conn_for(url, username="tapper", password=TAP_PASSWORD)
    try:
        assert conn.execute("PING") == b"PONG"
        assert conn.execute("XADD", "t:s", "*", "f", "v")
    finally:
        conn.close()


@pytest.mark.parametrize("username", ["tapper", None], ids=["acl-user", "default-user"])
def test_a_wrong_password_is_auth_failed(acl_server, username):
    conn = conn_for(f"redis://127.0.0.1:{acl_server.port}/0", username=username, password="not-the-password")
    with pytest.raises(AuthFailed):
        conn.execute("PING")
    assert conn.local_address is None  # the refused connection is not kept


def test_a_missing_permission_is_no_permission(acl_server):
    conn = conn_for(f"redis://reader:{TAP_PASSWORD}@127.0.0.1:{acl_server.port}/0")
    try:
        assert conn.execute("PING") == b"PONG"
        with pytest.raises(NoPermission):
            conn.execute("XADD", "t:s", "*", "f", "v")
        with pytest.raises(ReplyError) as info:  # any other refusal is a plain reply error
            conn.execute("NOSUCHCOMMAND")
        assert not isinstance(info.value, AuthFailed | NoPermission)
    finally:
        conn.close()


def test_select_db_from_the_url(private_redis, settings):
    s = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{private_redis.port}/3"})
    run = "conn/db3"
    with Publisher(s, run, {"host": "h"}) as pub:
        pub.add_line(b"in db 3")
        pub.add_eof(0)
    db3 = redis.Redis(port=private_redis.port, db=3)
    db0 = redis.Redis(port=private_redis.port, db=0)
    try:
        assert [f.get(b"line") for f in raw_entries(db3, s, run)] == [b"in db 3", None]
        assert raw_entries(db0, s, run) == []
    finally:
        db3.close()
        db0.close()


def test_unix_socket_url(tmp_path, settings):
    from services.broker.embedded import start_redis

    sock = tmp_path / "r.sock"
    server = start_redis(dir=str(tmp_path / "unix-redis"), extra_args=["--unixsocket", str(sock),
                                                                       "--unixsocketperm", "700"])
    try:
        s = settings.model_copy(update={"redis_url": f"unix://{sock}?db=2"})
        run = "conn/unix"
        with Publisher(s, run, {"host": "h"}) as pub:
            pub.add_line(b"over a unix socket")
            pub.add_eof(0)
        client = redis.Redis(port=server.port, db=2)
        try:
            assert [f.get(b"line") for f in raw_entries(client, s, run)] == [b"over a unix socket", None]
        finally:
            client.close()
    finally:
        server.close()


def test_publisher_as_an_acl_user(acl_server, settings):
    s = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{acl_server.port}/0",
                                    "redis_username": "tapper", "redis_password": SecretStr(TAP_PASSWORD)})
    run = "conn/acl"
    with Publisher(s, run, {"host": "h"}) as pub:
        pub.add_lines([b"a", b"b"])
        pub.add_eof(0)
    root = root_client(acl_server)
    try:
        assert [f.get(b"line") for f in raw_entries(root, s, run)] == [b"a", b"b", None]
    finally:
        root.close()


def test_a_connection_dropped_mid_batch_is_retried_and_every_entry_sent_once(private_redis, settings):
    """The broker holds a batch unexecuted (CLIENT PAUSE WRITE) and the tap's connection is killed
    meanwhile: no reply ever comes, the publisher reconnects and re-sends the spooled batch; each entry
    is stored exactly once and in order."""
    s = settings.model_copy(update={"redis_url": private_redis.url})
    root = root_client(private_redis)
    run = "conn/dropped"
    pub = Publisher(s, run, {"host": "h"}, min_interval_s=0)
    try:
        pub.add_lines([b"first-%d" % i for i in range(5)])
        assert pub.flush(timeout=10)
        address = pub._transport.conn.local_address
        assert address is not None
        addr = f"{address[0]}:{address[1]}"
        root.execute_command("CLIENT", "PAUSE", "2000", "WRITE")
        pub.add_lines([b"second-%d" % i for i in range(300)])  # sent at once, then held by the pause
        time.sleep(0.3)
        assert pub.sent_count == 5
        assert root.execute_command("CLIENT", "KILL", "ADDR", addr) == 1  # killed while its batch waits
        root.execute_command("CLIENT", "UNPAUSE")
        assert pub.flush(timeout=30)
        pub.add_eof(0)
        assert pub.flush(timeout=10)
    finally:
        pub.close(timeout=5)
        root.execute_command("CLIENT", "UNPAUSE")
    got = raw_entries(root, s, run)
    root.close()
    assert [int(f[b"seq"]) for f in got] == list(range(5 + 300 + 1))
    assert [f.get(b"line") for f in got[:-1]] == [b"first-%d" % i for i in range(5)] + [
        b"second-%d" % i for i in range(300)]
    assert not spool_path(s, run).exists()


def test_a_broker_down_then_up_is_spooled_then_delivered(private_redis, settings):
    s = settings.model_copy(update={"redis_url": private_redis.url})
    run = "conn/down"
    private_redis.stop()
    pub = Publisher(s, run, {"host": "h"})
    try:
        pub.add_lines([b"x", b"y"])
        assert not pub.flush(timeout=0.5)
        assert pub.broker_up is False and pub.pending == 2
        private_redis.start()
        assert pub.flush(timeout=30)
        pub.add_eof(0)
    finally:
        pub.close(timeout=10)
    root = root_client(private_redis)
    try:
        assert [f.get(b"line") for f in raw_entries(root, s, run)] == [b"x", b"y", None]
    finally:
        root.close()


# --- the command line on the tap's own connection ---------------------------------------------------
def _tap(settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=cli_env(settings, **env),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_tap_with_a_wrong_password_is_one_line_and_spools_nothing(acl_server, settings):
    s = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{acl_server.port}/0"})
    out = _tap(s, "tap", "--run", "conn/wrong-pw", "--", "true", GOOSE_INGEST_REDIS_USERNAME="tapper",
               GOOSE_INGEST_REDIS_PASSWORD="not-the-password")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "not-the-password" not in out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("goose-ingest tap: the broker refused the credentials")
    assert "GOOSE_INGEST_REDIS_PASSWORD" in out.stderr
    assert not spool_path(s, "conn/wrong-pw").exists()


def test_tap_without_the_permission_to_write_is_one_line_noperm(acl_server, settings):
    s = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{acl_server.port}/0"})
    out = _tap(s, "publish", "--run", "conn/noperm", "-", GOOSE_INGEST_REDIS_USERNAME="reader",
               GOOSE_INGEST_REDIS_PASSWORD=TAP_PASSWORD)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "NOPERM" in out.stderr and "Traceback" not in out.stderr
    assert not spool_path(s, "conn/noperm").exists()


def test_tap_with_the_broker_down_spools_and_says_how_to_deliver(private_redis, settings):
    s = settings.model_copy(update={"redis_url": private_redis.url})
    private_redis.stop()
    out = _tap(s, "tap", "--quiet", "--drain-timeout", "0.5", "--run", "conn/later", "--", "echo", "hi")
    assert out.returncode == 75, out.stderr  # the command succeeded, but its entries stay spooled (EX_TEMPFAIL)
    assert "broker unreachable" in out.stderr and "publish --run conn/later --drain" in out.stderr
    assert spool_path(s, "conn/later").exists()


IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def _imported_modules(stderr: str) -> set[str]:
    return {m.group(1) for line in stderr.splitlines() if (m := IMPORTED.match(line))}


@pytest.mark.parametrize("command", [
    ["tap", "--quiet", "--run", "conn/imports", "--", sys.executable, "-c", "print('{}')"],
    ["publish", "--run", "conn/imports-publish", "-"],
], ids=["tap", "publish"])
def test_the_tap_path_never_imports_redis_py(private_redis, settings, command):
    """`python -X importtime` lists every module the process imported (at any depth): the single-node
    tap must not load redis-py (~7 MiB), FastStream, the redaction rules (~2.5 MiB), the sequencer and
    normalizer, or the event models (~0.7 MiB, only for --format)."""
    s = settings.model_copy(update={"redis_url": private_redis.url})
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "services.cli", *command], cwd=ROOT,
                         env=cli_env(s), capture_output=True, text=True, timeout=60, input="line\n")
    assert out.returncode == 0, out.stderr[-2000:]
    modules = _imported_modules(out.stderr)
    assert "services.tap.conn" in modules  # the parse sees the tap's own modules: the check can fail
    unwanted = sorted(m for m in modules if m.split(".")[0] in ("redis", "faststream", "opentelemetry")
                      or m.startswith(("services.redaction", "services.normalizer", "services.sequencer",
                                       "contracts.events", "contracts.runs")))
    assert unwanted == []
    client = root_client(private_redis)
    try:
        assert len(raw_entries(client, s, command[command.index("--run") + 1])) == 2  # it did publish
    finally:
        client.close()


def test_the_subcommand_map_names_what_each_module_registers():
    """services/cli.py imports only the module of the subcommand given; its map must match what the
    modules register (the full parser, as --help builds it)."""
    from services.cli import _COMMAND_MODULES, _MODULE_OF, SUBCOMMAND, build_parser

    assert set(_MODULE_OF.values()) == set(_COMMAND_MODULES)
    sub = next(a for a in build_parser()._actions if a.dest == SUBCOMMAND)
    assert set(sub.choices) == set(_MODULE_OF)
    for name, module in _MODULE_OF.items():
        only = next(a for a in build_parser(name)._actions if a.dest == SUBCOMMAND)
        assert name in only.choices, (name, module)


def test_the_held_bytes_default_is_the_sequencers():
    """Settings takes it from contracts.raw (no sequencer import); services/sequencer/run.py still
    defines its own until it imports this one (issue 13 part 3 report)."""
    from contracts.raw import DEFAULT_MAX_HELD_BYTES
    from services.sequencer.run import DEFAULT_MAX_HELD_BYTES as SEQUENCER_DEFAULT
    from services.settings import Settings

    assert DEFAULT_MAX_HELD_BYTES == SEQUENCER_DEFAULT == Settings.model_fields["max_held_bytes"].default
