"""services/sequencer/feed.py: the one loop (and the rules before it) that the worker and replay share.

Pure tests with default settings: raw field maps in, events out. The worker's side of the same rules
runs against real Redis in tests/worker/test_worker_bad_input.py, tests/worker/test_poison_batches.py and
tests/broker/test_cluster_pipeline.py; here replay is held to them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import orjson

from contracts.raw import INVALID_ENTRY, OVERSIZE
from services.normalizer import Limits
from services.sequencer import Entry, Rejected, RunSequencer, parse_batch
from services.sequencer.feed import Lost, feed, lost_of, rejected_loss, wrong_shard
from services.sequencer.rebuild import LogEntry, rebuild
from services.settings import Settings
from tests.support.fixtures import TRANSCRIPTS, transcript_lines

ROOT = Path(__file__).resolve().parents[2]
LINES = transcript_lines(TRANSCRIPTS[0])
DEFAULTS = Settings()
LIMITS = Limits(DEFAULTS.max_span_chars, DEFAULTS.max_pending_tools, DEFAULTS.max_pending_tool_bytes)


def raw(run: str, seq: int, line: str | None = None) -> dict[bytes, bytes]:
    fields = {b"run": run.encode(), b"seq": str(seq).encode(), b"ts": str(1_000 + seq).encode()}
    if line is None:
        fields[b"kind"] = b"eof"
        fields[b"exitCode"] = b"0"
    else:
        fields[b"kind"] = b"line"
        fields[b"line"] = line.encode()
    return fields


def run_log(run: str, n: int, first_ms: int = 10) -> list[LogEntry]:
    return [LogEntry(f"{first_ms + i}-0", raw(run, i, LINES[i % len(LINES)])) for i in range(n)] + \
           [LogEntry(f"{first_ms + n}-0", raw(run, n))]


def test_feed_gives_what_one_accept_or_lose_per_item_gives():
    entries = [e for e in parse_batch([le.sid for le in run_log("r", 12)], [le.fields for le in run_log("r", 12)], 10**6)]
    assert all(type(e) is Entry for e in entries)
    items = [*entries[:4], Lost("r", 4, "14-0"), *entries[5:9], Lost("r", 9, "19-0", OVERSIZE), *entries[10:]]
    fed = feed(RunSequencer("r", LIMITS), items)
    reference = RunSequencer("r", LIMITS)
    events, records = [], []
    for item in items:
        out = reference.lose(item.seq, int(item.sid.split("-")[0]), reason=item.reason) if isinstance(item, Lost) \
            else reference.accept(item)
        events += out.events
        records += out.records
    assert fed.outcome.events == events and fed.outcome.records == records
    assert any(e["type"] == "warning" and "oversize" in e["message"] for e in events)
    assert fed.last_ms == 22  # the eof's stream id: the run's latest activity


def test_an_oversize_entry_costs_its_run_that_seq_in_replay_as_in_the_worker():
    log = run_log("r", 6)
    cap = max(sum(len(k) + len(v) for k, v in e.fields.items()) for e in log)
    big = LogEntry(log[3].sid, raw("r", 3, "x" * (cap + 1)))
    log[3] = big
    [rejected] = parse_batch([big.sid], [big.fields], cap)
    assert type(rejected) is Rejected and rejected.reason == OVERSIZE
    assert rejected_loss(rejected, big.fields, big.sid) == Lost("r", 3, big.sid, OVERSIZE)
    rebuilt = rebuild(log, LIMITS, DEFAULTS.max_buffered_entries, max_bytes=cap)
    assert rebuilt.invalid == 1
    warnings = [e for e in rebuilt.events["r"] if e["type"] == "warning"]
    assert warnings and "oversize" in warnings[0]["message"]
    assert rebuilt.records["r"][-1]["state"] == "ended"


def test_an_invalid_entry_with_a_valid_run_and_seq_is_a_lost_seq_and_one_without_is_nothing():
    bad_ts = raw("r", 2, "hello")
    bad_ts[b"ts"] = b"yesterday"
    [rejected] = parse_batch(["12-0"], [bad_ts], 10**6)
    assert type(rejected) is Rejected and rejected.reason == INVALID_ENTRY
    assert rejected_loss(rejected, bad_ts, "12-0") == Lost("r", 2, "12-0")
    no_run = {b"seq": b"1", b"kind": b"line", b"line": b"x"}
    [nameless] = parse_batch(["13-0"], [no_run], 10**6)
    assert type(nameless) is Rejected and rejected_loss(nameless, no_run, "13-0") is None
    assert lost_of(no_run, "13-0", OVERSIZE) is None


def test_replay_skips_an_entry_read_from_a_shard_its_run_does_not_belong_to_as_the_worker_does():
    def shard_of(run: str) -> int:
        return 0 if run == "home" else 1

    assert wrong_shard("home", 0, shard_of) is None
    assert wrong_shard("home", 1, shard_of) == "run belongs to shard 0, not 1"
    assert wrong_shard("home", 1, None) is None  # one shard, or no cluster: every run is at home
    whole = run_log("home", 4)
    log = [LogEntry(e.sid, e.fields, shard=0) for e in whole if e.fields[b"seq"] != b"2"]
    stray = LogEntry(whole[2].sid, whole[2].fields, shard=1)  # seq 2, written to the wrong shard
    rebuilt = rebuild([*log, stray], LIMITS, DEFAULTS.max_buffered_entries, shard_of=shard_of)
    alone = rebuild(log, LIMITS, DEFAULTS.max_buffered_entries, shard_of=shard_of)
    assert rebuilt.invalid == 1
    assert rebuilt.events == alone.events and rebuilt.records == alone.records
    assert [r["state"] for r in rebuilt.records["home"]] == ["started"]  # still waiting for seq 2, as live
    # Without the cluster's map the same entry is the run's: it ends.
    unmapped = rebuild([*log, stray], LIMITS, DEFAULTS.max_buffered_entries)
    assert unmapped.invalid == 0 and unmapped.records["home"][-1]["state"] == "ended"


def test_a_forged_abandon_marker_on_a_raw_stream_is_invalid_and_one_on_a_control_stream_is_read():
    marker = {b"run": b"r", b"seq": b"3", b"kind": b"abandon", b"ts": b"2000", b"through": b"2"}
    [forged] = parse_batch(["5-0"], [marker], 10**6)
    assert type(forged) is Rejected and "abandon" in forged.detail
    [read] = parse_batch(["5-0"], [marker], 10**6, control=True)
    assert type(read) in (Entry, Rejected)  # the control stream's own rules decide, not the raw stream's
    assert not (type(read) is Rejected and "raw stream" in read.detail)


def test_the_worker_and_replay_feed_through_the_one_module():
    for path in ("services/worker/processor.py", "services/sequencer/rebuild.py"):
        tree = ast.parse((ROOT / path).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "services.sequencer.feed" for alias in node.names}
        assert "feed" in imported, path
        classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        assert not classes & {"Lost", "_Lost"}, path
        calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute)}
        assert not calls & {"accept", "accept_many", "lose"}, f"{path} feeds the sequencer itself"


def test_replay_output_is_json_serialisable():
    rebuilt = rebuild(run_log("r", 8), LIMITS, DEFAULTS.max_buffered_entries)
    assert orjson.loads(orjson.dumps(rebuilt.events["r"])) == rebuilt.events["r"]
