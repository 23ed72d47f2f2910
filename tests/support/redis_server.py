"""Choosing and cleaning the Redis broker used by the tests (see tests/conftest.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from services.broker.embedded import EmbeddedRedis, start_redis
from services.settings import Settings

DOCKER_PROBE_TIMEOUT_S = 3.0
CONTAINER_START_TIMEOUT_S = 120.0


@dataclass
class Broker:
    url: str
    source: str  # "env" | "testcontainers" | "embedded"
    _stop: Callable[[], None] | None = field(default=None, repr=False)

    def stop(self) -> None:
        if self._stop is not None:
            try:
                self._stop()
            finally:
                self._stop = None


def _run_with_deadline(fn: Callable[[], object], timeout: float) -> object:
    """fn() in a daemon thread; raise TimeoutError when it does not finish in time (it is then abandoned)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"gave up after {timeout}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def docker_answers() -> bool:
    """True when a Docker daemon answers a ping within a few seconds (never raises, never hangs)."""
    if os.environ.get("GOOSE_INGEST_TEST_NO_DOCKER"):
        return False
    try:
        import docker

        def ping() -> bool:
            client = docker.from_env(timeout=int(DOCKER_PROBE_TIMEOUT_S))
            try:
                return bool(client.ping())
            finally:
                client.close()

        return bool(_run_with_deadline(ping, DOCKER_PROBE_TIMEOUT_S + 1))
    except BaseException:  # noqa: BLE001 - any failure means "no docker"
        return False


def try_testcontainer() -> Broker | None:
    if not docker_answers():
        return None
    try:
        from testcontainers.community.redis import RedisContainer

        container = RedisContainer("redis:7")

        def start() -> str:
            container.start()
            host = container.get_container_host_ip()
            port = container.get_exposed_port(container.port)
            return f"redis://{host}:{port}/0"

        url = str(_run_with_deadline(start, CONTAINER_START_TIMEOUT_S))
    except BaseException:  # noqa: BLE001 - fall back to an embedded server
        try:
            container.stop()  # type: ignore[possibly-undefined]
        except BaseException:  # noqa: BLE001
            pass
        return None
    return Broker(url, "testcontainers", container.stop)


def choose_broker() -> Broker:
    """env REDIS_URL, else a testcontainers Redis when Docker answers, else an embedded redis-server."""
    url = os.environ.get("REDIS_URL")
    if url:
        return Broker(url, "env")
    broker = try_testcontainer()
    if broker is not None:
        return broker
    server: EmbeddedRedis = start_redis()
    return Broker(server.url, "embedded", server.close)


def wipe_namespace(url: str, namespace: str) -> int:
    """Delete every key under '<namespace>:*' (SCAN + UNLINK). Returns how many were deleted."""
    if not namespace:
        raise ValueError("refusing to wipe an empty namespace")
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in namespace) + ":*"
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a `goose-ingest` subprocess that uses the same broker, namespace, shards and spool."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update({
        "GOOSE_INGEST_REDIS_URL": settings.redis_url or "",
        "GOOSE_INGEST_NAMESPACE": settings.namespace,
        "GOOSE_INGEST_SHARDS": str(settings.shards),
        "GOOSE_INGEST_SPOOL_DIR": settings.spool_dir,
        "GOOSE_INGEST_PUBLISH_BATCH": str(settings.publish_batch),
        "PYTHONUNBUFFERED": "1",
        # Any free port: a command's fixed default (9464-9467) would be bound by two tests at once
        # under pytest-xdist. The tests of the defaults pop this or use a `default_ports` marker.
        "GOOSE_INGEST_METRICS_PORT": "0",
    })
    if settings.host_label:
        env["GOOSE_INGEST_HOST_LABEL"] = settings.host_label
    if settings.redis_cluster:
        env["GOOSE_INGEST_REDIS_CLUSTER"] = "true"
    env.update(extra)
    return env
