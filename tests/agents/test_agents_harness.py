"""The harness's own parts, without any agent CLI: the model server's wire formats and faults, the
installer's failure paths, the drift report's comparisons."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agents import install as inst
from tests.agents.harness import load
from tests.agents.model_server import ALWAYS, Call, Cut, ModelServer, Reply, Scripted, Stall, Status, refused_url
from tests.agents.recapture import compare, field_paths, fields_report, shape
from tests.agents.run import Capture
from tests.agents.scenarios import scenario
from tests.support.fixtures import REPO

TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]


def post(server: ModelServer, path: str, body: dict, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def sse_data(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def anthropic_text(raw: bytes) -> str:
    return "".join(e["delta"].get("text", "") for e in sse_data(raw) if e["type"] == "content_block_delta")


def test_each_api_streams_a_scripted_tool_call_then_text() -> None:
    call = Call("Read", {"file_path": "/x"})
    script = [Reply("a", (call,)), Reply("b", (call,)), Reply("c", (call,)), Reply("d", (call,))]
    with ModelServer(script) as s:
        _, head, raw = post(s, "/v1/messages", {"stream": True, "tools": TOOLS})
        events = sse_data(raw)
        assert head["content-type"] == "text/event-stream"
        assert [e["type"] for e in events][0] == "message_start" and events[-1]["type"] == "message_stop"
        assert any(e.get("content_block", {}).get("name") == "Read" for e in events)
        assert any(e.get("delta", {}).get("stop_reason") == "tool_use" for e in events)
        done = [e["item"] for e in sse_data(post(s, "/v1/responses", {"stream": True})[2])
                if e["type"] == "response.output_item.done"]
        assert [i["type"] for i in done] == ["message", "function_call"] and json.loads(done[1]["arguments"]) == {"file_path": "/x"}
        chunks = sse_data(post(s, "/v1/chat/completions", {"stream": True, "tools": [{"type": "function"}]})[2])
        assert any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
        assert any(c["choices"] and c["choices"][0]["finish_reason"] == "tool_calls" for c in chunks)
        parts = [p for c in sse_data(post(s, "/v1beta/models/m:streamGenerateContent?alt=sse", {"contents": []})[2])
                 for p in c["candidates"][0]["content"]["parts"]]
        assert {"functionCall": {"name": "Read", "args": {"file_path": "/x"}}} in parts
        # the script is used up: a short final text, never a hang
        assert anthropic_text(post(s, "/v1/messages", {"stream": True, "tools": TOOLS})[2]) == "Done."
        assert len(s.turns()) == 5


def test_side_requests_take_no_step() -> None:
    with ModelServer([Reply("the turn")]) as s:
        assert b"Scripted side answer" in post(s, "/v1/messages", {"stream": False})[2]  # no tools: a helper call
        assert json.loads(post(s, "/v1beta/models/m:countTokens", {})[2]) == {"totalTokens": 10}
        assert anthropic_text(post(s, "/v1/messages", {"stream": True, "tools": TOOLS})[2]) == "the turn"


@pytest.mark.parametrize(("path", "kind", "status", "needle"), [
    ("/v1/messages", "auth", 401, "authentication_error"),
    ("/v1/messages", "overloaded", 529, "overloaded_error"),
    ("/v1/messages", "quota", 400, "credit balance is too low"),
    ("/v1/responses", "quota", 429, "insufficient_quota"),
    ("/v1/responses", "context_length", 400, "context_length_exceeded"),
    ("/v1/chat/completions", "rate_limit", 429, "rate_limit_exceeded"),
    ("/v1beta/models/m:streamGenerateContent", "overloaded", 503, "UNAVAILABLE"),
])
def test_status_faults_carry_the_provider_s_error_body_and_retry_after(path, kind, status, needle) -> None:
    body = {"stream": True, "tools": TOOLS if "messages" in path else [{"type": "function"}]}
    with ModelServer([Scripted(Status(kind, retry_after_s=0.5), ALWAYS)]) as s:
        for _ in range(2):  # ALWAYS: every retry meets it again
            got, head, raw = post(s, path, body)
            assert got == status and needle in raw.decode()
            assert head["retry-after"] == "0.5" and head["retry-after-ms"] == "500"


def test_gemini_s_answer_to_an_unknown_key_is_a_400_with_api_key_invalid() -> None:
    with ModelServer([Status("bad_key")]) as s:
        got, _, raw = post(s, "/v1beta/models/m:streamGenerateContent", {"contents": []})
        error = json.loads(raw)["error"]
        assert got == 400 and error["status"] == "INVALID_ARGUMENT"
        assert error["details"][0]["reason"] == "API_KEY_INVALID"


def test_a_truncated_reply_ends_on_each_api_s_token_limit_and_an_empty_one_has_no_text() -> None:
    cut = Reply("The answer", truncated=True)
    with ModelServer([cut, cut, cut, cut, Reply(), Reply()]) as s:
        stops = [e["delta"].get("stop_reason") for e in sse_data(post(s, "/v1/messages", {"stream": True, "tools": TOOLS})[2])
                 if e["type"] == "message_delta"]
        assert stops == ["max_tokens"]
        events = sse_data(post(s, "/v1/responses", {"stream": True})[2])
        assert events[-1]["type"] == "response.incomplete"
        assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
        chunks = sse_data(post(s, "/v1/chat/completions", {"stream": True, "tools": [{"type": "function"}]})[2])
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == ["length"]
        gemini = "/v1beta/models/m:streamGenerateContent?alt=sse"
        cands = [c["candidates"][0] for c in sse_data(post(s, gemini, {"contents": []})[2])]
        assert cands[-1]["finishReason"] == "MAX_TOKENS" and "".join(p["text"] for c in cands for p in c["content"]["parts"]) == "The answer"
        chunks = sse_data(post(s, "/v1/chat/completions", {"stream": True, "tools": [{"type": "function"}]})[2])
        assert not any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)
        cands = [c["candidates"][0] for c in sse_data(post(s, gemini, {"contents": []})[2])]
        assert cands == [{"content": {"parts": [], "role": "model"}, "index": 0, "finishReason": "STOP"}]


def test_a_prefilled_chat_request_gets_text_and_takes_no_step() -> None:
    """opencode at its step limit still offers tools but ends the request with an assistant prefill."""
    call = Call("bash", {"command": "ls"})
    tools = [{"type": "function"}]
    with ModelServer([Scripted(Reply("again", (call,)), ALWAYS)]) as s:
        prefill = {"role": "assistant", "content": "CRITICAL - MAXIMUM STEPS REACHED"}
        chunks = sse_data(post(s, "/v1/chat/completions", {"stream": True, "tools": tools,
                                                           "messages": [{"role": "user", "content": "go"}, prefill]})[2])
        assert not any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
        assert s.turns() == []
        chunks = sse_data(post(s, "/v1/chat/completions", {"stream": True, "tools": tools,
                                                           "messages": [{"role": "user", "content": "go"}]})[2])
        assert any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
        assert len(s.turns()) == 1


def test_a_cut_stream_resets_the_connection_mid_body() -> None:
    with ModelServer([Cut()]) as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        conn.request("POST", "/v1/messages", json.dumps({"stream": True, "tools": TOOLS}))
        resp = conn.getresponse()
        assert resp.status == 200
        with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
            resp.read()


def test_a_stalled_stream_sends_headers_and_a_first_event_then_nothing() -> None:
    with ModelServer([Stall(4)]) as s:
        body = json.dumps({"stream": True}).encode()
        with socket.create_connection(("127.0.0.1", s.port), timeout=2) as sock:
            sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            got = b""
            while b"response.created" not in got:
                got += sock.recv(65536)
            assert got.startswith(b"HTTP/1.1 200") and b"text/event-stream" in got
            sock.settimeout(1.5)
            with pytest.raises(TimeoutError):
                sock.recv(65536)


def test_refused_url_refuses() -> None:
    port = int(refused_url().rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


# --- the installer ------------------------------------------------------------------------------
def _fake_npm(folder: Path, script: str) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    for tool, body in (("npm", script), ("node", "#!/bin/sh\nexit 0\n")):
        path = folder / tool
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}:/usr/bin:/bin"}


def test_install_without_npm_is_a_one_line_error(tmp_path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "tests.agents.install"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["cannot install the agent CLIs: node is not on PATH"]


def test_a_failing_npm_is_retried_a_bounded_number_of_times_and_leaves_nothing(tmp_path, monkeypatch) -> None:
    counter = tmp_path / "calls"
    env = _fake_npm(tmp_path / "bin", f"#!/bin/sh\necho x >> {counter}\necho 'npm ERR! 503' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("GOOSE_INGEST_AGENTS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    with pytest.raises(RuntimeError, match="failed 3 times: npm ERR! 503"):
        inst.install(inst.CLIS["codex"])
    assert len(counter.read_text().splitlines()) == inst.NPM_ATTEMPTS
    assert not list((tmp_path / "cache").iterdir())  # no half-installed folder left behind


def test_an_installed_version_is_not_installed_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GOOSE_INGEST_AGENTS_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", _fake_npm(tmp_path / "bin", "#!/bin/sh\nexit 1\n")["PATH"])
    exe = inst.binary(inst.CLIS["claude-code"])
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    assert inst.install(inst.CLIS["claude-code"]) == exe
    assert exe.parent.parent.parent.name == "claude-code@2.1.197"


def test_unknown_cli_is_a_usage_error(tmp_path) -> None:
    env = {**_fake_npm(tmp_path / "bin", "#!/bin/sh\nexit 0\n"), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "tests.agents.install", "--cli", "cursor"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown CLI 'cursor'" in out.stderr


# --- the drift report ---------------------------------------------------------------------------
def test_the_drift_report_names_new_record_types_fields_and_changed_events() -> None:
    old = load("claude-code", "tools")
    sc = scenario("claude-code", "tools")
    same, held = compare(sc, old, old)
    assert held and not [x for x in same if x.startswith("- new") or "changed" in x or "gone" in x]
    stdout = [json.dumps({**json.loads(line), "brand_new": {"x": 1}}) if '"type":"result"' in line else line
              for line in old.stdout]
    stdout.insert(1, json.dumps({"type": "system", "subtype": "brand_new_subtype", "task_id": "t1"}))
    stdout = [line for line in stdout if "Write" not in line or '"tool_use"' not in line]  # a tool call lost
    new = Capture(old.cli, "9.9.9", old.scenario, stdout, old.stderr, old.exit_code, 1.0)
    lines, held = compare(sc, old, new)
    text = "\n".join(lines)
    assert "new record types: system/brand_new_subtype" in text
    fields = "\n".join(fields_report([old], [new]))
    assert "new record types: system/brand_new_subtype" in fields
    assert "`result/success` new fields: brand_new, brand_new.x" in fields
    assert "unknown 0 -> 2" in text  # the new record, and the result of the Write call that was lost
    assert "- events changed:" in text and "FAILS" in text and not held
    assert shape(old.stdout).keys() <= shape(stdout).keys()
    assert "\n".join(fields_report([old], [old])).count("- none") == 1


def test_keys_that_are_data_collapse_to_a_star() -> None:
    assert field_paths({"modelUsage": {"claude-sonnet-4-5": {"costUSD": 1}}, "a_b": [{"c": 1}]}) == {
        "modelUsage", "modelUsage.*", "modelUsage.*.costUSD", "a_b", "a_b[].c"}


def test_recapture_without_npm_is_a_one_line_error(tmp_path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "tests.agents.recapture", "--cli", "codex"], cwd=REPO,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == ["recapture needs node and npm: node is not on PATH"]


def test_opencode_needs_ripgrep_on_the_host(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert inst.host_missing("opencode") == "rg is not on PATH (the opencode CLI's search tools run it)"
    assert inst.host_missing("codex") is None
    rg = tmp_path / "rg"
    rg.write_text("#!/bin/sh\n")
    rg.chmod(0o755)
    assert inst.host_missing("opencode") is None


def test_a_capture_keeps_an_echoed_megabyte_as_its_start_and_length(tmp_path) -> None:
    from tests.agents.harness import ABRIDGE_CHARS, save

    big = "x" * (ABRIDGE_CHARS + 10)
    cap = Capture("gemini-cli", "0.61.0", "context-preflight", ["{}", big], ["warn"], 0, 1.0)
    saved = json.loads(save(cap, tmp_path).read_text())
    assert saved["stdout"] == ["{}", "x" * ABRIDGE_CHARS + f"... [abridged: {ABRIDGE_CHARS + 10} characters]"]
    assert saved["stderr"] == ["warn"] and load("gemini-cli", "context-preflight", tmp_path).stdout == saved["stdout"]
