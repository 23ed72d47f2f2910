"""Redaction on the live path: events are redacted, the raw log is not, replay still matches."""

from __future__ import annotations

import re
import urllib.request

import orjson
import pytest
import redis

from services.broker.embedded import free_port
from services.broker.keys import shard_of
from services.replay.command import compare
from tests.pipeline_helpers import ended_runs, events_by_run, start_worker, stop, wait_until

pytestmark = pytest.mark.e2e

TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _lines() -> list[bytes]:
    req = {"type": "message", "message": {"id": "m1", "role": "assistant", "content": [
        {"type": "toolRequest", "id": "call_1", "toolCall": {"status": "success", "value": {
            "name": "shell", "arguments": {"command": f"curl -H 'Authorization: token {TOKEN}' https://api.github.com"}}}}]}}
    resp = {"type": "message", "message": {"id": "m2", "role": "user", "content": [
        {"type": "toolResponse", "id": "call_1", "toolResult": {"status": "success", "value": {
            "content": [{"type": "text", "text": "ok"}], "isError": False}}}]}}
    ask = {"type": "message", "message": {"id": "m3", "role": "assistant", "content": [
        {"type": "actionRequired", "data": {"actionType": "elicitation", "id": "el1", "message": "DB password?",
                                            "requested_schema": {"type": "object", "properties": {
                                                "pw": {"type": "string", "format": "password"}}}}}]}}
    answer = {"type": "message", "message": {"id": "m4", "role": "user", "content": [
        {"type": "actionRequired", "data": {"actionType": "elicitationResponse", "id": "el1",
                                            "user_data": {"pw": "correct-horse-battery"}, "action": "accept"}}]}}
    echo = {"type": "message", "message": {"id": "m5", "role": "assistant", "content": [
        {"type": "text", "text": "Connecting with correct-horse-battery now."}]}}
    return [orjson.dumps(x) for x in (req, resp, ask, answer, echo)]


@pytest.mark.parametrize("enabled", [True, False])
def test_events_are_redacted_and_the_raw_log_is_not(settings, tmp_path, enabled):
    run = "redact/run"
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.raw_stream(shard_of(run, settings.shards))
    lines = _lines()
    for seq, line in enumerate(lines):
        r.xadd(stream, {"run": run, "seq": seq, "ts": 1_000 + seq, "line": line})
    r.xadd(stream, {"run": run, "seq": len(lines), "ts": 2_000, "kind": "eof"})
    port = free_port()
    worker = start_worker(settings, tmp_path / "w.log", GOOSE_INGEST_REDACTION_ENABLED=str(enabled).lower(),
                          GOOSE_INGEST_METRICS_PORT=str(port))
    try:
        wait_until(lambda: run in ended_runs(settings), timeout=30)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        counted = re.search(r'^goose_ingest_redactions_total\{rule="github-token"\} (\S+)$', metrics, re.M)
        if enabled:
            assert counted and float(counted.group(1)) == 1.0
            assert re.search(r'^goose_ingest_redactions_total\{rule="form-secret"\} [1-9]', metrics, re.M)
        else:
            assert not counted or float(counted.group(1)) == 0.0
    finally:
        stop(worker)
    published = orjson.dumps(events_by_run(settings)[run]).decode()
    raw = b"".join(f[b"line"] for _, f in r.xrange(stream) if b"line" in f).decode()
    assert TOKEN in raw and "correct-horse-battery" in raw  # the log of record stays as received
    if enabled:
        assert TOKEN not in published and "[REDACTED:github-token]" in published
        assert "correct-horse-battery" not in published and "[REDACTED:form-secret]" in published
    else:
        assert TOKEN in published
    # Redaction is deterministic and replays identically.
    env_settings = settings.model_copy(update={"redaction_enabled": enabled})
    assert compare(env_settings, run) == 0
