"""Poison entries never cost another run its data: each kind mixed with innocent runs through a real
worker process (default settings but a short idle timeout), and arbitrary field maps through the real
batch path in process."""

from __future__ import annotations

import asyncio

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contracts.topics import TopicEntry
from services.broker.connect import async_client
from services.replay.command import compare
from services.streams.groups import ensure_groups
from services.tap.publisher import Publisher
from services.worker.processor import BatchProcessor
from tests.support.fixtures import TRANSCRIPTS
from tests.support.pipeline import (
    dead_letters,
    ended_runs,
    events_by_run,
    expected_events,
    start_worker,
    stop,
    topic,
    wait_until,
)

TEXT = '{"type":"message","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"%s"}]}}'
DEEP = ("[" * 300 + "]" * 300)  # 600 bytes: beyond orjson's and a naive recursive walker's depth


def _poisons(run: str) -> list[dict[bytes, bytes]]:
    """One poison entry (or a small run around one) per kind; seq 0 of `run` is good."""
    r = run.encode()
    return [
        {b"run": r, b"seq": b"0", b"ts": b"1", b"line": (TEXT % "good start").encode()},
        {b"run": r, b"seq": b"--5", b"ts": b"1", b"line": b"x"},
        {b"run": r, b"seq": b"5" * 5000, b"ts": b"1", b"line": b"x"},
        {b"run": r, b"seq": b"1", b"ts": "²".encode(), b"line": b"x"},
        {b"run": r, b"seq": b"2", b"ts": b"1", b"line": DEEP.encode()},
        {b"run": r, b"seq": b"3", b"ts": b"1", b"line": b'{"type":"message","n":' + b"9" * 400 + b"}"},
        {b"run": r, b"seq": b"4", b"ts": b"1", b"kind": b"abandon", b"through": b"9" * 30,
         b"missing": b"[" * 500 + b"]" * 500},
        {b"run": r, b"seq": b"5", b"ts": b"1", b"kind": b"eof", b"exit": b"1" + b"0" * 30},
        {b"run": r, b"seq": b"6", b"ts": b"1", b"kind": b"eof", b"exit": b"0"},
    ]


@pytest.mark.e2e
def test_each_kind_of_poison_mixed_with_innocent_runs_costs_them_nothing(settings, tmp_path):
    r = redis.Redis.from_url(settings.redis_url)
    innocents = {f"innocent/{path.stem}": path.read_bytes().splitlines() for path in TRANSCRIPTS}
    poisoned = [f"poison/{i}" for i in range(settings.shards)]
    # The poison goes first on every shard, so it shares batches with the innocent runs.
    for run in poisoned:
        for fields in _poisons(run):
            r.xadd(settings.layout.raw_stream(settings.layout.shard_of(run)), fields)
    # A run whose stored state is unusable (another type): only its own entries are dead-lettered.
    broken = "poison/foreign-state"
    r.set(settings.layout.run_state(broken), "not a hash")
    r.xadd(settings.layout.raw_stream(settings.layout.shard_of(broken)),
           {b"run": broken.encode(), b"seq": b"0", b"ts": b"1", b"line": b"x"})
    for run, lines in innocents.items():
        with Publisher(settings, run, {"host": "innocent"}) as pub:
            for line in lines:
                pub.add_line(line)
            pub.add_eof(0)
    worker = start_worker(settings, tmp_path / "worker.log", GOOSE_INGEST_SWEEP_INTERVAL_S="5",
                          GOOSE_INGEST_RUN_IDLE_TIMEOUT_S="2",
                          GOOSE_INGEST_CLAIM_IDLE_MS="30000", GOOSE_INGEST_BATCH_SIZE="500")
    try:
        wait_until(lambda: set(innocents) | set(poisoned) <= ended_runs(settings), timeout=60)
        # Nothing left pending: no poison is waiting for redeliveries.
        wait_until(lambda: sum(r.xpending(s, settings.group)["pending"] for s in settings.layout.raw_streams()) == 0,
                   timeout=30)
    finally:
        stop(worker)
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]
    published = events_by_run(settings)
    for run in innocents:
        assert published[run] == expected_events(settings, run), run
    reasons = {}
    for d in dead_letters(settings):
        reasons.setdefault(d["reason"].decode(), []).append(d)
    assert "max-deliveries" not in reasons
    assert len(reasons["invalid-entry"]) == 5 * len(poisoned)  # --5, 5000 digits, ², forged marker, exit 10^30
    assert [d["raw.run"] for d in reasons["processing-error"]] == [broken.encode()]
    # Every seq a poisoned run never got is in its final record and announced by a warning.
    records = [rec for rec in topic(settings, settings.layout.runs_partitions()) if rec["runId"] in poisoned]
    for rec in (rec for rec in records if rec["state"] in ("ended", "abandoned")):
        assert rec["missing"] == [[1, 1], [4, 5]], rec
    for run in poisoned:
        warned = [e["lines"] for e in published[run] if e.get("code") == "missing-entries"]
        assert warned == [[1, 1], [4, 5]], run
    # Replay reproduces it, poison and all (the broken state is not in the log: replay cannot know it).
    assert sum(compare(settings, run) for run in [*innocents, *poisoned]) == 0


FIELD = st.sampled_from([b"run", b"seq", b"ts", b"kind", b"stream", b"line", b"exit", b"through", b"missing",
                         b"format", b"host", b"parent"])
VALUE = st.sampled_from([b"hb/1", b"hb/2", b"0", b"1", b"2", b"--5", "²".encode(), b"eof", b"abandon", b"line",
                         b"stderr", DEEP.encode(), b"9" * 40, b"[[0,1]]", b"\xff", b""]) | st.binary(max_size=30)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(FIELD, VALUE, min_size=1, max_size=8), min_size=1, max_size=12))
def test_arbitrary_field_maps_through_the_real_batch_path_never_raise(settings, maps):
    layout = settings.layout
    stream = layout.raw_stream(0)
    sync = redis.Redis.from_url(settings.redis_url)
    innocent = next(r for r in (f"hb/innocent-{i}" for i in range(50)) if layout.shard_of(r) == 0)

    async def go():
        client = async_client(settings)
        try:
            await ensure_groups(client, settings)
            for fields in maps:
                sync.xadd(stream, fields)
            tag = sync.incr(layout.key("hb-test-counter"))
            run = next(r for r in (f"{innocent}-{tag}-{i}" for i in range(200)) if layout.shard_of(r) == 0)
            sync.xadd(stream, {b"run": run.encode(), b"seq": b"0", b"line": (TEXT % "fine").encode()})
            sync.xadd(stream, {b"run": run.encode(), b"seq": b"1", b"kind": b"eof"})
            reply = sync.xreadgroup(settings.group, "hyp", {stream: ">"}, count=1000)
            ids = [i for i, _ in reply[0][1]]
            fields = [f for _, f in reply[0][1]]
            await BatchProcessor(settings, client).process(0, ids, fields)
            return run
        finally:
            await client.aclose()

    run = asyncio.run(go())
    assert int(sync.xpending(stream, settings.group)["pending"]) == 0
    runs = [TopicEntry.from_fields(f).document() for _, f in sync.xrange(layout.runs_partition(0))]
    assert [rec["state"] for rec in runs if rec["runId"] == run] == ["started", "ended"]
