"""Helpers for pipeline tests: expected events from the raw log, topic readers, worker processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import redis

from contracts.topics import TopicEntry
from services.broker.connect import sync_client
from services.normalizer import RunNormalizer
from services.sequencer import EntryError, parse_fields
from services.settings import Settings
from tests.support.redis_server import cli_env

REPO = Path(__file__).resolve().parents[2]


def client(settings: Settings) -> redis.Redis:
    # sync_client: a RedisCluster when settings.redis_cluster (the cluster tests reuse these helpers)
    return sync_client(settings)


def raw_entries(settings: Settings) -> list:
    r = client(settings)
    out = []
    for stream in settings.layout.raw_streams():
        for sid, fields in r.xrange(stream):
            try:
                out.append(parse_fields(fields, sid.decode()))
            except EntryError:  # dead-lettered by the workers: not part of any run's events
                continue
    return out


def expected_events(settings: Settings, run: str) -> list[dict]:
    """What one normalizer pass over the run's raw entries (as stored, in seq order) gives, fed as a
    worker feeds it (services/sequencer/run.py): the seq-0 entry's labels, the first `agent` label
    for the exit error's product, the eof's exit code and forwarded signal."""
    entries = sorted({e.seq: e for e in raw_entries(settings) if e.run == run and e.kind != "abandon"}.values(),
                     key=lambda e: e.seq)
    norm = RunNormalizer(run)
    out: list[dict] = []
    agent = None
    for e in entries:
        if e.seq == 0:
            out += norm.apply_labels(e.format, e.agent, e.seq, e.ts)
        agent = agent or e.agent or None
        if e.kind == "eof":
            out += norm.end(e.seq, e.ts, e.exit, agent, e.signal)
            break
        out += norm.line(e.seq, e.ts, e.line, e.stream)
    return out


def topic(settings: Settings, stream: str | list[str]) -> list[dict]:
    """Entries of a stream, or of every partition of a topic (partition after partition: per-run order holds)."""
    r = client(settings)
    streams = [stream] if isinstance(stream, str) else stream
    return [TopicEntry.from_fields(f).document() for s in streams for _, f in r.xrange(s)]


def events_by_run(settings: Settings) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for event in topic(settings, settings.layout.events_partitions()):
        out.setdefault(event["runId"], []).append(event)
    return out


def dead_letters(settings: Settings) -> list[dict]:
    r = client(settings)
    return [{k.decode(): v for k, v in f.items()}
            for stream in settings.layout.deadletter_partitions() for _, f in r.xrange(stream)]


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def ended_runs(settings: Settings) -> set[str]:
    return {r["runId"] for r in topic(settings, settings.layout.runs_partitions()) if r["state"] in ("ended", "abandoned")}


def start_worker(settings: Settings, log: Path, **env: str) -> subprocess.Popen:
    base = {
        "GOOSE_INGEST_METRICS_PORT": "0",
        "GOOSE_INGEST_CLAIM_IDLE_MS": "1500",
        "GOOSE_INGEST_SWEEP_INTERVAL_S": "0.3",
        "GOOSE_INGEST_BATCH_SIZE": "50",
    }
    base.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "worker"],
        cwd=REPO,
        env=cli_env(settings, **base),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
