"""Broker restarts, graceful shutdown, poison entries and retention, with real processes."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from contracts.keys import shard_of
from services.settings import Settings
from tests.support.pipeline import (
    dead_letters,
    ended_runs,
    events_by_run,
    expected_events,
    start_worker,
    stop,
    wait_until,
)

pytestmark = pytest.mark.e2e

TEXT = '{"type":"message","message":{"id":"m%d","role":"assistant","content":[{"type":"text","text":"t%d"}]}}'


def _publish(settings: Settings, run: str, n: int, eof: bool = True) -> None:
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.raw_stream(shard_of(run, settings.shards))
    pipe = r.pipeline(transaction=False)
    for seq in range(n):
        pipe.xadd(stream, {"run": run, "seq": seq, "ts": 1_790_000_000_000 + seq, "line": TEXT % (seq, seq)})
    if eof:
        pipe.xadd(stream, {"run": run, "seq": n, "ts": 1_790_000_000_000 + n, "kind": "eof", "exit": 0})
    pipe.execute()


# The defaults, not the fast sweep start_worker uses elsewhere: a 0.3 s sweep recreated the groups
# before FastStream gave up on them and so hid that an empty Redis used to end every worker.
DEFAULT_SWEEP = {"GOOSE_INGEST_SWEEP_INTERVAL_S": "5", "GOOSE_INGEST_CLAIM_IDLE_MS": "30000",
                 "GOOSE_INGEST_BATCH_SIZE": "500"}
FASTSTREAM_GIVES_UP_S = 5.0  # FastStream 0.7.8 stops a subscriber ~5 s after Redis comes back empty


def _metrics_port(log) -> int:
    def port() -> int | None:
        for line in log.read_text(errors="replace").splitlines():
            if "metrics on port" in line:
                return int(line.rsplit(" ", 1)[1])
        return None

    return wait_until(port, timeout=30)


def _readyz(port: int) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_worker_survives_a_redis_restart_and_reconnects(private_redis, tmp_path):
    settings = Settings(redis_url=private_redis.url, namespace="restart", shards=2)
    worker = start_worker(settings, tmp_path / "w.log", **DEFAULT_SWEEP)
    try:
        _publish(settings, "restart/before", 20)
        wait_until(lambda: "restart/before" in ended_runs(settings), timeout=30)
        # The server goes away and comes back empty (no persistence): streams and groups are gone.
        private_redis.stop()
        time.sleep(1.5)
        private_redis.restart()
        time.sleep(FASTSTREAM_GIVES_UP_S + 2)
        assert worker.poll() is None, "the worker exited instead of reconnecting"
        _publish(settings, "restart/after", 20)
        wait_until(lambda: "restart/after" in ended_runs(settings), timeout=60)
        assert worker.poll() is None, "the worker exited instead of reconnecting"
    finally:
        stop(worker)
    assert worker.returncode == 0
    assert events_by_run(settings)["restart/after"] == expected_events(settings, "restart/after")


def test_a_flushed_redis_never_kills_the_worker_with_default_settings(private_redis, tmp_path):
    settings = Settings(redis_url=private_redis.url, namespace="flushed", shards=2)
    log = tmp_path / "w.log"
    worker = start_worker(settings, log, **DEFAULT_SWEEP)
    try:
        port = _metrics_port(log)
        _publish(settings, "flushed/before", 10)
        wait_until(lambda: "flushed/before" in ended_runs(settings), timeout=30)
        redis.Redis.from_url(private_redis.url).flushall()  # a private server: nobody else's data
        time.sleep(FASTSTREAM_GIVES_UP_S + 2)
        assert worker.poll() is None, log.read_text()[-3000:]
        _publish(settings, "flushed/after", 10)
        wait_until(lambda: "flushed/after" in ended_runs(settings), timeout=30)
        assert worker.poll() is None
        assert wait_until(lambda: _readyz(port)[0] == 200, timeout=30)
    finally:
        stop(worker)
    assert worker.returncode == 0, log.read_text()[-3000:]
    assert "recreating it at 0" in log.read_text()
    assert events_by_run(settings)["flushed/after"] == expected_events(settings, "flushed/after")


def test_a_worker_whose_subscriber_stopped_says_so_and_exits_non_zero(settings):
    import asyncio

    from services.metrics import Metrics
    from services.worker.app import build_app

    s = settings.model_copy(update={"metrics_port": 0})

    async def go():
        app, runtime = build_app(s, Metrics())
        task = asyncio.create_task(app.run())
        try:
            # Started = ready: the subscribers run and the watch saw every one of them consume (under
            # load the second comes a moment after the first: asserting right away once failed).
            deadline = time.monotonic() + 30
            while not (runtime.subscribers and all(sub.running for _, sub in runtime.subscribers)
                       and runtime.housekeeper is not None and runtime.subscriber_health().ok):
                assert time.monotonic() < deadline and not task.done(), runtime.subscriber_health()
                await asyncio.sleep(0.05)
            stream, sub = runtime.subscribers[0]
            await sub.stop()  # a subscriber that stops for any reason but a shutdown
            ready = runtime.housekeeper.readiness()
            await asyncio.wait_for(task, timeout=30)
            return stream, ready, runtime
        finally:
            if not task.done():  # a failed check above: stop the app rather than hang asyncio.run's cleanup
                app.exit()
                await asyncio.wait_for(task, timeout=30)

    stream, ready, runtime = asyncio.run(go())
    assert not ready.ok and stream in ready.reason
    assert runtime.exit_code == 1
    assert stream in runtime.subscriber_health().reason and "status 1" in runtime.subscriber_health().reason


def test_sigterm_finishes_the_batch_and_loses_nothing(settings, tmp_path):
    runs = [f"term/{i}" for i in range(30)]
    for run in runs:
        _publish(settings, run, 40)
    log = tmp_path / "w.log"
    worker = start_worker(settings, log, GOOSE_INGEST_BATCH_SIZE="20")
    wait_until(lambda: ended_runs(settings), timeout=30, interval=0.01)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    # Whatever the stopped worker had read but not committed is pending, never half-committed:
    # a new worker (after the claim idle time) completes every run exactly.
    second = start_worker(settings, log)
    try:
        wait_until(lambda: set(runs) <= ended_runs(settings), timeout=60)
    finally:
        stop(second)
    published = events_by_run(settings)
    for run in runs:
        assert published[run] == expected_events(settings, run)


def test_an_entry_delivered_too_often_is_dead_lettered(settings, tmp_path):
    r = redis.Redis.from_url(settings.redis_url)
    run = "poison/run"
    stream = settings.layout.raw_stream(shard_of(run, settings.shards))
    for s in settings.layout.raw_streams():
        r.xgroup_create(s, settings.group, id="0", mkstream=True)
    _publish(settings, run, 3)
    # Simulate workers that crash on the entries: each read bumps the delivery count.
    for attempt in range(7):
        r.xautoclaim(stream, settings.group, f"crasher-{attempt}", min_idle_time=0, start_id="0-0")
    r.xreadgroup(settings.group, "crasher", {stream: ">"})
    for attempt in range(6):
        r.xautoclaim(stream, settings.group, f"crasher-{attempt}", min_idle_time=0, start_id="0-0")
    worker = start_worker(settings, tmp_path / "w.log", GOOSE_INGEST_MAX_DELIVERIES="3", GOOSE_INGEST_CLAIM_IDLE_MS="200")
    try:
        wait_until(lambda: len(dead_letters(settings)) == 4, timeout=30)
        wait_until(lambda: r.xpending(stream, settings.group)["pending"] == 0, timeout=30)
    finally:
        stop(worker)
    reasons = {d["reason"] for d in dead_letters(settings)}
    assert reasons == {b"max-deliveries"}
    assert all(b"delivered" in d["detail"] for d in dead_letters(settings))


def test_retention_never_trims_uncommitted_raw_entries(settings, tmp_path):
    """Raw retention 0.0001 h (~0.4 s): committed entries go, unread and pending ones stay."""
    r = redis.Redis.from_url(settings.redis_url)
    for s in settings.layout.raw_streams():
        r.xgroup_create(s, settings.group, id="0", mkstream=True)
    _publish(settings, "keep/pending", 5)
    # Read by a consumer that dies: pending, never committed.
    for s in settings.layout.raw_streams():
        r.xreadgroup(settings.group, "dead", {s: ">"})
    time.sleep(1.0)
    worker = start_worker(settings, tmp_path / "w.log", GOOSE_INGEST_RAW_RETENTION_HOURS="0.0001",
                          GOOSE_INGEST_CLAIM_IDLE_MS="600000")
    try:
        from services.worker.housekeeping import Housekeeper  # noqa: F401  (trim runs in the worker)

        time.sleep(3.0)
        total = sum(r.xlen(s) for s in settings.layout.raw_streams())
        assert total == 6, "pending (uncommitted) entries were trimmed"
    finally:
        stop(worker)


def test_a_worker_started_before_its_broker_waits_for_it(tmp_path):
    from services.broker.embedded import free_port, start_redis

    port = free_port()
    # While the broker is down the worker waits, and never logs the password of its URL.
    secret = Settings(redis_url=f"redis://:s3cret@127.0.0.1:{port}/0", namespace="late", shards=1)
    worker = start_worker(secret, tmp_path / "secret.log")
    try:
        wait_until(lambda: "unreachable" in (tmp_path / "secret.log").read_text(), timeout=20)
        assert worker.poll() is None
    finally:
        stop(worker)
    # A SIGTERM while waiting for the broker is a requested stop (0 or the signal), not status 1
    # ("a subscriber died, restart me").
    assert worker.returncode in (0, -signal.SIGTERM), worker.returncode
    assert "s3cret" not in (tmp_path / "secret.log").read_text()
    # And once the broker is up it gets to work.
    settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", namespace="late", shards=1)
    worker = start_worker(settings, tmp_path / "w.log")
    try:
        time.sleep(1.0)
        assert worker.poll() is None
        with start_redis(port=port):
            _publish(settings, "late/run", 3)
            wait_until(lambda: "late/run" in ended_runs(settings), timeout=30)
    finally:
        stop(worker)
