"""Redaction on the live path: events are redacted, the raw log is not, replay still matches."""

from __future__ import annotations

import json
import re
import urllib.request

import orjson
import pytest
import redis

from contracts.keys import shard_of
from services.broker.embedded import free_port
from services.replay.command import compare
from tests.support.pipeline import ended_runs, events_by_run, start_worker, stop, topic, wait_until

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
    stream = settings.layout.raw_stream(shard_of(run, settings.shards))
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


# --- every family on the live path ---------------------------------------------------------------

PW = {name: f"{name}Zq7{i}x9Lw3Vb" for i, name in enumerate(
    ["argpw", "envpw", "curlpw", "mysqlpw", "cookiepw", "netrcpw", "awssecret0123456789", "cutpw", "npmtok", "flagpw"])}
KEY_BODY = ["MIIEpAIBAAKCAQEA7bqZ3Jvb3Z5IGdvb3N5MIIEpAIBAAKCAQEA7bqZ3Jvb3Z5IGdv", "b3N5MIIEpAIBAAKCAQEA7bqZ3Jvb3Z5IGdvb3N5=="]
CUT_TOKEN = "ghp_" + "Zq7x9Lw3Vb" * 4  # cut in half by the span cap below
# issue 22: a goose tool named `acme__ghp_...`, and a host label with a token glued to it
TOOL_TOKEN = "ghp_" + "Tk5s0Vn4Qw" * 3 + "Tk5s0V"
HOST_TOKEN = "AKIAQYLPMN5HHHFPZAM2"
SPAN_CAP = 120


def _msg(mid: str, role: str, *blocks: dict) -> dict:
    return {"type": "message", "message": {"id": mid, "role": role, "content": list(blocks)}}


def _family_lines() -> list[tuple[str, bytes]]:
    """(stream, line) of one run that prints a secret of most families in most places."""
    unknown_tool = _msg("m1", "assistant", {"type": "toolRequest", "id": "c1", "toolCall": {"status": "success", "value": {
        "name": "db__connect", "arguments": {"host": "db", "password": PW["argpw"], "env": {"DB_PASSWORD": PW["envpw"]}}}}})
    shell = _msg("m2", "assistant", {"type": "toolRequest", "id": "c2", "toolCall": {"status": "success", "value": {
        "name": "shell", "arguments": {"command": f"curl -u deploy:{PW['curlpw']} https://ci.example.com && "
                                                  f"mysql -uroot -p{PW['mysqlpw']} acme --api-key {PW['flagpw']}"}}}})
    shell_done = _msg("m3", "user", {"type": "toolResponse", "id": "c2", "toolResult": {"status": "success", "value": {
        "content": [{"type": "text", "text": "ok"}], "isError": False}}})
    aws = _msg("m4", "assistant", {"type": "toolRequest", "id": "c3", "toolCall": {"status": "success", "value": {
        "name": "aws__sts", "arguments": {"op": "get-session-token"}}}})
    aws_out = json.dumps({"Credentials": {"AccessKeyId": "ASIAY34FZKBOKMUTVV7A", "SecretAccessKey": PW["awssecret0123456789"]}},
                         indent=4)
    aws_done = _msg("m5", "user", {"type": "toolResponse", "id": "c3", "toolResult": {"status": "success", "value": {
        "content": [{"type": "text", "text": aws_out}], "isError": False}}})
    netrc = _msg("m6", "assistant", {"type": "text", "text": f"Wrote ~/.netrc: machine h.example.com login me password "
                                                             f"{PW['netrcpw']} and ~/.npmrc: //r/:_authToken={PW['npmtok']}"})
    cut = _msg("m7", "assistant", {"type": "text", "text": "x" * (SPAN_CAP - 20) + f" token is {CUT_TOKEN} ok"})
    notif = {"type": "notification", "extensionId": "x", "data": {f"password={PW['cutpw']}": True}}
    glued = _msg("m8", "assistant", {"type": "toolRequest", "id": "c8", "toolCall": {"status": "success", "value": {
        "name": f"acme__{TOOL_TOKEN}", "arguments": {"q": "x"}}}})
    lines: list[tuple[str, bytes]] = [("stdout", orjson.dumps(x)) for x in (unknown_tool, shell, shell_done, aws, aws_done, netrc)]
    lines += [("stderr", b"-----BEGIN RSA PRIVATE KEY-----"), ("stdout", f"Cookie: sid={PW['cookiepw']}; t=1".encode())]
    lines += [("stderr", body.encode()) for body in KEY_BODY] + [("stderr", b"-----END RSA PRIVATE KEY-----")]
    lines += [("stdout", orjson.dumps(x)) for x in (cut, notif, glued)]
    return lines


def test_every_family_is_redacted_on_the_live_path_and_replays(settings, tmp_path):
    run = "redact/families"
    r = redis.Redis.from_url(settings.redis_url)
    stream = settings.layout.raw_stream(shard_of(run, settings.shards))
    lines = _family_lines()
    for seq, (std, line) in enumerate(lines):
        r.xadd(stream, {"run": run, "seq": seq, "ts": 1_000 + seq, "stream": std, "line": line,
                        "host": f"box{HOST_TOKEN}"})
    r.xadd(stream, {"run": run, "seq": len(lines), "ts": 2_000, "kind": "eof", "host": f"box{HOST_TOKEN}"})
    port = free_port()
    worker = start_worker(settings, tmp_path / "w.log", GOOSE_INGEST_MAX_SPAN_CHARS=str(SPAN_CAP),
                          GOOSE_INGEST_METRICS_PORT=str(port))
    try:
        wait_until(lambda: run in ended_runs(settings), timeout=30)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        stop(worker)
    events = events_by_run(settings)[run]
    published = orjson.dumps(events).decode()
    records = orjson.dumps([x for x in topic(settings, settings.layout.runs_partitions()) if x["runId"] == run]).decode()
    for token in (TOOL_TOKEN, HOST_TOKEN):
        assert token not in published and token not in records and token not in metrics, token
    assert "acme__[REDACTED:github-token]" in published and "box[REDACTED:aws-access-key-id]" in records
    raw = b"".join(f[b"line"] for _, f in r.xrange(stream) if b"line" in f).decode()
    for name, secret in PW.items():
        assert secret in raw, name  # the log of record stays as received
        assert secret not in published, name
    for body in KEY_BODY:
        assert body in raw and body not in published
    assert CUT_TOKEN[:12] not in published  # the half the cap left is gone too
    for marker in ("secret-field", "cli-password", "aws-secret-access-key", "netrc", "password-assignment", "cookie",
                   "private-key", "truncated-tail"):
        assert f"[REDACTED:{marker}]" in published, marker
    key_lines = [e["message"] for e in events if e["type"] == "warning" and "PRIVATE KEY" not in e.get("message", "x")]
    assert key_lines.count("[REDACTED:private-key]") >= len(KEY_BODY)
    # the same settings rebuild the same events from the raw log
    assert compare(settings.model_copy(update={"max_span_chars": SPAN_CAP}), run) == 0
