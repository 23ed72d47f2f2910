"""The OTLP exporter's consumer against a real Redis and a real OTLP/HTTP receiver.

Topic entries are written here with the plain fields the workers write (docs/consumers.md), so
each case controls order and content exactly; tests/export/test_export_otlp_e2e.py runs the real worker
and exporter processes against Arize Phoenix.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from services.broker.connect import async_client, sync_client
from services.broker.embedded import free_port
from services.export.otlp import mapping as m
from services.export.otlp.mapping import MappingConfig
from services.export.otlp.processor import EXPORTER, TraceExporter
from services.export.otlp.sink import HttpSink
from tests.support.otlp_receiver import RunningReceiver
from tests.support.otlp_receiver import decode as decode_request

RUN_A = "host-a/run-1"
RUN_B = "host-b/run-2"


def event(run: str, seq: int, etype: str, ms: int = 0, **fields) -> dict:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1_764_000_000 + seq)) + f".{ms:03d}Z"
    return {"eventId": f"{run}:{seq}", "runId": run, "seq": seq, "type": etype, "timestamp": ts, "lines": [seq, seq], **fields}


def record(run: str, k: int, state: str, counts: dict[str, int], **fields) -> dict:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1_764_000_000 + 10 * k)) + ".000Z"
    return {"recordId": f"{run}:run:{k}", "runId": run, "seq": k, "state": state, "timestamp": ts, "counts": counts, **fields}


def run_events(run: str) -> list[dict]:
    return [
        event(run, 0, "agent", message="Let me look."),
        event(run, 1, "read", path="/src/pager.py", isSuccess=True, tool="developer__text_editor", toolCallId="t1", durationMs=20),
        event(run, 2, "command", command="pytest -q", exitCode=1, isSuccess=False, tool="developer__shell", toolCallId="t2", durationMs=900),
        event(run, 3, "error", message="goose exited with code 1"),
    ]


def run_records(run: str) -> list[dict]:
    counts = {"agent": 1, "read": 1, "command": 1, "error": 1}
    return [
        record(run, 0, "started", {}, host="h", agent="goose/1.56.0"),
        record(run, 1, "completed", counts, inputTokens=1200, outputTokens=340),
        record(run, 2, "ended", counts, exitCode=1, inputTokens=1200, outputTokens=340, host="h", agent="goose/1.56.0"),
    ]


def publish_events(r, settings, events) -> None:
    for e in events:
        stream = settings.layout.events_partition(settings.layout.shard_of(e["runId"]))
        r.xadd(stream, {"eventId": e["eventId"], "runId": e["runId"], "seq": e["seq"], "type": e["type"], "data": orjson.dumps(e)})


def publish_records(r, settings, records) -> None:
    for rec in records:
        stream = settings.layout.runs_partition(settings.layout.shard_of(rec["runId"]))
        r.xadd(stream, {"recordId": rec["recordId"], "runId": rec["runId"], "seq": rec["seq"], "state": rec["state"],
                        "data": orjson.dumps(rec)})


async def drain(exporter: TraceExporter, streams: list[str] | None = None, rounds: int = 3) -> int:
    """Read our group like the FastStream subscribers do and hand each batch to the exporter."""
    n = 0
    for _ in range(rounds):
        for stream in streams or exporter.streams():
            got = await exporter.client.xreadgroup(exporter.group, exporter.consumer, {stream: ">"}, count=500)
            for _s, entries in got or []:
                if entries:
                    n += len(entries)
                    await exporter.handler_for(stream)(stream, [e for e, _ in entries], [f for _, f in entries])
    return n


def make_exporter(settings, endpoint: str) -> TraceExporter:
    exporter = TraceExporter(settings, async_client(settings), HttpSink(OTLPSpanExporter(endpoint=endpoint)), MappingConfig(),
                             consumer="test")
    return exporter


def pending(r, settings, stream) -> int:
    return r.xpending(stream, settings.otlp_group)["pending"]


def metric(exporter: TraceExporter, name: str, **labels) -> float:
    value = exporter.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


@pytest.fixture
def receiver():
    with RunningReceiver() as rec:
        yield rec


@pytest.fixture
def r(settings):
    client = sync_client(settings)
    yield client
    client.close()


def by_name(spans):
    return {s.name: s for s in spans}


def test_a_run_becomes_one_trace_and_everything_is_acked(settings, r, receiver):
    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        publish_events(r, settings, run_events(RUN_A))
        publish_records(r, settings, run_records(RUN_A))
        await drain(exporter)
        await exporter.client.aclose()
        return exporter

    exporter = asyncio.run(go())
    spans = by_name(receiver.spans)
    assert set(spans) == {"invoke_agent goose", "execute_tool developer__text_editor", "execute_tool developer__shell"}
    root = spans["invoke_agent goose"]
    trace = f"{m.trace_id_of(RUN_A):032x}"
    assert root.trace_id == trace and root.parent_span_id == ""
    for name in ("execute_tool developer__text_editor", "execute_tool developer__shell"):
        assert spans[name].trace_id == trace and spans[name].parent_span_id == root.span_id
    assert spans["execute_tool developer__shell"].attributes["error.type"] == "tool_error"
    assert root.attributes["gen_ai.usage.input_tokens"] == 1200 and root.attributes["error.type"] == "agent_exit"
    assert [name for name, _ in root.events] == ["goose_ingest.agent", "goose_ingest.error"]
    assert root.resource["service.name"] == "goose-ingest"
    for stream in exporter.streams():
        assert pending(r, settings, stream) == 0
    assert r.hgetall(settings.layout.export_group_state(EXPORTER, settings.otlp_group, RUN_A)) == {b"done": b"ended"}
    assert r.zcard(settings.layout.export_group_open_runs(EXPORTER, settings.otlp_group, 0)) == 0
    assert metric(exporter, "goose_ingest_otlp_spans_exported_total", kind="tool") == 2
    assert metric(exporter, "goose_ingest_otlp_roots_total", reason="ended") == 1


def test_end_record_before_the_events_waits_for_every_event(settings, r, receiver):
    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        publish_records(r, settings, run_records(RUN_A))
        publish_events(r, settings, run_events(RUN_A)[:2])
        await drain(exporter, [settings.layout.runs_partition(0)])
        await drain(exporter, [settings.layout.events_partition(0)])
        assert not any(s.name.startswith("invoke_agent") for s in receiver.spans), "root out before its events"
        publish_events(r, settings, run_events(RUN_A)[2:])
        await drain(exporter)
        await exporter.client.aclose()

    asyncio.run(go())
    roots = [s for s in receiver.spans if s.name.startswith("invoke_agent")]
    assert len(roots) == 1
    assert [name for name, _ in roots[0].events] == ["goose_ingest.agent", "goose_ingest.error"]


def test_unreachable_collector_loses_nothing_and_acks_nothing_until_it_answers(settings, r):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    started: dict = {}

    def start_later():
        time.sleep(3.0)
        started["rx"] = RunningReceiver(port)

    async def go():
        exporter = make_exporter(settings, endpoint)
        await exporter.ensure_groups()
        publish_events(r, settings, run_events(RUN_A))
        stream = settings.layout.events_partition(0)
        task = asyncio.create_task(drain(exporter, [stream], rounds=1))
        # The SDK retries inside one export call for up to OTEL_EXPORTER_OTLP_TIMEOUT (10 s):
        # wait for that first failed attempt to come back.
        deadline = time.monotonic() + 60
        while metric(exporter, "goose_ingest_otlp_spans_failed_total", kind="tool") == 0:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.2)
        assert not task.done()
        assert pending(r, settings, stream) == 4, "entries must stay pending while nothing is exported"
        assert exporter.collector_ok is False
        assert metric(exporter, "goose_ingest_otlp_spans_failed_total", kind="tool") >= 2
        threading.Thread(target=start_later, daemon=True).start()
        await asyncio.wait_for(task, timeout=90)
        assert pending(r, settings, stream) == 0
        assert exporter.collector_ok is True
        await exporter.client.aclose()
        return exporter

    try:
        exporter = asyncio.run(go())
        rx = started["rx"].receiver
        assert {s.name for s in rx.spans} == {"execute_tool developer__text_editor", "execute_tool developer__shell"}
        assert metric(exporter, "goose_ingest_otlp_spans_exported_total", kind="tool") == 2
    finally:
        if "rx" in started:
            started["rx"].close()


def test_a_slow_collector_never_doubles_a_root(settings, r):
    """A collector at 500 ms per request, a batch in flight longer than CLAIM_IDLE_MS: the reclaim
    beside it does not take the exporter's own in-flight entries back (issue 20, finding 5)."""
    slow = settings.model_copy(update={"claim_idle_ms": 200})  # shorter than one request: the race is sure
    runs = [f"slow/{i}" for i in range(4)]
    with RunningReceiver() as rx:
        rx.delay_s = 0.5

        async def go():
            exporter = make_exporter(slow, rx.endpoint)
            await exporter.ensure_groups()
            publish_events(r, slow, [e for run in runs for e in run_events(run)])
            publish_records(r, slow, [rec for run in runs for rec in run_records(run)])
            await drain(exporter, exporter.layout.events_partitions(), rounds=1)
            task = asyncio.create_task(drain(exporter, exporter.layout.runs_partitions(), rounds=1))
            reclaimed = 0
            while not task.done():
                await asyncio.sleep(0.25)
                for stream in exporter.streams():
                    reclaimed += await exporter.reclaim(stream, exporter.handler_for(stream))
            await task
            await exporter.client.aclose()
            return reclaimed

        reclaimed = asyncio.run(go())
        roots = [s.attributes["gen_ai.conversation.id"] for s in rx.spans if s.name.startswith("invoke_agent")]
    assert sorted(roots) == sorted(runs), roots  # each root once
    assert reclaimed == 0


def test_an_outage_answer_is_retried_never_dead_lettered(settings, r):
    """401, 403, 404 from a collector (an expired token, a wrong path) for a while: nothing is
    acknowledged or dead-lettered, the exporter is not ready, and once the collector accepts again
    every span arrives (issue 20, finding 4)."""
    with RunningReceiver() as rx:
        async def go():
            exporter = make_exporter(settings, rx.endpoint)
            await exporter.ensure_groups()
            publish_events(r, settings, run_events(RUN_A) + run_events(RUN_B))
            publish_records(r, settings, run_records(RUN_A) + run_records(RUN_B))
            rx.fail_status = 401
            task = asyncio.create_task(drain(exporter))
            seen_not_ready = False
            for status in (401, 403, 404, 405, 407):
                rx.fail_status = status
                failed = rx.failed
                while rx.failed == failed:  # at least one attempt meets this status
                    await asyncio.sleep(0.05)
                seen_not_ready = seen_not_ready or not exporter.collector_ok
                assert not task.done()
                assert all(r.xlen(s) == 0 for s in settings.layout.export_deadletter_partitions(EXPORTER))
            rx.fail_status = None
            await asyncio.wait_for(task, timeout=120)
            await drain(exporter)
            await exporter.client.aclose()
            return exporter, seen_not_ready

        exporter, seen_not_ready = asyncio.run(go())
        assert seen_not_ready
        roots = {s.attributes["gen_ai.conversation.id"] for s in rx.spans if s.name.startswith("invoke_agent")}
        assert roots == {RUN_A, RUN_B}
    assert all(r.xlen(s) == 0 for s in settings.layout.export_deadletter_partitions(EXPORTER))
    for stream in exporter.streams():
        assert pending(r, settings, stream) == 0
    assert metric(exporter, "goose_ingest_otlp_dead_letters_total", reason="otlp-rejected") == 0
    assert metric(exporter, "goose_ingest_otlp_spans_failed_total", kind="tool") > 0


def test_a_rejected_run_is_dead_lettered_without_taking_the_others_down(settings, r):
    with RunningReceiver(reject_runs={RUN_B}) as rx:
        async def go():
            exporter = make_exporter(settings, rx.endpoint)
            await exporter.ensure_groups()
            publish_events(r, settings, run_events(RUN_A) + run_events(RUN_B))
            publish_records(r, settings, run_records(RUN_A) + run_records(RUN_B))
            await drain(exporter)
            # later entries of the dead run are acked, not exported
            publish_events(r, settings, [event(RUN_B, 4, "list", path="/", tool="developer__tree", toolCallId="x", durationMs=1)])
            await drain(exporter)
            await exporter.client.aclose()
            return exporter

        exporter = asyncio.run(go())
        runs = {s.attributes["gen_ai.conversation.id"] for s in rx.spans}
        assert runs == {RUN_A}
        assert len([s for s in rx.spans if s.name.startswith("invoke_agent")]) == 1
    (dl,) = [fields for _, fields in r.xrange(settings.layout.export_deadletter_partition(EXPORTER, 0))]
    assert dl[b"reason"] == b"otlp-rejected" and dl[b"runId"] == RUN_B.encode()
    assert dl[b"detail"].startswith(b"HTTP 400")
    # the refused spans are kept, as the OTLP/HTTP request body, for a resend after a fix
    assert dl[b"contentType"] == b"application/x-protobuf"
    assert dl[b"raw.runId"] == RUN_B.encode()  # the entry that completed the run, as it was
    kept = decode_request(dl[b"otlp"])
    assert kept and {s.attributes["gen_ai.conversation.id"] for s in kept} == {RUN_B}
    assert r.hget(settings.layout.export_group_state(EXPORTER, settings.otlp_group, RUN_B), "dead").startswith(b"HTTP 400")
    # the dead letter is what contracts/asyncapi.json says it is: every required field, no other
    spec = orjson.loads((Path(__file__).resolve().parents[2] / "contracts" / "asyncapi.json").read_bytes())
    payload = spec["components"]["messages"]["OtlpDeadLetter"]["payload"]
    names = {k.decode() for k in dl if not k.startswith(b"raw.")}  # raw.*: the additional properties
    assert set(payload["required"]) <= names <= set(payload["properties"]), names
    assert "raw.<field>" in payload["additionalProperties"]["description"]
    assert dl[b"reason"].decode() in payload["properties"]["reason"]["enum"] and dl[b"group"] == settings.otlp_group.encode()
    for stream in exporter.streams():
        assert pending(r, settings, stream) == 0
    assert metric(exporter, "goose_ingest_otlp_dead_letters_total", reason="otlp-rejected") == 1
    assert metric(exporter, "goose_ingest_otlp_spans_dead_lettered_total", kind="tool") == 1


def test_bad_entries_become_root_span_events_or_dead_letters_never_a_crash(settings, r, receiver):
    stream = settings.layout.events_partition(0)

    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        publish_events(r, settings, [event(RUN_A, 0, "agent", message="hi"), event(RUN_A, 1, "plan", steps=["x"])])
        r.xadd(stream, {"eventId": f"{RUN_A}:2", "runId": RUN_A, "seq": 2, "type": "read", "data": b"{not json"})
        r.xadd(stream, {"eventId": f"{RUN_A}:3", "runId": RUN_A, "seq": 3, "type": "read",
                        "data": orjson.dumps({**event(RUN_A, 3, "read"), "timestamp": "yesterday"})})
        r.xadd(stream, {"junk": "no run at all"})
        publish_records(r, settings, [record(RUN_A, 0, "ended", {"agent": 1, "plan": 1, "read": 2}, exitCode=0)])
        await drain(exporter)
        await exporter.client.aclose()
        return exporter

    exporter = asyncio.run(go())
    (root,) = [s for s in receiver.spans if s.name.startswith("invoke_agent")]
    names = [name for name, _ in root.events]
    assert names == ["goose_ingest.agent", "goose_ingest.unknown_type", "goose_ingest.unmappable", "goose_ingest.unmappable"]
    assert root.status_code == 1  # OK: exit 0
    (dl,) = [f for _, f in r.xrange(settings.layout.export_deadletter_partition(EXPORTER, 0))]
    assert dl[b"reason"] == b"invalid-entry"
    assert dl[b"raw.junk"] == b"no run at all"  # the entry as it was: resent after a fix
    assert pending(r, settings, stream) == 0
    assert metric(exporter, "goose_ingest_otlp_unmappable_events_total") == 2


def test_a_dead_letter_and_its_acknowledgement_are_one_step(settings, r, receiver):
    """Through the one writer (services/streams/deadletter.py): a dead letter that cannot be written
    (its stream holds another type) acknowledges nothing; written, it carries the entry's raw.* and
    the entry is acknowledged; the step trims dead letters older than DEADLETTER_RETENTION_HOURS."""
    s = settings.model_copy(update={"deadletter_retention_hours": 1.0})
    stream = s.layout.events_partition(0)
    dead = s.layout.export_deadletter_partition(EXPORTER, 0)

    async def go():
        exporter = make_exporter(s, receiver.endpoint)
        await exporter.ensure_groups()
        junk = r.xadd(stream, {"junk": "no run at all"}).decode()
        r.set(dead, "not a stream")
        with pytest.raises(Exception, match="WRONGTYPE"):
            await drain(exporter, [stream], rounds=1)
        assert pending(r, s, stream) == 1  # no dead letter, no acknowledgement
        r.delete(dead)
        old_ms = int((time.time() - 3 * 3600) * 1000)
        for i in range(250):
            r.xadd(dead, {"reason": "old"}, id=f"{old_ms}-{i}")
        got = await exporter.client.xreadgroup(exporter.group, exporter.consumer, {stream: "0"}, count=10)
        [(_, entries)] = got
        await exporter.handle_events(stream, [e for e, _ in entries], [f for _, f in entries])
        await exporter.client.aclose()
        return junk

    junk = asyncio.run(go())
    assert pending(r, s, stream) == 0
    letters = r.xrange(dead)
    assert len(letters) < 251  # the old ones' full nodes trimmed by the same step
    dl = letters[-1][1]
    assert dl[b"sourceId"] == junk.encode() and dl[b"raw.junk"] == b"no run at all"


def test_a_poison_entry_is_dead_lettered_with_its_fields_and_acknowledged(settings, r, receiver):
    s = settings.model_copy(update={"claim_idle_ms": 100, "max_deliveries": 1})
    stream = s.layout.events_partition(0)

    async def go():
        exporter = make_exporter(s, receiver.endpoint)
        await exporter.ensure_groups()
        publish_events(r, s, [event(RUN_A, 0, "agent", message="hi")])
        for start in (">", "0"):  # delivered twice to a consumer that died: past MAX_DELIVERIES=1
            await exporter.client.xreadgroup(s.otlp_group, "dead-replica", {stream: start}, count=10)
        await asyncio.sleep(0.3)
        assert await exporter.reclaim(stream, exporter.handler_for(stream)) == 1
        await exporter.client.aclose()

    asyncio.run(go())
    assert pending(r, s, stream) == 0
    (dl,) = [f for _, f in r.xrange(s.layout.export_deadletter_partition(EXPORTER, 0))]
    assert dl[b"reason"] == b"max-deliveries" and dl[b"raw.runId"] == RUN_A.encode()
    assert orjson.loads(dl[b"raw.data"])["message"] == "hi"


def test_a_run_that_never_ends_is_closed_by_the_timeout_and_marked(settings, r, receiver):
    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        publish_records(r, settings, run_records(RUN_A)[:1])
        publish_events(r, settings, run_events(RUN_A)[:2])
        await drain(exporter)
        assert await exporter.close_idle_roots() == 0  # not idle yet (default timeout)
        later = int(time.time() * 1000) + int(settings.otlp_root_timeout_s * 1000) + 1000
        assert await exporter.close_idle_roots(now_ms=later) == 1
        assert await exporter.close_idle_roots(now_ms=later) == 0
        await exporter.client.aclose()
        return exporter

    exporter = asyncio.run(go())
    (root,) = [s for s in receiver.spans if s.name.startswith("invoke_agent")]
    assert root.attributes["goose_ingest.root.closed_by"] == "timeout"
    assert root.attributes["error.type"] == "root_timeout"
    assert metric(exporter, "goose_ingest_otlp_roots_total", reason="timeout") == 1


def test_a_re_export_produces_the_same_ids(settings, r, receiver):
    async def go(group: str):
        s = settings.model_copy(update={"otlp_group": group})
        exporter = make_exporter(s, receiver.endpoint)
        await exporter.ensure_groups()
        await drain(exporter)
        await exporter.client.aclose()

    publish_events(r, settings, run_events(RUN_A))
    publish_records(r, settings, run_records(RUN_A))
    asyncio.run(go("first"))
    first = sorted((s.trace_id, s.span_id, s.name) for s in receiver.spans)
    receiver.spans.clear()
    # a re-export from scratch is a new group, nothing else: the first group's state (done, with
    # its TTL) stays and does not hold the new group back (issue 20 finding 6)
    asyncio.run(go("second"))
    assert sorted((s.trace_id, s.span_id, s.name) for s in receiver.spans) == first
    assert len(first) == 3
    assert r.hget(settings.layout.export_group_state(EXPORTER, "first", RUN_A), "done") == b"ended"


def test_two_groups_for_two_backends_each_export_every_root(settings, r):
    """Two OTLP exporters side by side, each its group and its collector, reading the same topics
    interleaved batch by batch: each gets every root, tool span and span event (issue 20 item 5)."""
    runs = [f"host/run-{i}" for i in range(12)]

    async def go(rx1, rx2):
        pairs = []
        for group, rx in (("backend-1", rx1), ("backend-2", rx2)):
            pairs.append(make_exporter(settings.model_copy(update={"otlp_group": group, "batch_size": 7}), rx.endpoint))
        for exporter in pairs:
            await exporter.ensure_groups()
        for run in runs:
            publish_events(r, settings, run_events(run))
            publish_records(r, settings, run_records(run))
        for _ in range(12):  # small batches, alternating: both exporters see every run half-done
            for exporter in pairs:
                for stream in exporter.streams():
                    got = await exporter.client.xreadgroup(exporter.group, exporter.consumer, {stream: ">"}, count=7)
                    for _s, entries in got or []:
                        await exporter.handler_for(stream)(stream, [e for e, _ in entries], [f for _, f in entries])
        for exporter in pairs:
            await exporter.client.aclose()

    with RunningReceiver() as rx1, RunningReceiver() as rx2:
        asyncio.run(go(rx1, rx2))
        got = [sorted((s.trace_id, s.span_id, s.name, len(s.events)) for s in rx.spans) for rx in (rx1, rx2)]
    roots = [[s for s in g if s[2] == "invoke_agent goose"] for g in got]
    assert len(roots[0]) == len(runs) and all(n_events == 2 for *_, n_events in roots[0])
    assert got[0] == got[1] and len(got[0]) == 3 * len(runs)  # no root twice, none missing


def test_open_runs_of_an_exporter_from_before_are_adopted_by_the_group(settings, r, receiver):
    """An upgrade: a run half-exported under the state shared by every group finishes under the
    group's own state, with the events the old state held."""
    layout = settings.layout
    events, records = run_events(RUN_A), run_records(RUN_A)
    legacy = layout.export_state(EXPORTER, RUN_A)
    stored = m.span_event(events[0], MappingConfig()).dumps()
    r.hset(legacy, mapping={"e:0": stored, "t:1": b"1", "n": 2, "first": 1, "last": 2,
                            "r:0": orjson.dumps(records[0])})
    r.zadd(layout.export_open_runs(EXPORTER, 0), {RUN_A: 1})

    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        assert await exporter.adopt_legacy_state() == 1
        assert await exporter.adopt_legacy_state() == 0
        # seq 1 again (a redelivery across the upgrade) must count once: the root waits for seq 3
        publish_events(r, settings, events[1:3])
        publish_records(r, settings, records[1:])
        await drain(exporter)
        assert not [s for s in receiver.spans if s.name == "invoke_agent goose"]
        publish_events(r, settings, events[3:])
        await drain(exporter)
        await exporter.client.aclose()

    asyncio.run(go())
    roots = [s for s in receiver.spans if s.name == "invoke_agent goose"]
    assert len(roots) == 1 and [name for name, _ in roots[0].events] == ["goose_ingest.agent", "goose_ingest.error"]
    assert not r.exists(legacy) and r.zcard(layout.export_open_runs(EXPORTER, 0)) == 0
    assert r.hget(layout.export_group_state(EXPORTER, settings.otlp_group, RUN_A), "done") == b"ended"


def test_entries_left_pending_by_a_dead_replica_are_reclaimed(settings, r, receiver):
    s = settings.model_copy(update={"claim_idle_ms": 100})

    async def go():
        exporter = make_exporter(s, receiver.endpoint)
        await exporter.ensure_groups()
        publish_events(r, s, run_events(RUN_A))
        stream = s.layout.events_partition(0)
        # another consumer read them and died
        await exporter.client.xreadgroup(s.otlp_group, "dead-replica", {stream: ">"}, count=100)
        await asyncio.sleep(0.3)
        assert await exporter.reclaim(stream, exporter.handler_for(stream)) == 4
        assert pending(r, s, stream) == 0
        await exporter.client.aclose()

    asyncio.run(go())
    assert len([sp for sp in receiver.spans if sp.name.startswith("execute_tool")]) == 2


def test_on_a_redis_cluster_state_and_scripts_stay_in_the_run_slot(cluster_settings, receiver):
    s = cluster_settings  # its namespace is wiped by the fixture
    r = sync_client(s)
    try:
        async def go():
            exporter = make_exporter(s, receiver.endpoint)
            await exporter.ensure_groups()
            for run in (RUN_A, RUN_B):
                publish_events(r, s, run_events(run))
                publish_records(r, s, run_records(run))
            await drain(exporter)
            await exporter.client.aclose()

        asyncio.run(go())
        roots = {sp.attributes["gen_ai.conversation.id"] for sp in receiver.spans if sp.name.startswith("invoke_agent")}
        assert roots == {RUN_A, RUN_B}
        for run in (RUN_A, RUN_B):
            assert r.hget(s.layout.export_group_state(EXPORTER, s.otlp_group, run), "done") == b"ended"
    finally:
        r.close()


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "no broker configured"),
    ({"GOOSE_INGEST_REDIS_URL": "redis://127.0.0.1:1/0", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "not supported"),
])
def test_cli_configuration_errors_are_one_line_exit_2(env, expected):
    import os
    import subprocess
    import sys

    from tests.support.fixtures import REPO

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GOOSE_INGEST_", "OTEL_"))}
    out = subprocess.run([sys.executable, "-m", "services.cli", "export", "otlp"], cwd=REPO, env={**clean, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("goose-ingest export: ") and expected in line


def test_grpc_without_the_extra_is_a_clear_configuration_error(monkeypatch):
    import sys

    from services.export.otlp.sink import SinkConfigError, sink_from_env

    # as if the otlp-grpc extra were not installed (a None entry makes the import fail)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(SinkConfigError, match=r"goose-ingest\[otlp-grpc\]"):
        sink_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_the_export_state_of_a_long_run_stays_bounded(settings, r, receiver, monkeypatch):
    """Issue 22 §3: the per-run state holds at most the root's event limit, a byte cap and a window
    of seen-marks, however many events the run has; the root carries its last events, each event is
    still counted once (a redelivered batch does not close the root early), the rest is counted."""
    from opentelemetry.sdk.trace import SpanLimits

    from services.export.otlp import run_state

    monkeypatch.setattr(run_state, "SEEN_WINDOW", 40)
    n, ring = 1_200, 16
    monkeypatch.setattr(run_state, "STATE_EVENT_BYTES", 300 * ring)  # 300 bytes a slot
    # even seqs carry a long message: past a slot's share of the byte cap
    events = [event(RUN_A, q, "warning", message=f"step {q}" + ("." * 400 if q % 2 == 0 else "")) for q in range(n)]
    lost = 7  # never arrives: the marks above it must not pile up
    ended = record(RUN_A, 1, "ended", {"warning": n})

    async def go():
        exporter = TraceExporter(settings, async_client(settings), HttpSink(OTLPSpanExporter(endpoint=receiver.endpoint)),
                                 MappingConfig(limits=SpanLimits(max_events=ring)), consumer="test")
        await exporter.ensure_groups()
        key = exporter.state_key(RUN_A)
        publish_records(r, settings, [record(RUN_A, 0, "started", {}), ended])
        sizes = []
        for start in range(0, n, 100):
            publish_events(r, settings, [e for e in events[start:start + 100] if e["seq"] != lost])
            await drain(exporter, rounds=1)
            sizes.append(r.hlen(key))
        assert max(sizes) <= ring + 40 + 100 + 12, sizes  # ring + window + one batch of marks + counters
        assert sizes[-1] <= ring + 12, sizes  # the watermark jumped past the lost seq: no marks left
        assert not receiver.spans  # n = 1,199 < 1,200: waits for the lost event (or the timeout)
        # a redelivery of seen events (below and above the watermark) counts nothing
        publish_events(r, settings, events[lost + 1:lost + 3] + events[-2:])
        await drain(exporter, rounds=1)
        assert int(r.hget(key, "n")) == n - 1 and not receiver.spans
        state_bytes = r.memory_usage(key)
        assert await exporter.finish_root(RUN_A, "timeout", "-", timeout=True)
        await exporter.client.aclose()
        return exporter, state_bytes

    exporter, state_bytes = asyncio.run(go())
    assert state_bytes < 20_000
    (root,) = [s for s in receiver.spans if s.name == "invoke_agent goose"]
    kept = [(name, attrs) for name, attrs in root.events]
    assert len(kept) == ring
    seqs = sorted(int(attrs["goose_ingest.event.id"].rsplit(":", 1)[1]) for _, attrs in kept)
    assert seqs == list(range(n - ring, n))  # the last `ring` events
    # the long ones keep name, time and ids, not their attributes; the short ones are whole
    capped = {int(attrs["goose_ingest.event.id"].rsplit(":", 1)[1]) for _, attrs in kept
              if attrs.get("goose_ingest.reason") == "state-bytes-cap"}
    assert capped == {q for q in seqs if q % 2 == 0}
    assert metric(exporter, "goose_ingest_otlp_state_capped_events_total") >= n // 2
    assert metric(exporter, "goose_ingest_otlp_dropped_span_events_total") == n - 1 - ring


def test_a_broker_at_maxmemory_costs_no_delivery_and_loses_or_doubles_nothing(settings, private_redis, receiver):
    """Issue 20 item 1 / finding 3: Redis refuses writes (maxmemory, noeviction) while a batch is
    being exported; a replica's reclaim runs all along. Then memory is freed: every root and tool
    span exported once, nothing dead-lettered, nothing pending.

    At defaults this takes CLAIM_IDLE_MS x MAX_DELIVERIES = 30 s x 5 = 150 s of refusal. Here the
    claim idle is 400 ms and MAX_DELIVERIES 2, and the refusal lasts 4 s, five times their product:
    what decides the outcome is whether a refused attempt is counted as a delivery, i.e. how many
    reclaim rounds the refusal spans, not wall time; 4 s spans ten rounds against the two allowed."""
    import redis as redis_lib

    s = settings.model_copy(update={"redis_url": private_redis.url, "claim_idle_ms": 400, "max_deliveries": 2})
    r = redis_lib.Redis.from_url(private_redis.url)
    runs = [f"oom/run-{i}" for i in range(4)]
    for run in runs:
        publish_events(r, s, run_events(run))
        publish_records(r, s, run_records(run))

    async def go():
        a = TraceExporter(s, async_client(s), HttpSink(OTLPSpanExporter(endpoint=receiver.endpoint)), MappingConfig(),
                          consumer="a")
        b = TraceExporter(s, async_client(s), HttpSink(OTLPSpanExporter(endpoint=receiver.endpoint)), MappingConfig(),
                          consumer="b")  # a replica: its housekeeping reclaims whatever looks abandoned
        await a.ensure_groups()
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", "1")
        done = asyncio.Event()

        async def consume():  # as FastStream's subscriber: a handler that raises leaves its batch pending
            while not done.is_set():
                try:
                    await drain(a, rounds=1)
                except Exception:  # noqa: BLE001 -- the subscriber logs and goes on
                    pass
                await asyncio.sleep(0.05)

        async def housekeeping():
            while not done.is_set():
                for stream in b.streams():
                    try:
                        await b.reclaim(stream, b.handler_for(stream))
                    except Exception:  # noqa: BLE001 -- housekeeping logs and goes on
                        pass
                await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(consume()), asyncio.create_task(housekeeping())]
        await asyncio.sleep(4)
        assert not a.broker_ok and metric(a, "goose_ingest_otlp_broker_refusals_total") > 0
        r.config_set("maxmemory", "0")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([x for x in receiver.spans if x.name.startswith("invoke_agent")]) < 4:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        done.set()
        await asyncio.gather(*tasks)
        for exporter in (a, b):
            await exporter.client.aclose()
        return a

    a = asyncio.run(go())
    names = [(x.trace_id, x.span_id) for x in receiver.spans]
    assert len(names) == len(set(names)) == 3 * len(runs)  # every root and tool span, once
    assert all(r.xlen(dl) == 0 for dl in s.layout.export_deadletter_partitions(EXPORTER) if r.exists(dl))
    assert all(pending(r, s, stream) == 0 for stream in a.streams())
    assert a.broker_ok


def test_a_collector_outage_longer_than_the_claim_idle_is_no_delivery_either(settings, r):
    """The backoff between collector retries grows past CLAIM_IDLE_MS (here 1.5 s against 300 ms):
    the held batch's claim is still refreshed within it, so a replica's reclaim never takes it over
    (which counted a delivery per round and, with MAX_DELIVERIES 2, dead-lettered it; and both
    replicas sent its spans once the collector was back)."""
    s = settings.model_copy(update={"claim_idle_ms": 300, "max_deliveries": 2, "otlp_retry_max_s": 1.5})
    runs = [f"slow/run-{i}" for i in range(3)]
    for run in runs:
        publish_events(r, s, run_events(run))
        publish_records(r, s, run_records(run))
    with RunningReceiver() as rx:
        async def go():
            a, b = make_exporter(s, rx.endpoint), make_exporter(s, rx.endpoint)
            a.consumer, b.consumer = "a", "b"
            await a.ensure_groups()
            rx.fail_status = 503
            done = asyncio.Event()

            async def consume():
                while not done.is_set():
                    try:
                        await drain(a, rounds=1)
                    except Exception:  # noqa: BLE001 -- the subscriber logs and goes on
                        pass
                    await asyncio.sleep(0.05)

            async def housekeeping():
                while not done.is_set():
                    for stream in b.streams():
                        try:
                            await b.reclaim(stream, b.handler_for(stream))
                        except Exception:  # noqa: BLE001 -- housekeeping logs and goes on
                            pass
                    await asyncio.sleep(0.1)

            tasks = [asyncio.create_task(consume()), asyncio.create_task(housekeeping())]
            await asyncio.sleep(4)
            rx.fail_status = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len([x for x in rx.spans if x.name.startswith("invoke_agent")]) < len(runs):
                await asyncio.sleep(0.1)
            await asyncio.sleep(2)  # time for a replica's doubled batch to arrive, if any
            done.set()
            await asyncio.gather(*tasks)
            for exporter in (a, b):
                await exporter.client.aclose()
            return a

        a = asyncio.run(go())
        ids = [(x.trace_id, x.span_id) for x in rx.spans]
    assert len(ids) == len(set(ids)) == 3 * len(runs)
    assert all(r.xlen(dl) == 0 for dl in s.layout.export_deadletter_partitions(EXPORTER))
    assert all(pending(r, s, stream) == 0 for stream in a.streams())


def _readyz(port: int) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("how", ["stopped", "terminal-error"])
def test_an_exporter_whose_subscriber_died_says_so_and_exits_non_zero(settings, receiver, how):
    """The one watch (services/streams/watch.py), as the worker's: a subscriber that stops on its own
    (stopped; or FastStream's terminal read error, which stops it and ends the app as if asked)
    turns /readyz false with the stream in the reason, and the exporter's exit status is 1."""
    from faststream.redis import StreamClaimUnsupportedError

    from services.export.otlp.app import build_app
    from services.export.otlp.metrics import OtlpMetrics

    s = settings.model_copy(update={"metrics_port": 0})
    sink = HttpSink(OTLPSpanExporter(endpoint=receiver.endpoint))

    async def go():
        app, runtime = build_app(s, sink, MappingConfig(), OtlpMetrics())
        task = asyncio.create_task(app.run())
        deadline = time.monotonic() + 30
        while not (runtime.watch.consuming and runtime.server is not None and runtime.readiness.readiness()):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(_readyz, runtime.server.port) == (200, "ready\n")
        stream, sub = runtime.watch.readers[0]
        if how == "stopped":
            await sub.stop()  # a subscriber that stops for any reason but a shutdown
            status = await asyncio.to_thread(_readyz, runtime.server.port)
        else:
            async def terminal(**_kwargs):
                raise StreamClaimUnsupportedError("the broker cannot claim")

            sub._xreadgroup = terminal  # FastStream stops the subscriber and exits the app (exit 0 before)
            status = None
        await asyncio.wait_for(task, timeout=30)
        return stream, status, runtime

    stream, status, runtime = asyncio.run(go())
    if status is not None:
        assert status[0] == 503 and stream in status[1] and "status 1" in status[1], status
    assert runtime.exit_code == 1
    ready = runtime.readiness.readiness()
    assert not ready and stream in ready.reason
