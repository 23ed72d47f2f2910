"""Broker connections: the credentials override, URL / seed-list parsing, one-line errors.

Against real redis-servers: one with `requirepass`, one with ACL users, and (for the cluster
errors) a plain node that is not a cluster.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from services.broker.cluster import make_broker
from services.broker.connect import (
    BrokerConfigError,
    BrokerUnreachable,
    async_client,
    parse_broker_url,
    sync_client,
    sync_client_with_timeouts,
)
from services.broker.embedded import start_redis
from services.settings import Settings

REPO = Path(__file__).resolve().parents[2]
GOOD_PW = "s3cret-right"


def _lock(server, *commands: list[str]) -> None:
    """Turn authentication on after start (the embedded server's start probe speaks without it)."""
    r = redis.Redis(host="127.0.0.1", port=server.port)
    for command in commands:
        r.execute_command(*command)
    r.close()


@pytest.fixture(scope="module")
def pw_redis(tmp_path_factory):
    server = start_redis(dir=str(tmp_path_factory.mktemp("pw-redis")))
    _lock(server, ["CONFIG", "SET", "requirepass", GOOD_PW])
    yield server
    server.close()


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    server = start_redis(dir=str(tmp_path_factory.mktemp("acl-redis")))
    _lock(server,
          ["ACL", "SETUSER", "alice", "on", f">{GOOD_PW}", "~*", "&*", "+@all"],
          ["ACL", "SETUSER", "bob", "on", ">bobs-pw", "~*", "&*", "+@all"],
          ["ACL", "SETUSER", "default", "off"])
    yield server
    server.close()


def whoami_sync(settings: Settings) -> str:
    return sync_client(settings).execute_command("ACL", "WHOAMI").decode()


def whoami_async(settings: Settings) -> str:
    async def go() -> str:
        client = async_client(settings)
        try:
            return (await client.execute_command("ACL", "WHOAMI")).decode()
        finally:
            await client.aclose()

    return asyncio.run(go())


# --- the override ---------------------------------------------------------------------------------
def test_password_setting_overrides_the_urls_password(pw_redis):
    url = f"redis://:wrong-pw@127.0.0.1:{pw_redis.port}/0"
    s = Settings(redis_url=url, redis_password=GOOD_PW)
    assert sync_client(s).ping() is True
    assert sync_client_with_timeouts(s, socket_timeout=5, connect_timeout=2).ping() is True

    async def go() -> bool:
        client = async_client(s)
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()

    assert asyncio.run(go()) is True


def test_without_the_setting_the_urls_password_is_used(pw_redis):
    ok = Settings(redis_url=f"redis://:{GOOD_PW}@127.0.0.1:{pw_redis.port}/0")
    assert sync_client(ok).ping() is True
    bad = Settings(redis_url=f"redis://:wrong-pw@127.0.0.1:{pw_redis.port}/0")
    with pytest.raises(redis.AuthenticationError):
        sync_client(bad).ping()


def test_a_wrong_password_setting_wins_over_a_right_url_password(pw_redis):
    """The override is real: the setting is what gets sent, even when the URL's would work."""
    s = Settings(redis_url=f"redis://:{GOOD_PW}@127.0.0.1:{pw_redis.port}/0", redis_password="wrong-pw")
    with pytest.raises(redis.AuthenticationError):
        sync_client(s).ping()


def test_username_and_password_settings_override_the_urls_acl_user(acl_redis):
    url = f"redis://bob:bobs-pw@127.0.0.1:{acl_redis.port}/0"
    assert whoami_sync(Settings(redis_url=url)) == "bob"
    s = Settings(redis_url=url, redis_username="alice", redis_password=GOOD_PW)
    assert whoami_sync(s) == "alice"
    assert whoami_async(s) == "alice"


def test_username_setting_alone_keeps_the_urls_password_out(acl_redis):
    # alice's name with bob's password from the URL must fail: no mixing that silently works.
    s = Settings(redis_url=f"redis://bob:bobs-pw@127.0.0.1:{acl_redis.port}/0", redis_username="alice")
    with pytest.raises(redis.AuthenticationError):
        sync_client(s).ping()


def test_faststream_broker_uses_the_override(acl_redis):
    s = Settings(redis_url=f"redis://bob:bobs-pw@127.0.0.1:{acl_redis.port}/0",
                 redis_username="alice", redis_password=GOOD_PW)

    async def go() -> str:
        broker = make_broker(s)
        await broker.connect()
        try:
            client = broker.config.broker_config.connection.client
            return (await client.execute_command("ACL", "WHOAMI")).decode()
        finally:
            await broker.stop()

    assert asyncio.run(go()) == "alice"


def test_percent_encoded_url_credentials_are_decoded():
    t = parse_broker_url("redis://us%40er:p%3Aw%2Fd@h:1/0", cluster=False)
    assert (t.username, t.password) == ("us@er", "p:w/d")
    assert "p:w" not in t.url_without_credentials and "p%3A" not in t.url_without_credentials


# --- parsing ---------------------------------------------------------------------------------------
def test_seed_lists():
    t = parse_broker_url("redis://u:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002", cluster=True)
    assert [(s.host, s.port) for s in t.seeds] == [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002)]
    assert (t.username, t.password, t.db) == ("u", "pw", 0)
    assert parse_broker_url("rediss://h", cluster=True).tls is True
    assert parse_broker_url("redis://h", cluster=True).seeds[0].port == 6379


@pytest.mark.parametrize(
    ("url", "cluster", "needle"),
    [
        ("redis://127.0.0.1:PORT/0", False, "'PORT'"),
        ("redis://h:1,,h:2", True, "empty host"),
        ("redis://h:1,h:99999", True, "99999"),
        ("redis://h:1,h:2", False, "GOOSE_INGEST_REDIS_CLUSTER=true"),
        ("redis://h:1/3", True, "only database 0"),
        ("redis://h:1/zero", False, "'zero'"),
        ("http://h:1", False, "scheme"),
        ("unix:///tmp/r.sock", True, "unix socket"),
        ("redis://[::1:7000", True, "not a URL"),
    ],
)
def test_malformed_urls_are_one_line_without_the_password(url, cluster, needle):
    secret_url = url.replace("redis://", "redis://user:TOPSECRET@", 1)
    with pytest.raises(BrokerConfigError) as info:
        parse_broker_url(secret_url, cluster=cluster)
    message = str(info.value)
    assert needle in message
    assert "TOPSECRET" not in message and "\n" not in message


# --- cluster mode against things that are not a (reachable) cluster ------------------------------
def test_cluster_mode_against_a_plain_node_says_so(pw_redis):
    s = Settings(redis_url=f"redis://127.0.0.1:{pw_redis.port}", redis_password=GOOD_PW, redis_cluster=True)
    with pytest.raises(BrokerConfigError, match="is not a Redis Cluster node"):
        sync_client(s)

    async def go() -> None:
        client = async_client(s)
        try:
            await client.ping()
        finally:
            await client.aclose()

    with pytest.raises(BrokerConfigError, match="is not a Redis Cluster node"):
        asyncio.run(go())


def test_cluster_mode_with_unreachable_seeds_is_a_connection_error():
    from services.broker.embedded import free_port

    seeds = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    s = Settings(redis_url=f"redis://u:TOPSECRET@{seeds}", redis_cluster=True)
    with pytest.raises(BrokerUnreachable) as info:
        sync_client(s)
    assert isinstance(info.value, redis.ConnectionError)  # callers that wait for a broker wait
    assert "TOPSECRET" not in str(info.value) and seeds in str(info.value)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [["replay"], ["tail", "--no-follow"]])
def test_cli_cluster_errors_are_one_line_exit_2(pw_redis, command):
    from services.broker.embedded import free_port

    cases = [
        ({"GOOSE_INGEST_REDIS_URL": f"redis://:x@127.0.0.1:{pw_redis.port}", "GOOSE_INGEST_REDIS_PASSWORD": GOOD_PW,
          "GOOSE_INGEST_REDIS_CLUSTER": "true"}, "not a Redis Cluster node"),
        ({"GOOSE_INGEST_REDIS_URL": "redis://a:1,,b:2", "GOOSE_INGEST_REDIS_CLUSTER": "true"}, "empty host"),
        ({"GOOSE_INGEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}", "GOOSE_INGEST_REDIS_CLUSTER": "true"},
         "unreachable"),
    ]
    for env, needle in cases:
        res = cli(env, *command)
        assert res.returncode == 2, (env, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (env, res.stderr)
        assert GOOD_PW not in res.stderr and res.stdout == ""


def test_worker_in_cluster_mode_against_a_plain_node_or_a_bad_seed_list_is_one_line(pw_redis):
    cases = [
        ({"GOOSE_INGEST_REDIS_URL": f"redis://127.0.0.1:{pw_redis.port}", "GOOSE_INGEST_REDIS_PASSWORD": GOOD_PW,
          "GOOSE_INGEST_REDIS_CLUSTER": "true"}, "not a Redis Cluster node"),
        ({"GOOSE_INGEST_REDIS_URL": "redis://127.0.0.1:6379,", "GOOSE_INGEST_REDIS_CLUSTER": "true"}, "empty host"),
    ]
    for env, needle in cases:
        res = cli({**env, "GOOSE_INGEST_METRICS_PORT": "0"}, "worker")
        assert res.returncode == 2, (env, res.stderr[-2000:])
        errors = [line for line in res.stderr.splitlines() if line.startswith("goose-ingest worker:")]
        assert len(errors) == 1 and needle in errors[0], res.stderr[-2000:]
        assert "Traceback" not in res.stderr and GOOD_PW not in res.stderr


# --- wait_for_broker ------------------------------------------------------------------------------
def test_wait_for_broker_doubles_its_wait_from_its_start_to_its_cap_then_returns(tmp_path, caplog):
    """A broker that comes up late: the waits double from BROKER_WAIT_START_S (0.2, 0.4, 0.8 s; the
    shared Backoff, capped at BROKER_WAIT_CAP_S), each said on /readyz's line, and the wait ends at
    the first answer. A real server started on the port after the third failed ping."""
    import logging

    from services.broker.connect import BROKER_WAIT_CAP_S, BROKER_WAIT_START_S, wait_for_broker
    from services.broker.embedded import free_port

    assert (BROKER_WAIT_START_S, BROKER_WAIT_CAP_S) == (0.2, 5.0)  # the numbers of before issue 33
    port = free_port()
    said: list[str] = []
    servers = []

    def say(line: str) -> None:
        said.append(line)
        if len(said) == 3:  # the broker comes up while the third wait runs
            servers.append(start_redis(dir=str(tmp_path), port=port))

    log = logging.getLogger("test.wait_for_broker")
    with caplog.at_level(logging.WARNING, logger=log.name):
        asyncio.run(asyncio.wait_for(wait_for_broker(Settings(redis_url=f"redis://127.0.0.1:{port}/0"), log, say), 30))
    try:
        waits = [r.getMessage().rsplit("retrying in ", 1)[1] for r in caplog.records]
        assert waits == ["0.2s", "0.4s", "0.8s"]
        assert all("waiting for the broker" in line and "unreachable" in line for line in said)
    finally:
        for server in servers:
            server.close()
