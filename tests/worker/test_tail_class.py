"""`goose-ingest tail --class C` on topics a real batch processor committed to the test Redis: the
events carrying the class (errors and retry warnings), each with its run's host, and the human line
showing `errorClass` beside the CLI's `code`."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from typing import Any

import orjson

from services.sequencer import Entry
from services.settings import Settings
from services.tail.command import follow
from services.tail.format import summary
from services.worker.processor import BatchProcessor
from tests.support.fixtures import REPO
from tests.worker.test_batch_processor import Harness, process_shard, run_async

TS = 1_790_000_000_000
AUTH = orjson.dumps({"type": "error", "error": "Authentication failed: 401 Unauthorized, invalid x-api-key"}).decode()
LIMITED = orjson.dumps({"type": "error", "error": "Rate limit exceeded: 429 Too Many Requests"}).decode()
AGENT = '{"type":"message","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"hi"}]}}'


def args(**kw: Any) -> argparse.Namespace:
    base = dict(type=None, error_class=None, run=None, from_start=False, json=False, no_runs=False, count=None,
                no_follow=True)
    return argparse.Namespace(**(base | kw))


def commit_runs(settings: Settings, fmt: str, runs: list[tuple[str, str, list[str]]]) -> None:
    """Each (run, host, lines) published as a tap would and committed by a worker's batch processor."""
    h = Harness(settings)
    for run, host, lines in runs:
        for seq, text in enumerate(lines):
            h.add(Entry.of_line(run, seq, TS + seq, text, host=host, format=fmt if seq == 0 else None).to_fields())

    async def body(client: Any) -> None:
        processor = BatchProcessor(settings, client)
        for shard in range(settings.shards):
            await process_shard(h, processor, shard)

    run_async(settings, body)


def committed(settings: Settings) -> None:
    commit_runs(settings, "goose", [("r-auth-1", "host-a", [AGENT, AUTH, AUTH]), ("r-auth-2", "host-b", [AGENT, AUTH]),
                                    ("r-limit", "host-c", [AGENT, LIMITED])])


def test_tail_class_lists_the_runs_and_hosts_of_one_class(settings: Settings):
    committed(settings)
    out = io.StringIO()
    assert follow(settings, args(error_class="auth"), out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert sum("r-auth-1#" in line and " host=host-a " in line for line in lines) == 2
    assert sum("r-auth-2#" in line and " host=host-b " in line for line in lines) == 1
    assert all(line.endswith("[auth]") and " error " in line for line in lines), lines
    assert "RUN " not in out.getvalue() and "r-limit" not in out.getvalue()

    as_json = io.StringIO()
    follow(settings, args(error_class="rate_limit", json=True, type="error"), as_json)
    docs = [orjson.loads(line) for line in as_json.getvalue().splitlines()]
    assert [(d["runId"], d["errorClass"]) for d in docs] == [("r-limit", "rate_limit")]


def test_the_human_line_shows_the_class_beside_the_clis_code():
    assert summary({"type": "error", "message": "boom", "code": "server_error", "errorClass": "provider_unavailable"}) \
        == "boom [server_error provider_unavailable]"
    assert summary({"type": "warning", "message": "retrying", "errorClass": "rate_limit"}) == "retrying [rate_limit]"
    assert summary({"type": "agent", "message": "hi"}) == "hi"


def test_tail_class_with_another_type_is_a_usage_error(settings: Settings):
    env = os.environ | {"GOOSE_INGEST_REDIS_URL": settings.redis_url, "GOOSE_INGEST_NAMESPACE": settings.namespace}
    out = subprocess.run([sys.executable, "-m", "services.cli", "tail", "--no-follow", "--class", "auth",
                          "--type", "command"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].endswith("--class selects error and warning events, not --type command")
    assert len(out.stderr.strip().splitlines()) == 1
    bad = subprocess.run([sys.executable, "-m", "services.cli", "tail", "--class", "nope"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_a_retry_only_storm_is_listed_by_its_class_with_its_host(settings: Settings):
    # The timeout, provider and rate-limit alerts count retry warnings too: a storm of retries that
    # all recover has no `error` event, and `tail --class` must still name its runs and hosts.
    notice = orjson.dumps({"type": "error", "message": "Reconnecting... 1/5 (stream disconnected before completion)"}).decode()
    agent = orjson.dumps({"type": "item.completed", "item": {"id": "i0", "type": "agent_message", "text": "done"}}).decode()
    commit_runs(settings, "codex", [(run, host, [notice, notice, agent])
                                    for run, host in (("r-retry-1", "host-d"), ("r-retry-2", "host-e"))])
    out = io.StringIO()
    assert follow(settings, args(error_class="timeout"), out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert all(" warning " in line and line.endswith("[retry timeout]") for line in lines), lines
    assert sum("r-retry-1#" in line and " host=host-d " in line for line in lines) == 2
    assert sum("r-retry-2#" in line and " host=host-e " in line for line in lines) == 2
    none = io.StringIO()
    follow(settings, args(error_class="timeout", type="error"), none)
    assert none.getvalue() == "", "the retries are warnings: an error-only view has no rows"
