"""`tail`, `up` and `demo` as a user runs them: real processes, real Redis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from services.archive.reader import read_lake_events, read_raw
from services.archive.store import open_store
from services.archive.window import Window
from services.broker.connect import sync_client
from services.quickstart.command import OTHER_FORMAT_FIXTURES
from services.settings import Settings
from services.tap.publisher import Publisher
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.pipeline import ended_runs, start_worker, stop, wait_until
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e


def _publish(settings, run: str, path) -> None:
    with Publisher(settings, run, {"host": "cmd"}) as pub:
        for line in path.read_bytes().splitlines():
            pub.add_line(line, "stdout")
        pub.add_eof(2)


def test_tail_prints_events_and_run_records_for_a_human(settings, tmp_path):
    worker = start_worker(settings, tmp_path / "w.log")
    try:
        _publish(settings, "tail/one", TRANSCRIPTS[1])
        wait_until(lambda: "tail/one" in ended_runs(settings), timeout=30)
    finally:
        stop(worker)
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "tail", "--from-start", "--no-follow", "--run", "tail/one"],
        cwd=REPO, env=cli_env(settings), capture_output=True, text=True, timeout=30,
    )
    lines = out.stdout.splitlines()
    # 14 events of the transcript, the exit error, and started/completed/ended records.
    assert any(re.search(r"tail/one#0 reasoning ", line) for line in lines)
    assert any("$ python3 -m pytest -q tests (exit 0) ✓" in line for line in lines)
    assert any("error     goose exited with code 2" in line for line in lines)
    assert any("RUN ENDED exit=2 tokens=41877" in line for line in lines)
    errors = subprocess.run(
        [sys.executable, "-m", "services.cli", "tail", "--from-start", "--count", "1", "--type", "error", "--json"],
        cwd=REPO, env=cli_env(settings), capture_output=True, text=True, timeout=30,
    )
    assert '"type":"error"' in errors.stdout and '"goose exited with code 2"' in errors.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_tail_ends_on_a_signal_during_a_blocking_read(settings, sig):
    """Ctrl-C (or a supervisor's SIGTERM) while `tail` waits in XREAD BLOCK: exit 0, no traceback,
    within one read (FOLLOW_BLOCK_MS); a second signal is not needed."""
    client = sync_client(settings)
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "tail", "--run", "sig/none"], cwd=REPO,
                            env=cli_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # in its follow loop: a client of ours blocked in XREAD (CLIENT LIST names the command)
        assert wait_until(lambda: any(c.get("cmd") == "xread" and "b" in c.get("flags", "")
                                      for c in client.client_list()), timeout=60), "tail never blocked in XREAD"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr[-2000:]
    assert stdout == ""


def test_tail_without_a_broker_says_how_to_get_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    out = subprocess.run([sys.executable, "-m", "services.cli", "tail"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "GOOSE_INGEST_REDIS_URL" in out.stderr


def _archived(directory) -> tuple[dict[str, list[int]], dict[str, int]]:
    """What a local archive folder holds: raw seqs per run (eof included) and lake events per run."""
    store = open_store(Settings(archive_url=directory.resolve().as_uri()))
    assert store is not None
    seqs: dict[str, list[int]] = {}
    for e in read_raw(store, Window()).entries:
        if b"run" in e.fields and b"seq" in e.fields:
            seqs.setdefault(e.fields[b"run"].decode(), []).append(int(e.fields[b"seq"]))
    events = {run: len(by_id) for run, by_id in read_lake_events(store, Window(), None).events.items()}
    return seqs, events


def test_demo_runs_the_fixtures_through_an_embedded_broker_and_a_worker(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env["GOOSE_INGEST_SPOOL_DIR"] = str(tmp_path / "spool")
    out = subprocess.run([sys.executable, "-m", "services.cli", "demo"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # every goose fixture and one transcript of each other format (contracts/formats.py)
    runs = len(TRANSCRIPTS) + len(OTHER_FORMAT_FIXTURES)
    assert f"{runs} runs normalized by a live worker on an embedded broker" in out.stdout
    assert out.stdout.count("RUN ENDED") == runs
    for fmt, name in OTHER_FORMAT_FIXTURES:  # each shown as its own run, with tool events of its own
        block = next(b for b in out.stdout.split("\n\n") if f"/{fmt}-{name.removesuffix('.jsonl')}" in b)
        assert " read " in block and "RUN ENDED" in block, block
    # ... and archived beside the spool (docs/archive.md "Locally"): every line and eof of every
    # run once, in order, and every run's events in the lake, before the embedded broker went away.
    assert "archived the runs' raw log, events and run records to file://" in out.stderr, out.stderr[-2000:]
    seqs, events = _archived(tmp_path / "archive")
    demo_runs = {run for run in seqs if run.startswith("demo/")}
    assert len(demo_runs) == runs, sorted(seqs)
    for run in demo_runs:
        assert seqs[run] == list(range(len(seqs[run]))), run  # 0..eof, no gap, no duplicate
        assert events.get(run, 0) > 0, run


def test_up_starts_a_broker_and_a_worker_that_process_a_run(settings, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update(GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"))
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up"], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            match = re.search(r"export GOOSE_INGEST_REDIS_URL=(\S+)", line)
            url = match.group(1) if match else None
        assert url, "`up` did not print the broker URL"
        local = settings.model_copy(update={"redis_url": url, "namespace": ""})
        _publish(local, "up/one", TRANSCRIPTS[0])
        wait_until(lambda: "up/one" in ended_runs(local), timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    # its archive thread wrote the run on the way out (a short segment: the stop flushes)
    seqs, _ = _archived(tmp_path / "archive")
    lines = len(TRANSCRIPTS[0].read_bytes().splitlines())
    assert seqs.get("up/one") == list(range(lines + 1)), sorted(seqs)


def test_up_on_a_configured_broker_does_not_archive_unless_told_where(settings, tmp_path):
    """A configured broker may have a deployment's `goose-ingest archive` in the same group: a thread
    of `up` in that group would carry its entries off to this machine. `up` says it does not archive."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update(cli_env(settings), GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"))
    env.pop("GOOSE_INGEST_ARCHIVE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up"], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("not archiving" in line for line in seen):
            seen.append(proc.stderr.readline())
        assert any("not archiving" in line and "GOOSE_INGEST_ARCHIVE_URL" in line for line in seen), seen
        _publish(settings, "up/configured", TRANSCRIPTS[0])
        wait_until(lambda: "up/configured" in ended_runs(settings), timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert not (tmp_path / "archive").exists()
    # the archive's group was never created on the raw log
    client = sync_client(settings)
    groups = {g["name"] for s in settings.layout.raw_streams() if client.exists(s) for g in client.xinfo_groups(s)}
    assert groups and not groups & {settings.archive_group, settings.archive_group.encode()}, groups


@pytest.mark.parametrize("command", [["replay"], ["tail"], ["import-sessions", "x.db", "--namespace", "ns"]])
def test_an_unreachable_broker_is_one_clear_line_without_the_password(command, tmp_path):
    from services.broker.embedded import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env["GOOSE_INGEST_REDIS_URL"] = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    out = subprocess.run([sys.executable, "-m", "services.cli", *command], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "hunter2" not in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_tail_reads_every_partition_of_a_cluster_one_slot_per_read():
    """On a cluster a multi-stream XREAD must stay in one slot: one read per shard, every partition read."""
    import argparse

    from services.settings import Settings
    from services.tail.command import stream_groups

    layout_settings = Settings(redis_cluster=True, shards=4, namespace="ns")
    args = argparse.Namespace(run=None, type=None, no_runs=False)
    groups = stream_groups(layout_settings, args)
    layout = layout_settings.layout
    assert len(groups) == 4
    streams = [s for group, _ in groups for s in group]
    assert sorted(streams) == sorted(layout.events_partitions() + layout.runs_partitions())
    for group, records in groups:
        tags = {s[s.index("{"):s.index("}") + 1] for s in group}
        assert len(tags) == 1 and records == {s for s in group if ".runs" in s}
    # one run: only its own shard's partitions; one type: only that type's topic, no records
    (only,) = stream_groups(layout_settings, argparse.Namespace(run="a/b", type=None, no_runs=False))
    assert only[0] == [layout.events_partition(layout.shard_of("a/b")), layout.runs_partition(layout.shard_of("a/b"))]
    typed = stream_groups(layout_settings, argparse.Namespace(run=None, type="error", no_runs=False))
    assert [g for g, _ in typed] == [[layout.type_partition("error", s)] for s in range(4)]
    assert all(not r for _, r in typed)
    # a single node: one read of every stream
    single = Settings(shards=4, namespace="ns")
    (one,) = stream_groups(single, args)
    assert one[0] == [single.layout.events_partition(0), single.layout.runs_partition(0)]


def test_demo_with_an_archive_url_it_cannot_use_is_one_line_and_leaves_no_broker(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update(GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"), GOOSE_INGEST_ARCHIVE_URL="ftp://archive.example/x")
    out = subprocess.run([sys.executable, "-m", "services.cli", "demo"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "goose-ingest demo: GOOSE_INGEST_ARCHIVE_URL 'ftp://archive.example/x': unsupported scheme 'ftp' "
        "(use file:///dir or s3://bucket/prefix)"], out.stderr
