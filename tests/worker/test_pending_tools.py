"""Unanswered tool calls stay bounded (issue 22, section 3): a byte cap besides the count cap, each
input kept once, and each call's block stored apart from the run state so that a small line never
rewrites them. The case of the issue: 40 Claude Code `tool_use` blocks with 900 KB inputs and no
result, then small lines (once a 73.7 MB state rewritten by every line)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contracts.raw import DEFAULT_MAX_PENDING_TOOL_BYTES
from contracts.topics import TopicEntry
from services.broker.connect import async_client
from services.normalizer import Limits, RunNormalizer
from services.normalizer.machinery import INPUT_BESIDE, PENDING_CALL_OVERHEAD
from services.sequencer import Entry, Outcome, RunSequencer
from services.settings import Settings
from services.streams.groups import ensure_groups
from services.worker.commit import CALL_PREFIX
from services.worker.processor import BatchProcessor
from tests.core.test_normalizer_properties_formats import T0, formats, labels, lines, streams
from tests.support.fakes import RaisingRedactor
from tests.support.normalizer import c_answer, c_assistant, c_call, c_text, c_use, claude, req, resp, x_item

TS = 1_790_000_000_000
BIG = 900_000
CALLS = 40
SMALL = 20


def big_call(i: int) -> str:
    return c_call(f"toolu_{i:02d}", "Write", {"file_path": f"/w/{i}.txt", "content": "x" * BIG}, mid=f"msg_{i}")


def small_line(i: int) -> str:
    return c_assistant(f"m{i}", c_text(f"ok {i}"))


def entry(run: str, seq: int, line: str = "", kind: str = "line") -> Entry:
    labels = {"host": "h", "agent": "claude/2", "sid": f"{TS + seq}-0", "format": "claude-code" if seq == 0 else None}
    if kind == "eof":
        return Entry.of_eof(run, seq, TS + seq, 0, **labels)
    return Entry.of_line(run, seq, TS + seq, line, **labels)


def the_issue_case(run: str, calls: int = CALLS, small: int = SMALL) -> list[Entry]:
    lines = [big_call(i) for i in range(calls)] + [small_line(i) for i in range(small)]
    return [entry(run, seq, text) for seq, text in enumerate(lines)] + [entry(run, len(lines), kind="eof")]


def kept_calls() -> int:
    """How many of the issue's calls fit under the default byte cap."""
    size = len(orjson.dumps(c_use("toolu_10", "Write", {"file_path": "/w/10.txt", "content": "x" * BIG})))
    return DEFAULT_MAX_PENDING_TOOL_BYTES // (size + PENDING_CALL_OVERHEAD)


def unknown_calls(events: list[dict[str, Any]]) -> list[str]:
    return [e["toolCallId"] for e in events if e["type"] == "unknown"]


# ------------------------------------------------------------------------------- the pure core
def test_forty_large_unanswered_calls_stay_under_the_byte_cap_and_out_of_the_state():
    run = "pt/issue"
    sequencer = RunSequencer(run)
    store: dict[int, bytes] = {}  # the run's c:<key> fields, as a worker keeps them
    out = Outcome()
    largest_state = 0
    for e in the_issue_case(run):
        sequencer.accept(e, out)
        norm = sequencer.norm
        assert norm.pending_bytes <= DEFAULT_MAX_PENDING_TOOL_BYTES
        assert norm.pending_bytes == sum(c[7] for c in norm.pending)
        state = orjson.dumps(sequencer.to_state(include_held=False))
        largest_state = max(largest_state, len(state))
        changes = sequencer.take_held_changes()
        for key, data in changes.calls_added:
            # The input once: the block's JSON and no second copy of its 900 KB.
            assert BIG < len(data) < BIG + 200
            store[key] = data
        for key in changes.calls_removed:
            del store[key]
        if e.seq >= CALLS:  # a small line (or the end) adds nothing to store
            assert changes.calls_added == []
        assert sorted(store) == sorted(c[6] for c in norm.pending)
    # Whatever was pending, the state itself stayed small (was 73.7 MB).
    assert largest_state < 8_000
    assert store == {}  # the end drained every call
    kept = kept_calls()
    assert out.evictions == {"bytes": CALLS - kept}
    # No call is lost: each becomes one `unknown` with its whole request, evicted ones first.
    assert unknown_calls(out.events) == [f"toolu_{i:02d}" for i in range(CALLS)]
    unknowns = [e for e in out.events if e["type"] == "unknown"]
    assert all(len(e["raw"]["input"]["content"]) == BIG for e in unknowns)
    assert [r["state"] for r in out.records] == ["started", "ended"]


def test_a_run_resumed_from_its_stored_state_and_call_fields_gives_the_same_events():
    run = "pt/resume"
    entries = the_issue_case(run)[:CALLS:3] + [entry(run, CALLS, small_line(0))]
    entries = [entry(run, i, e.line) for i, e in enumerate(entries)] + [entry(run, len(entries), kind="eof")]
    limits = Limits(max_pending_tool_bytes=4 * BIG)
    whole = RunSequencer(run, limits)
    expected = whole.accept_many(entries)
    sequencer = RunSequencer(run, limits)
    store: dict[int, bytes] = {}
    out = Outcome()
    for e in entries:
        sequencer.accept(e, out)
        changes = sequencer.take_held_changes()
        store.update(changes.calls_added)
        for key in changes.calls_removed:
            del store[key]
        state = orjson.loads(orjson.dumps(sequencer.to_state(include_held=False)))
        assert all(len(call) == 7 for call in state["norm"].get("calls", []))  # no block in the state
        sequencer = RunSequencer.from_state(state, limits, held={}, calls={k: orjson.loads(v) for k, v in store.items()})
        assert sequencer.take_held_changes().calls_added == []  # nothing to write again
    assert out.events == expected.events and out.records == expected.records
    assert out.evictions == expected.evictions == {"bytes": len(entries) - 2 - 3}


def test_a_state_without_its_stored_call_is_refused_with_a_reason():
    norm = RunNormalizer("pt/lost", fmt="claude-code")
    norm.line(0, TS, c_call("a", "Read", {"file_path": "/x"}))
    with pytest.raises(ValueError, match="pending call 0"):
        RunNormalizer.from_state(orjson.loads(orjson.dumps(norm.to_state(include_calls=False))), calls={})


def test_the_count_cap_is_counted_too():
    seq = RunSequencer("pt/count", Limits(max_pending_tools=2))
    out = seq.accept_many([entry("pt/count", i, c_call(f"c{i}", "Read", {"file_path": f"/{i}"})) for i in range(3)])
    assert out.evictions == {"count": 1} and unknown_calls(out.events) == ["c0"]


def test_a_call_larger_than_the_byte_cap_is_surfaced_at_once_and_its_result_stays_visible():
    seq = RunSequencer("pt/huge", Limits(max_pending_tool_bytes=1024))
    out = seq.accept_many([
        entry("pt/huge", 0, c_call("small", "Read", {"file_path": "/a"})),
        entry("pt/huge", 1, c_call("huge", "Write", {"file_path": "/b", "content": "y" * 2000})),
        entry("pt/huge", 2, c_assistant("r", {"type": "text", "text": "x"})),
    ])
    assert out.evictions == {"bytes": 1} and unknown_calls(out.events) == ["huge"]
    assert [c[0] for c in seq.norm.pending] == ["small"]


def test_an_old_state_with_calls_inline_is_taken_over_and_its_inputs_found_again():
    """States written before calls were stored apart: [id, name, input, block, seq, ts], the input a copy."""
    block = c_use("a", "Write", {"file_path": "/w/a.txt", "content": "z" * 50})
    old = RunNormalizer("pt/old", fmt="claude-code").to_state()
    old["pending"] = [["a", "Write", dict(block["input"]), block, 3, TS + 3]]
    norm = RunNormalizer.from_state(orjson.loads(orjson.dumps(old)), calls={})
    added, removed = norm.take_call_changes()
    assert [k for k, _ in added] == [0] and removed == []
    assert orjson.loads(added[0][1]) == block  # the block once: the input is found in it
    assert norm.pending[0][8] == ["input"] and norm.pending[0][2] is norm.pending[0][3]["input"]
    state = norm.to_state(include_calls=False)
    assert "pending" not in state and state["calls"] == [[0, "a", "Write", 3, TS + 3, norm.pending[0][7], ["input"]]]
    (write,) = norm.line(4, TS + 4, c_answer("a"))
    assert write["type"] == "write" and write["path"] == "/w/a.txt" and write["lines"] == [3, 4]
    assert norm.take_call_changes() == ([], [0]) and norm.to_state()["pending"] == []
    # Loaded by a tool (no stored fields given), nothing is reported to store.
    assert RunNormalizer.from_state(orjson.loads(orjson.dumps(old))).take_call_changes() == ([], [])


def test_an_input_that_is_not_part_of_its_block_is_stored_beside_it():
    norm = RunNormalizer("pt/beside", fmt="codex")
    out: list[dict[str, Any]] = []
    norm.add_call(out, TS, ["i1", "shell", {"argv": ["ls"]}, {"type": "command_execution", "id": "i1"}, 0, TS])
    assert norm.pending[0][8] is INPUT_BESIDE and out == []
    (key, data), = norm.take_call_changes()[0]
    again = RunNormalizer.from_state(orjson.loads(orjson.dumps(norm.to_state(include_calls=False))),
                                     calls={key: orjson.loads(data)})
    inline = RunNormalizer.from_state(orjson.loads(orjson.dumps(norm.to_state())))
    for loaded in (again, inline):
        assert loaded.pending[0][:6] == norm.pending[0][:6]
        assert loaded.to_state() == norm.to_state()


def test_a_guarded_step_that_raises_leaves_the_calls_and_what_to_store_as_they_were():
    run = "pt/guarded"
    seq = RunSequencer(run, Limits(max_pending_tools=1), redactor=RaisingRedactor())
    seq.guarded = True
    out = seq.accept_many([
        entry(run, 0, c_call("a", "Read", {"file_path": "/POISON"})),
        entry(run, 1, c_call("b", "Read", {"file_path": "/b"})),  # evicts `a`: its unknown raises
    ])
    assert [d.reason for d in out.dispositions] == [None, "processing-error"]
    assert out.evictions == {}  # the failed step's eviction went with its events
    assert [c[0] for c in seq.norm.pending] == ["a"]
    added, removed = seq.take_held_changes()[2:]
    assert [k for k, _ in added] == [0] and removed == []


# ------------------------------------------------------------------------------- a real worker
def test_the_issue_case_through_a_worker_writes_each_call_once_and_little_per_small_line(private_redis):
    settings = Settings(redis_url=private_redis.url, namespace=f"t{uuid4().hex[:10]}", shards=1,
                        redaction_enabled=False)
    layout = settings.layout
    sync = redis.Redis.from_url(settings.redis_url)
    run = "pt/worker"
    key = layout.run_state(run)
    stream = layout.raw_stream(0)
    entries = the_issue_case(run)

    def read() -> tuple[list[str], list[dict[bytes, bytes]]]:
        reply = sync.xreadgroup(settings.group, "test", {stream: ">"}, count=10_000)
        items = reply[0][1] if reply else []
        return [sid.decode() for sid, _ in items], [f for _, f in items]

    def net_in() -> int:
        return int(sync.info("stats")["total_net_input_bytes"])

    async def body(client: Any) -> tuple[dict[str, int], list[int], list[int], int]:
        processor = BatchProcessor(settings, client)
        for e in entries[:CALLS]:
            sync.xadd(stream, e.to_fields())
        first = await processor.process(0, *read())
        fields = sync.hkeys(key)
        state_sizes, sent = [], []
        for i, e in enumerate(entries[CALLS:CALLS + SMALL]):
            sync.xadd(stream, e.to_fields())
            ids, raw = read()
            if i == SMALL // 2:
                processor = BatchProcessor(settings, client)  # another worker takes the run over
            before = net_in()
            await processor.process(0, ids, raw)
            sent.append(net_in() - before)
            state_sizes.append(sync.hstrlen(key, "s"))
        sync.xadd(stream, entries[-1].to_fields())
        await processor.process(0, *read())
        return first.evictions, state_sizes, sent, len([f for f in fields if f.startswith(CALL_PREFIX)])

    async def go() -> Any:
        client = async_client(settings)
        try:
            await ensure_groups(client, settings)
            return await body(client)
        finally:
            await client.aclose()

    evictions, state_sizes, sent, call_fields = asyncio.run(go())
    kept = kept_calls()
    assert evictions == {"bytes": CALLS - kept} and call_fields == kept
    assert max(state_sizes) < 8_000  # was 73.7 MB
    assert max(sent) < 50_000  # a small line's commit (its events, the small state, acks); was 73.7 MB
    events = [TopicEntry.from_fields(f).document() for _, f in sync.xrange(layout.events_partition(0))]
    assert unknown_calls(events) == [f"toolu_{i:02d}" for i in range(CALLS)]
    assert sum(e["type"] == "agent" for e in events) == SMALL
    assert not [f for f in sync.hkeys(key) if f.startswith(CALL_PREFIX)]  # the end deleted them


def test_evictions_are_counted_by_cap_in_the_worker_metrics():
    from services.metrics import Metrics
    from services.worker.processor import BatchResult
    from services.worker.reporting import record_result

    m = Metrics()
    sample = m.registry.get_sample_value
    assert sample("goose_ingest_pending_tool_evictions_total", {"cap": "bytes"}) == 0.0  # present from the start
    record_result(m, BatchResult(evictions={"bytes": 3, "count": 1}), 0.01, 4)
    m.pending_tool_evictions("no-such-cap", 5)  # never a new series
    assert sample("goose_ingest_pending_tool_evictions_total", {"cap": "bytes"}) == 3.0
    assert sample("goose_ingest_pending_tool_evictions_total", {"cap": "count"}) == 1.0
    assert sample("goose_ingest_pending_tool_evictions_total", {"cap": "no-such-cap"}) is None


# ------------------------------------------------------------------------------- properties
tiny = Limits(max_span_chars=24, max_pending_tools=3, max_pending_tool_bytes=600)
ids = st.sampled_from(["a", "b", "c", "d"])
names = st.sampled_from(["Write", "Bash", "TodoWrite", "developer__shell", "todo__write"])
sizes = st.integers(0, 900)
# Calls and answers of every format (ids reused, sizes around the tiny cap), among arbitrary lines.
tool_lines = st.one_of(
    st.builds(lambda c, n, k: c_call(c, n, {"command": "ls " + "y" * k}), ids, names, sizes),
    st.builds(c_answer, ids),
    st.just(claude("result", subtype="success", result="done")),
    st.builds(lambda c, n, k: req(c, n, {"command": "ls " + "y" * k}), ids, names, sizes),
    st.builds(lambda c, n: req(c, n), ids, names),
    st.builds(resp, ids),
    st.builds(lambda c, k: x_item("item.started", c, "command_execution", command="ls " + "z" * k), ids, sizes),
    st.builds(lambda c: x_item("item.completed", c, "command_execution", command="ls", exit_code=0), ids),
)
call_runs = st.lists(st.tuples(st.one_of(tool_lines, tool_lines, lines), streams), max_size=30)


@hsettings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(call_runs, st.sets(st.integers(0, 30)), formats, labels,
       st.sampled_from([Limits(), tiny, Limits(max_pending_tool_bytes=1024)]))
def test_resuming_from_the_state_and_the_calls_stored_apart_gives_the_same_events(items, cuts, fmt, label, limits):
    """Any input of any format: the calls stay under the byte cap, what is to be stored apart names
    exactly the pending calls (each written once, deleted once), and a run resumed from its state
    plus those stored calls gives the events of one pass."""
    one_pass = RunNormalizer("r", limits, fmt)
    expected = one_pass.apply_labels(label[0], label[1], 0, T0)
    for i, (text, stream) in enumerate(items):
        expected += one_pass.line(i, T0 + i, text, stream)
    expected += one_pass.end(len(items), 7)

    norm = RunNormalizer("r", limits, fmt)
    events = norm.apply_labels(label[0], label[1], 0, T0)
    store: dict[int, bytes] = {}
    for i, (text, stream) in enumerate(items):
        events += norm.line(i, T0 + i, text, stream)
        assert norm.pending_bytes <= limits.max_pending_tool_bytes
        added, removed = norm.take_call_changes()
        for key in removed:
            del store[key]
        for key, data in added:
            assert key not in store
            store[key] = data
        assert sorted(store) == sorted(c[6] for c in norm.pending)
        if i in cuts:
            state = orjson.dumps(norm.to_state(include_calls=False))
            norm = RunNormalizer.from_state(orjson.loads(state), limits, {k: orjson.loads(v) for k, v in store.items()})
    events += norm.end(len(items), 7)
    assert orjson.dumps(events) == orjson.dumps(expected)
    added, removed = norm.take_call_changes()
    assert added == [] and sorted(removed) == sorted(store)  # the end gives every stored call up


# ------------------------------------------------------------------------------- an upgrade
def test_a_worker_takes_over_a_state_written_with_its_calls_inline(settings):
    """States of an older worker kept each call whole in `s` (input twice): the next commit moves
    each block to its own field and the call is still answered."""
    s = settings.model_copy(update={"redaction_enabled": False, "shards": 1})
    layout = s.layout
    sync = redis.Redis.from_url(s.redis_url)
    run = "pt/upgrade"
    key = layout.run_state(run)
    stream = layout.raw_stream(0)
    old = RunSequencer(run)
    old.accept(entry(run, 0, c_call("a", "Write", {"file_path": "/w/a.txt", "content": "q" * 5000})))
    state = old.to_state()
    norm = state["norm"]
    (meta,) = norm.pop("calls")
    del norm["callsMade"]
    block = meta[7]
    norm["pending"] = [["a", "Write", dict(block["input"]), block, 0, TS]]  # the old form
    sync.hset(key, mapping={"v": "1", "s": orjson.dumps(state)})

    async def body(client: Any) -> tuple[list[bytes], int, int]:
        sync.xadd(stream, entry(run, 1, small_line(1)).to_fields())
        reply = sync.xreadgroup(s.group, "test", {stream: ">"}, count=100)
        items = reply[0][1]
        await BatchProcessor(s, client).process(0, [i.decode() for i, _ in items], [f for _, f in items])
        moved = sync.hkeys(key), sync.hstrlen(key, "s"), sync.hstrlen(key, "c:0")
        sync.xadd(stream, entry(run, 2, c_answer("a")).to_fields())
        sync.xadd(stream, entry(run, 3, kind="eof").to_fields())
        reply = sync.xreadgroup(s.group, "test", {stream: ">"}, count=100)
        items = reply[0][1]
        await BatchProcessor(s, client).process(0, [i.decode() for i, _ in items], [f for _, f in items])
        return moved

    async def go() -> Any:
        client = async_client(s)
        try:
            await ensure_groups(client, s)
            return await body(client)
        finally:
            await client.aclose()

    fields, state_size, call_size = asyncio.run(go())
    assert sorted(fields) == [b"c:0", b"s", b"v"] and state_size < 1000 and 5000 < call_size < 5200  # input once
    assert not sync.exists(key) or b"c:0" not in sync.hkeys(key)
    events = [TopicEntry.from_fields(f).document() for _, f in sync.xrange(layout.events_partition(0))]
    assert [e["type"] for e in events] == ["agent", "write"] and events[1]["path"] == "/w/a.txt"


@pytest.mark.e2e
def test_the_issue_case_through_a_worker_process_with_default_settings(settings, tmp_path):
    """900 KB calls (20: past the byte cap, half the issue's to keep the test short) and small
    lines through `goose-ingest worker` (default caps; only the line size allows the 900 KB
    lines): every call published once as `unknown`, the state hash left without call fields, and
    replay rebuilds exactly what was published."""
    from services.replay.command import compare
    from tests.support.pipeline import ended_runs, events_by_run, start_worker, stop, wait_until

    run = "pt/e2e"
    proc = start_worker(settings, tmp_path / "worker.log", GOOSE_INGEST_MAX_LINE_BYTES="1048576")
    try:
        sync = redis.Redis.from_url(settings.redis_url)
        stream = settings.layout.raw_stream(settings.layout.shard_of(run))
        for e in the_issue_case(run, 20, 5):
            sync.xadd(stream, e.to_fields())
        wait_until(lambda: run in ended_runs(settings), timeout=120)
    finally:
        stop(proc)

    assert proc.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]
    events = events_by_run(settings)[run]
    assert unknown_calls(events) == [f"toolu_{i:02d}" for i in range(20)]
    assert sum(e["type"] == "agent" for e in events) == 5
    assert not [f for f in sync.hkeys(settings.layout.run_state(run)) if f.startswith(CALL_PREFIX)]
    assert compare(settings, run) == 0


def test_normalize_takes_the_byte_cap_and_refuses_a_tiny_one_in_one_line():
    import subprocess
    import sys

    from tests.support.fixtures import REPO

    lines = "\n".join([c_call("a", "Read", {"file_path": "/a"}),
                       c_call("b", "Write", {"file_path": "/b", "content": "y" * 2000}),
                       c_answer("a")]) + "\n"

    def normalize(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "services.cli", "normalize", "--format", "claude-code",
                               "--epoch", "0", *args], input=lines.encode(), capture_output=True, cwd=REPO, timeout=60)

    proc = normalize("--max-pending-tool-bytes", "1024")
    assert proc.returncode == 0, proc.stderr
    events = [orjson.loads(line) for line in proc.stdout.splitlines()]
    # `b` alone is larger than the cap: surfaced at once; `a` stays pending and is answered.
    assert [(e["type"], e.get("toolCallId")) for e in events] == [("unknown", "b"), ("read", "a")]
    refused = normalize("--max-pending-tool-bytes", "10")
    assert refused.returncode == 2 and refused.stdout == b""
    assert refused.stderr.decode().splitlines() == [
        "goose-ingest normalize: --max-span-chars must be >= 16, --max-pending-tools >= 1 and --max-pending-tool-bytes >= 1024"]
