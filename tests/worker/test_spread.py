"""Pages counted in runs and hosts (services/worker/spread.py): real batches committed by the batch
processor against the test Redis, the fleet's sets, and the gauges the rules read. A run with 30
errors is one run on one host; a host's 30 successful calls are one calling host; every count
leaves the window when its last failure does."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.broker.embedded import free_port
from services.metrics import Metrics
from services.sequencer import Entry
from services.settings import Settings
from services.worker.processor import BatchProcessor
from services.worker.spread import HOST_MIN_TOOL_CALLS, Spread, digest, observe
from tests.support.normalizer import req, resp
from tests.worker.test_batch_processor import Harness, process_shard, run_async

TS = 1_790_000_000_000
AUTH = orjson.dumps({"type": "error", "error": "Authentication failed: 401 Unauthorized, invalid x-api-key"}).decode()
AGENT = '{"type":"message","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"hi"}]}}'


def shell_call(n: int, ok: bool) -> list[str]:
    return [req(f"c{n}", "developer__shell", {"command": "make"}, mid=f"q{n}"),
            resp(f"c{n}", status="success" if ok else "error", mid=f"r{n}")]


def publish(h: Harness, run: str, host: str | None, lines: list[str]) -> None:
    for seq, text in enumerate([AGENT, *lines]):
        h.add(Entry.of_line(run, seq, TS + seq, text, host=host, format="goose" if seq == 0 else None).to_fields())


def gauge(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def process_all(settings: Settings, metrics: Metrics, h: Harness, now_ms: int | None = None) -> dict[Any, int]:
    async def body(client: Any) -> dict[Any, int]:
        processor = BatchProcessor(settings, client)
        processor.spread = spread = Spread(client, settings, metrics)
        for shard in range(settings.shards):
            await process_shard(h, processor, shard)
        return await spread.refresh(now_ms)

    return run_async(settings, body)


def test_a_run_with_30_errors_is_one_run_on_one_host(settings: Settings):
    h, metrics = Harness(settings), Metrics(CollectorRegistry())
    publish(h, "loop-run", "host-a", [AUTH] * 30)
    process_all(settings, metrics, h)
    assert gauge(metrics, "goose_ingest_error_class_runs", **{"class": "auth"}) == 1
    assert gauge(metrics, "goose_ingest_error_class_hosts", **{"class": "auth"}) == 1
    assert gauge(metrics, "goose_ingest_error_class_runs", **{"class": "rate_limit"}) == 0
    assert gauge(metrics, "goose_ingest_alert_min_runs") == settings.alert_min_runs == 5
    assert gauge(metrics, "goose_ingest_alert_min_hosts") == settings.alert_min_hosts == 3


def test_five_hosts_times_two_runs_are_ten_runs_on_five_hosts_and_leave_the_window(settings: Settings):
    h, metrics = Harness(settings), Metrics(CollectorRegistry())
    for host in range(5):
        for k in range(2):
            publish(h, f"run-{host}-{k}", f"host-{host}", [AUTH])
    sizes = process_all(settings, metrics, h)
    assert sizes[("class", "auth", "runs")] == 10 and sizes[("class", "auth", "hosts")] == 5
    assert gauge(metrics, "goose_ingest_error_class_hosts", **{"class": "auth"}) == 5

    async def later(client: Any) -> dict[Any, int]:
        spread = Spread(client, settings, metrics)
        return await spread.refresh(int(time.time() * 1000) + int(settings.alert_window_s * 1000) + 1000)

    sizes = run_async(settings, later)
    assert sizes[("class", "auth", "runs")] == 0 and sizes[("class", "auth", "hosts")] == 0
    assert gauge(metrics, "goose_ingest_error_class_runs", **{"class": "auth"}) == 0


def test_a_host_adding_successes_is_one_calling_host_and_cannot_dilute_a_tool_failing_elsewhere(settings: Settings):
    h, metrics = Harness(settings), Metrics(CollectorRegistry())
    # the noisy host: 30 successful shell calls in one run
    publish(h, "busy-run", "busy-host", [line for n in range(30) for line in shell_call(n, ok=True)])
    for host in range(3):  # three hosts whose shell fails every call, two runs each
        for k in range(2):
            publish(h, f"fail-{host}-{k}", f"broken-{host}",
                    [line for n in range(HOST_MIN_TOOL_CALLS // 2) for line in shell_call(n, ok=False)])
    sizes = process_all(settings, metrics, h)
    assert sizes[("tool", "shell", "calling")] == 4
    assert sizes[("tool", "shell", "hosts")] == 3  # each broken host reached 4 failed calls over its 2 runs
    assert sizes[("tool", "shell", "runs")] == 6
    assert gauge(metrics, "goose_ingest_tool_failing_hosts", tool="shell") == 3
    assert gauge(metrics, "goose_ingest_tool_calling_hosts", tool="shell") == 4


def test_the_share_of_hosts_with_errors_counts_a_flooding_host_once(settings: Settings):
    """GooseIngestErrorSpike's reading in hosts: a host's 100 successful calls and another's 30
    errors are one active host and one host with errors each, whatever their volume."""
    h, metrics = Harness(settings), Metrics(CollectorRegistry())
    publish(h, "flood", "host-flood", [line for n in range(100) for line in shell_call(n, ok=True)])
    publish(h, "loop", "host-loop", [AUTH] * 30)
    for host in range(3):
        publish(h, f"calm-{host}", f"host-{host}", shell_call(0, ok=True))
    sizes = process_all(settings, metrics, h)
    assert sizes[("hosts", "all", "active")] == 5 and sizes[("hosts", "all", "errors")] == 1
    assert gauge(metrics, "goose_ingest_hosts_active") == 5
    assert gauge(metrics, "goose_ingest_hosts_with_errors") == 1


def test_a_host_whose_tool_fails_a_few_of_many_calls_is_no_failing_host(settings: Settings):
    h, metrics = Harness(settings), Metrics(CollectorRegistry())
    publish(h, "mixed", "host-m", [line for n in range(10) for line in shell_call(n, ok=n % 3 == 0)] +
            [line for n in range(10, 20) for line in shell_call(n, ok=True)])
    sizes = process_all(settings, metrics, h)
    assert sizes[("tool", "shell", "calling")] == 1
    assert sizes[("tool", "shell", "hosts")] == 0
    assert sizes[("tool", "shell", "runs")] == 1  # it did fail some calls


def test_observe_keeps_no_name_and_counts_a_run_without_host_as_its_own_host():
    events = [
        {"type": "error", "runId": "r1", "errorClass": "auth"},
        {"type": "error", "runId": "r2", "errorClass": "auth"},
        {"type": "warning", "runId": "r3", "errorClass": "rate_limit"},
        {"type": "warning", "runId": "r3"},  # a warning without a class is no failure
        {"type": "error", "runId": "r3", "errorClass": "made-up"},  # outside the vocabulary: other
        {"type": "command", "runId": "r1", "tool": "developer__shell", "isSuccess": False},
        {"type": "command", "runId": "r1", "tool": "developer__shell"},  # no answer: not a call that counts
        {"type": "agent", "runId": "r1"},
    ]
    obs = observe(events, {"r1": "host-1", "r2": None, "r3": "host-1"})
    assert obs.class_runs == {"auth": {digest("r1"), digest("r2")}, "rate_limit": {digest("r3")},
                              "other": {digest("r3")}}
    assert obs.class_hosts["auth"] == {digest("host:host-1"), digest("run:r2")}
    assert obs.tool_calls == {("shell", digest("host:host-1")): [1, 1]}
    assert obs.tool_runs == {"shell": {digest("r1")}}
    assert "host-1" not in repr(obs) and "'r1'" not in repr(obs)
    assert obs.active_hosts == {digest("host:host-1"), digest("run:r2")}
    assert obs.error_hosts == {digest("host:host-1"), digest("run:r2")}  # r3's host by its `error`, r1's too
    quiet = observe([{"type": "agent", "runId": "r1"}], {})
    assert quiet.active_hosts == {digest("run:r1")} and not quiet.error_hosts and not quiet.class_runs
    assert not observe([{"type": "agent"}], {})  # no run, nothing to count


def test_a_broker_error_after_the_commit_is_logged_not_raised(caplog: pytest.LogCaptureFixture):
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="gone")
    metrics = Metrics(CollectorRegistry())

    async def body() -> None:
        from services.broker.connect import async_client

        client = async_client(settings)
        try:
            spread = Spread(client, settings, metrics)
            await spread.record([{"type": "error", "runId": "r", "errorClass": "auth"}], {"r": "h"})
            await spread.record([{"type": "error", "runId": "r", "errorClass": "auth"}], {"r": "h"})
        finally:
            await client.aclose()

    with caplog.at_level("WARNING"):
        asyncio.run(body())
    warnings = [r.getMessage() for r in caplog.records if "runs/hosts counts" in r.getMessage()]
    assert len(warnings) == 1 and "record failed" in warnings[0]  # once, not per batch


def test_the_window_and_thresholds_are_settings_and_refuse_a_single_host():
    assert Settings(alert_window_s=30, alert_min_runs=1, alert_min_hosts=2).alert_window_s == 30
    with pytest.raises(ValueError, match="alert_min_hosts"):
        Settings(alert_min_hosts=1)
    with pytest.raises(ValueError, match="alert_window_s"):
        Settings(alert_window_s=0)


def test_on_a_redis_cluster_the_sets_live_in_many_slots_and_count_alike(cluster_settings: Settings):
    """Each set is its own key (no hash tag): the pipelines span slots and nodes, and the counts are
    the same as on one node."""
    from services.broker.connect import async_client

    settings = cluster_settings.model_copy(update={"alert_window_s": 60})
    metrics = Metrics(CollectorRegistry())
    events = [{"type": "error", "runId": f"r{i}", "errorClass": cls}
              for i in range(10) for cls in ("auth", "timeout", "rate_limit")]
    events += [{"type": "command", "runId": f"r{i}", "tool": "developer__shell", "isSuccess": False}
               for i in range(10) for _ in range(HOST_MIN_TOOL_CALLS)]
    hosts = {f"r{i}": f"host-{i % 5}" for i in range(10)}

    async def body() -> dict[Any, int]:
        client = async_client(settings)
        try:
            spread = Spread(client, settings, metrics)
            await spread.record(events, hosts)
            return await spread.refresh()
        finally:
            await client.aclose()

    sizes = asyncio.run(body())
    for cls in ("auth", "timeout", "rate_limit"):
        assert (sizes[("class", cls, "runs")], sizes[("class", cls, "hosts")]) == (10, 5), cls
    assert (sizes[("tool", "shell", "runs")], sizes[("tool", "shell", "hosts")],
            sizes[("tool", "shell", "calling")]) == (10, 5, 5)
    assert gauge(metrics, "goose_ingest_tool_failing_hosts", tool="shell") == 5
