"""`tail`, `up` and `demo` as a user runs them: real processes, real Redis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

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


def test_tail_without_a_broker_says_how_to_get_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    out = subprocess.run([sys.executable, "-m", "services.cli", "tail"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "GOOSE_INGEST_REDIS_URL" in out.stderr


def test_demo_runs_the_fixtures_through_an_embedded_broker_and_a_worker(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env["GOOSE_INGEST_SPOOL_DIR"] = str(tmp_path / "spool")
    out = subprocess.run([sys.executable, "-m", "services.cli", "demo"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    runs = len(TRANSCRIPTS) + 2  # every goose fixture, one Claude Code and one Codex transcript
    assert f"{runs} runs normalized by a live worker on an embedded broker" in out.stdout
    assert out.stdout.count("RUN ENDED") == runs
    for fmt in ("claude-code", "codex"):  # each shown as its own run, with tool events of its own
        block = next(b for b in out.stdout.split("\n\n") if f"/{fmt}-a-read-edit-test" in b)
        assert " read " in block and " command " in block and "RUN ENDED" in block, block


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
