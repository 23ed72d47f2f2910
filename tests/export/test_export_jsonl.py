"""`export jsonl`'s target on real files (services/export/jsonl/sink.py): each entry once, whoever
writes it and however often; a torn line of a killed writer cut off; bad input dead-lettered with a
reason; a missing directory an outage, not a crash. Its life as a process under its own ACL user is
the consumer contract's (tests/consumers/test_contract.py TestExportJsonl)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from contracts.consumers import JSONL_INVALID_ENTRY
from contracts.topics import TopicEntry
from services.export.batch_sink import TargetDown
from services.export.jsonl.sink import day_of, target
from services.streams.reader import GroupReader, StreamEntry
from tests.support.fixtures import REPO

EVENTS, RUNS = "harness.events", "harness.runs"
MS = 1796554058847  # 2026-12-06 (UTC)


def _event(seq: int) -> StreamEntry:
    doc = {"eventId": f"r:{seq}", "runId": "r", "seq": seq, "type": "agent", "timestamp": "2026-12-06T10:00:00.000Z"}
    return StreamEntry(EVENTS, f"{MS + seq}-0", TopicEntry.of_event(doc).to_fields())


def _record(seq: int) -> StreamEntry:
    doc = {"recordId": f"r#{seq}", "runId": "r", "seq": seq, "state": "ended"}
    return StreamEntry(RUNS, f"{MS + seq}-1", TopicEntry.of_record(doc).to_fields())


def _reader() -> GroupReader:
    # dead_letter() builds the record only; nothing here talks to a broker
    return GroupReader(None, [[EVENTS, RUNS]], "g", "c", deadletter_stream=lambda shard: "dl", exporter="jsonl")


def _lines(directory: Path) -> list[dict]:
    return [orjson.loads(line) for p in sorted(directory.glob("*/*.jsonl")) for line in p.read_bytes().splitlines()]


def test_each_entry_once_with_its_stream_id_under_the_day_of_its_id(tmp_path):
    files = target(tmp_path, [EVENTS], [RUNS])
    batch = [_event(0), _event(1), _record(2)]
    assert files.write_batch(batch, _reader()) == []
    assert files.write_batch(batch, _reader()) == []  # redelivered: nothing twice
    lines = _lines(tmp_path)
    assert sorted((line["stream"], line["entryId"], line["topic"]) for line in lines) == [
        (EVENTS, f"{MS}-0", "events"), (EVENTS, f"{MS + 1}-0", "events"), (RUNS, f"{MS + 2}-1", "runs")]
    assert {line["data"].get("eventId") or line["data"]["recordId"] for line in lines} == {"r:0", "r:1", "r#2"}
    assert day_of(f"{MS}-0") == "2026-12-06" and (tmp_path / "2026-12-06" / f"{EVENTS}.jsonl").is_file()


def test_two_writers_on_one_directory_write_each_entry_once(tmp_path):
    """A second instance, or the successor that reclaimed a dead consumer's batch: each reads what
    the other appended (under the file's lock) before appending."""
    first, second = target(tmp_path, [EVENTS], [RUNS]), target(tmp_path, [EVENTS], [RUNS])
    first.write_batch([_event(0), _event(1)], _reader())
    second.write_batch([_event(1), _event(2)], _reader())
    first.write_batch([_event(0), _event(2), _event(3)], _reader())
    assert sorted(line["entryId"] for line in _lines(tmp_path)) == [f"{MS + i}-0" for i in range(4)]


def test_a_line_torn_by_a_killed_writer_is_cut_and_written_whole(tmp_path):
    files = target(tmp_path, [EVENTS], [RUNS])
    files.write_batch([_event(0)], _reader())
    path = tmp_path / "2026-12-06" / f"{EVENTS}.jsonl"
    with open(path, "ab") as f:  # what a SIGKILL mid-write leaves: part of the next line
        f.write(b'{"stream":"harness.events","entryId":"' + f"{MS + 1}-0".encode())
    target(tmp_path, [EVENTS], [RUNS]).write_batch([_event(1)], _reader())  # the successor
    assert [line["entryId"] for line in _lines(tmp_path)] == [f"{MS}-0", f"{MS + 1}-0"]


def test_an_entry_without_a_json_object_is_dead_lettered_with_its_fields(tmp_path):
    bad = StreamEntry(EVENTS, f"{MS}-5", {b"eventId": b"r:5", b"runId": b"r", b"seq": b"5", b"data": b"{nope"})
    dead = target(tmp_path, [EVENTS], [RUNS]).write_batch([bad, _event(0)], _reader())
    assert [(d.reason, d.source, d.source_id, d.exporter) for d in dead] == [(JSONL_INVALID_ENTRY, EVENTS, f"{MS}-5", "jsonl")]
    assert "not JSON" in dead[0].detail and dead[0].raw[b"data"] == b"{nope"  # resendable after a fix
    assert [line["entryId"] for line in _lines(tmp_path)] == [f"{MS}-0"]


def test_a_missing_directory_is_an_outage_with_a_reason_and_nothing_is_written(tmp_path):
    where = tmp_path / "volume"
    where.mkdir()
    files = target(where, [EVENTS], [RUNS])
    where.rename(tmp_path / "away")  # unmounted
    with pytest.raises(TargetDown, match=f"cannot write {where}: No such file or directory"):
        files.write_batch([_event(0)], _reader())
    assert not where.exists()  # the sink never creates it behind the operator's back
    (tmp_path / "away").rename(where)
    assert files.write_batch([_event(0)], _reader()) == [] and len(_lines(where)) == 1


def test_without_a_directory_the_command_says_so_in_one_line_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    proc = subprocess.run([sys.executable, "-m", "services.cli", "export", "jsonl"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "goose-ingest export: no directory configured (--path or GOOSE_INGEST_JSONL_DIR)"], proc.stderr
