"""`goose-ingest tap` / `publish` and the Publisher, against a real Redis (docs/raw-entries.md)."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis
from hypothesis import given
from hypothesis import settings as settings_h
from hypothesis import strategies as st

from contracts.keys import shard_of
from services.broker.url import redact_url
from services.tap import resp
from services.tap.launchers import format_of_command
from services.tap.lines import LineSplitter
from services.tap.publish_input import strip_newline
from services.tap.publisher import ENTRY_LABELS, MEM_CAP_BYTES, RESERVED_FIELDS, LineEncoder, Publisher, RunFinished
from services.tap.resp import xadd_records
from services.tap.runkey import is_valid_run, new_run_key, ulid
from services.tap.spool import LOG, SpoolLocked, decode_record, encode_record, spool_path
from tests.support.fixtures import FIXTURES, SHARED
from tests.support.redis_server import cli_env

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = FIXTURES / "a-read-edit-test-finish.jsonl"
LINE_FIELDS = ["run", "seq", "ts", "kind", "stream", "line", "host"]
EOF_FIELDS = ["run", "seq", "ts", "kind", "host"]

pytestmark = pytest.mark.timeout(120)


# --- helpers ---------------------------------------------------------------------------------------
def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", *args]


def run_cli(settings, *args: str, input: bytes | None = None, timeout: float = 60, **env: str):
    stdin = {} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(cli(*args), cwd=ROOT, env=cli_env(settings, **env), input=input,
                          capture_output=True, timeout=timeout, **stdin)


def entries(settings, run: str) -> list[dict[str, bytes]]:
    """Entries of `run` in its shard stream, in stream order, as {field: value} with str keys."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        rows = client.xrange(settings.layout.raw_stream(shard_of(run, settings.shards)))
    finally:
        client.close()
    out = []
    for _id, fields in rows:
        f = {k.decode(): v for k, v in fields.items()}
        if f.get("run") == run.encode():
            out.append(f)
    return out


def spooled(settings, run: str) -> int:
    log = spool_path(settings, run) / LOG
    try:
        return log.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def on(settings, server):
    return settings.model_copy(update={"redis_url": server.url})


def file_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


# --- run keys and helpers --------------------------------------------------------------------------
def test_ulid_and_run_keys():
    assert ulid(0, bytes(10)) == "0" * 26
    assert ulid((1 << 48) - 1, b"\xff" * 10) == "7" + "Z" * 25
    a, b = ulid(1_700_000_000_000), ulid(1_700_000_000_001)
    assert len(a) == 26 and a < b and re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", a)
    key = new_run_key("my host/1")
    assert re.fullmatch(r"my-host-1/[0-9A-Z]{26}", key) and is_valid_run(key)
    assert is_valid_run("laptop-42/20261129_3") and is_valid_run("a@b:c.d_e-f/g")
    for bad in ["", "x" * 201, "a b", "a\n", "ü", "a#b"]:
        assert not is_valid_run(bad)


def test_redact_url():
    assert redact_url("redis://user:s3cret@h:6379/0") == "redis://***@h:6379/0"
    assert redact_url("rediss://:s3cret@h/1") == "rediss://***@h/1"
    assert redact_url("redis://h:6379") == "redis://h:6379"


@pytest.mark.parametrize("command,expected", [
    (["goose", "run", "--output-format", "stream-json"], "goose"),
    (["/usr/local/bin/goose", "run"], "goose"),
    (["claude", "-p", "--output-format", "stream-json", "--verbose", "hi"], "claude-code"),
    (["codex", "exec", "--json", "fix it"], "codex"),
    (["env", "-i", "HOME=/tmp", "ANTHROPIC_API_KEY=x", "claude", "-p"], "claude-code"),
    (["/usr/bin/env", "-u", "DEBUG", "codex", "exec"], "codex"),
    (["npx", "-y", "@anthropic-ai/claude-code", "-p", "hi"], "claude-code"),
    (["npx", "--yes", "@openai/codex@0.46.0", "exec", "--json"], "codex"),
    (["npx", "--package=@openai/codex", "codex", "exec"], "codex"),
    (["pnpm", "dlx", "@anthropic-ai/claude-code", "-p"], "claude-code"),
    (["nohup", "nice", "-n", "5", "goose", "run"], "goose"),
    (["gemini", "-p", "hi", "--output-format", "stream-json"], "gemini-cli"),
    (["env", "GEMINI_CLI_TRUST_WORKSPACE=true", "/usr/local/bin/gemini", "-p", "hi"], "gemini-cli"),
    (["npx", "-y", "@google/gemini-cli@0.61.0", "-p", "hi", "-o", "stream-json"], "gemini-cli"),
    (["opencode", "run", "--format", "json", "hi"], "opencode"),
    (["env", "PWD=/srv/proj", "opencode", "run", "--format", "json"], "opencode"),
    (["npx", "--yes", "opencode-ai@1.18.33", "run", "--format", "json"], "opencode"),
    (["bunx", "opencode-ai", "run"], "opencode"),
    (["python3", "gemini"], None),
    (["python3", "-c", "print(1)"], None),
    (["env", "FOO=1", "python3", "claude"], None),  # an argument named like an agent is not the command
    (["npx", "cowsay", "codex"], None),
    (["env"], None),
    ([], None),
])
def test_the_tap_recognises_the_agent_it_wraps(command, expected):
    assert format_of_command(command) == expected


def _fake_agent(tmp_path: Path, name: str, transcript: Path) -> Path:
    """An executable called `name` that prints a shared transcript, as the real CLI would."""
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\nexec cat {transcript}\n")
    path.chmod(0o755)
    return path


@pytest.mark.e2e
@pytest.mark.parametrize("name,fixture_dir,launcher,expected", [
    ("claude", "claude-code", [], "claude-code"),
    ("codex", "codex", ["env", "CODEX_HOME=/tmp"], "codex"),
    ("goose", "goose", [], "goose"),
])
def test_tap_labels_the_entries_with_the_format_of_the_agent_it_wraps(settings, tmp_path, name, fixture_dir,
                                                                       launcher, expected):
    transcript = sorted((SHARED / "fixtures" / fixture_dir).glob("*.jsonl"))[0]
    agent = _fake_agent(tmp_path, name, transcript)
    run = f"test/format-{name}"
    res = run_cli(settings, "tap", "--run", run, "--quiet", "--", *launcher, str(agent))
    assert res.returncode == 0, res.stderr.decode()
    got = entries(settings, run)
    assert len(got) == len(file_lines(transcript)) + 1
    assert all(e["format"] == expected.encode() and e["agent"] == expected.encode() for e in got)
    # --format wins over recognition; --agent is independent
    res = run_cli(settings, "tap", "--run", run + "-x", "--quiet", "--format", "goose", "--agent", "fleet/7", "--",
                  str(agent))
    assert res.returncode == 0, res.stderr.decode()
    assert all(e["format"] == b"goose" and e["agent"] == b"fleet/7" for e in entries(settings, run + "-x"))


@pytest.mark.e2e
def test_publish_format_labels_every_entry(settings):
    transcript = sorted((SHARED / "fixtures" / "codex").glob("*.jsonl"))[0]
    res = run_cli(settings, "publish", "--run", "test/publish-codex", "--format", "codex", str(transcript))
    assert res.returncode == 0, res.stderr.decode()
    got = entries(settings, "test/publish-codex")
    assert len(got) == len(file_lines(transcript)) + 1 and all(e["format"] == b"codex" for e in got)
    res = run_cli(settings, "publish", "--run", "test/publish-bad", "--format", "gemini", str(transcript))
    assert res.returncode == 2 and b"invalid choice: 'gemini'" in res.stderr
    assert entries(settings, "test/publish-bad") == []


# --- publish ----------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_publish_fixture_file(settings):
    expected = file_lines(FIXTURE)
    assert len(expected) > 5
    run = "test/publish-fixture"
    t0 = int(time.time() * 1000)
    res = run_cli(settings, "publish", "--run", run, str(FIXTURE))
    t1 = int(time.time() * 1000)
    assert res.returncode == 0, res.stderr.decode()
    got = entries(settings, run)
    assert len(got) == len(expected) + 1
    for i, (e, line) in enumerate(zip(got, expected, strict=False)):
        assert list(e) == LINE_FIELDS
        assert e["run"] == run.encode() and e["seq"] == str(i).encode()
        assert e["kind"] == b"line" and e["stream"] == b"stdout" and e["line"] == line
        assert e["host"] == b"test-host"
        assert t0 - 1 <= int(e["ts"]) <= t1 + 1
    eof = got[-1]
    assert list(eof) == EOF_FIELDS  # no exit code from a file
    assert eof["kind"] == b"eof" and eof["seq"] == str(len(expected)).encode()
    # only the run's own shard stream was written, and the spool is gone after a clean finish
    other = settings.layout.raw_stream(1 - shard_of(run, settings.shards))
    assert redis.Redis.from_url(settings.redis_url).xlen(other) == 0
    assert not spool_path(settings, run).exists()


@pytest.mark.e2e
def test_publish_keeps_bytes_exact_from_stdin(settings):
    data = b'{"a":1}\r\n\n\xff\xfe not utf-8 \xc3\n' + "ünïcode ✓\n".encode() + b"no newline at end\r"
    run = "test/bytes"
    res = run_cli(settings, "publish", "--run", run, "--agent", "goose/1.56.0", "-", input=data)
    assert res.returncode == 0, res.stderr.decode()
    got = entries(settings, run)
    assert [e["line"] for e in got[:-1]] == [b'{"a":1}', b"", b"\xff\xfe not utf-8 \xc3", "ünïcode ✓".encode(),
                                            b"no newline at end\r"]
    assert all(e["agent"] == b"goose/1.56.0" for e in got)
    assert got[-1]["kind"] == b"eof"


@pytest.mark.e2e
def test_publish_no_eof_then_continue(settings, tmp_path):
    run = "test/no-eof"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"a0\na1\n")
    b.write_bytes(b"b0\n")
    assert run_cli(settings, "publish", "--run", run, "--no-eof", str(a)).returncode == 0
    assert spool_path(settings, run).exists()  # keeps the seq counter for the run
    assert run_cli(settings, "publish", "--run", run, str(b)).returncode == 0
    got = entries(settings, run)
    assert [(e["seq"], e.get("line")) for e in got] == [(b"0", b"a0"), (b"1", b"a1"), (b"2", b"b0"), (b"3", None)]
    assert not spool_path(settings, run).exists()


# --- tap --------------------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys, time
    for i in range(3):
        print(f'{{"type":"message","n":{i}}}', flush=True)
        print(f"warn {i}", file=sys.stderr, flush=True)
        time.sleep(0.01)
    print("last", flush=True)
    sys.exit(3)
""")


@pytest.mark.e2e
def test_tap_child_process(settings):
    res = run_cli(settings, "tap", "--", sys.executable, "-c", CHILD)
    assert res.returncode == 3, res.stderr.decode()
    m = re.search(rb"goose-ingest: run (\S+)", res.stderr)
    assert m, res.stderr
    run = m.group(1).decode()
    assert re.fullmatch(r"test-host/[0-9A-Z]{26}", run)
    # echoed
    assert res.stdout.splitlines() == [b'{"type":"message","n":0}', b'{"type":"message","n":1}',
                                       b'{"type":"message","n":2}', b"last"]
    assert b"warn 2" in res.stderr
    got = entries(settings, run)
    assert [int(e["seq"]) for e in got] == list(range(len(got))) and len(got) == 8
    out = [e["line"] for e in got if e.get("stream") == b"stdout"]
    err = [e["line"] for e in got if e.get("stream") == b"stderr"]
    assert out == res.stdout.splitlines()
    assert err == [b"warn 0", b"warn 1", b"warn 2"]
    for e in got[:-1]:
        assert list(e) == LINE_FIELDS
    eof = got[-1]
    assert eof["kind"] == b"eof" and eof["exit"] == b"3"
    # no agent label: the eof alone names the command (a run without JSON ends as "<it> exited")
    assert list(eof) == ["run", "seq", "ts", "kind", "exit", "host", "agent"]
    assert eof["agent"] == os.path.basename(sys.executable).encode()


@pytest.mark.e2e
def test_tap_quiet_and_given_run(settings):
    run = "test/quiet@x"
    res = run_cli(settings, "tap", "--run", run, "--quiet", "--agent", "goose/1.0", "--",
                  sys.executable, "-c", "print('x'); import sys; print('y', file=sys.stderr)")
    assert res.returncode == 0
    assert res.stdout == b"" and b"y\n" not in res.stderr
    assert f"goose-ingest: run {run}".encode() in res.stderr
    got = entries(settings, run)
    assert sorted(e["line"] for e in got[:-1]) == [b"x", b"y"]
    assert got[-1]["exit"] == b"0" and all(e["agent"] == b"goose/1.0" for e in got)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_tap_forwards_signals(settings, sig):
    run = f"test/signal-{int(sig)}"
    child = "import time; print('ready', flush=True); time.sleep(30)"
    proc = subprocess.Popen(cli("tap", "--run", run, "--", sys.executable, "-c", child), cwd=ROOT,
                            env=cli_env(settings), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    # the child dies of the forwarded signal (python re-raises an unhandled SIGINT as a signal death)
    assert rc == 128 + int(sig)
    eof = entries(settings, run)[-1]
    assert eof["exit"] == str(-int(sig)).encode()
    assert eof["signal"] == str(int(sig)).encode()  # what the tap did, beside what the command said


@pytest.mark.e2e
def test_a_command_that_exits_0_on_the_forwarded_signal_still_has_the_signal_on_its_eof(settings):
    """Gemini CLI's signal handlers exit 0 without a `result`: the eof says the tap stopped it."""
    run = "test/signal-exit-0"
    child = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(0)); "
             "print('ready', flush=True); time.sleep(30)")
    proc = subprocess.Popen(cli("tap", "--run", run, "--", sys.executable, "-c", child), cwd=ROOT,
                            env=cli_env(settings), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert rc == 0
    eof = entries(settings, run)[-1]
    assert eof["kind"] == b"eof" and eof["exit"] == b"0" and eof["signal"] == b"2"


@pytest.mark.e2e
def test_tap_missing_command(settings):
    res = run_cli(settings, "tap", "--run", "test/nocmd", "--", "/nonexistent/goose", "run")
    assert res.returncode == 127
    assert b"cannot run '/nonexistent/goose'" in res.stderr
    assert not spool_path(settings, "test/nocmd").exists()


# --- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.e2e
def test_bad_arguments(settings, tmp_path):
    for args in (["tap", "--run", "bad run", "--", "true"], ["publish", "--run", "a#b", str(FIXTURE)],
                 ["publish", "--run", "x" * 201, str(FIXTURE)]):
        res = run_cli(settings, *args)
        assert res.returncode == 2, args
        assert b"invalid --run" in res.stderr and b"1-200 characters" in res.stderr
    res = run_cli(settings, "publish", "--run", "test/missing", str(tmp_path / "missing.jsonl"))
    assert res.returncode == 2
    assert b"cannot read" in res.stderr and b"No such file or directory" in res.stderr
    assert not spool_path(settings, "test/missing").exists()
    res = run_cli(settings, "tap", "--run", "test/x")
    assert res.returncode == 2 and b"no command given" in res.stderr
    res = run_cli(settings, "publish", str(FIXTURE))
    assert res.returncode == 2 and b"--run" in res.stderr


# --- broker outages and crashes ---------------------------------------------------------------------
@pytest.mark.e2e
def test_publish_survives_broker_down_then_up(settings, private_redis, tmp_path):
    s = on(settings, private_redis)
    n = 300
    src = tmp_path / "lines.jsonl"
    src.write_bytes(b"".join(b'{"type":"message","i":%d}\n' % i for i in range(n)))
    run = "test/outage"
    private_redis.stop()
    proc = subprocess.Popen(cli("publish", "--run", run, str(src)), cwd=ROOT, env=cli_env(s),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: spooled(s, run) == n + 1, 30, "all entries spooled")
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting for the broker, not failed
        private_redis.start()  # same port
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert rc == 0, err.decode()
    assert b"broker unreachable" in err
    got = entries(s, run)
    assert [int(e["seq"]) for e in got] == list(range(n + 1))
    assert [e["line"] for e in got[:-1]] == file_lines(src)
    assert got[-1]["kind"] == b"eof"
    assert not spool_path(s, run).exists()


@pytest.mark.e2e
def test_password_is_never_printed(settings, private_redis, tmp_path):
    private_redis.stop()
    url = f"redis://someuser:s3cret-pw@127.0.0.1:{private_redis.port}/0"
    s = settings.model_copy(update={"redis_url": url})
    res = run_cli(s, "publish", "--run", "test/pw", "--drain-timeout", "1", "-", input=b"x\n")
    assert res.returncode == 1
    assert b"s3cret-pw" not in res.stderr + res.stdout
    assert b"redis://***@127.0.0.1" in res.stderr
    assert b"publish --run test/pw --drain" in res.stderr
    assert spooled(s, "test/pw") == 2  # kept for later delivery
    private_redis.start()
    s2 = on(settings, private_redis)  # same spool dir and namespace, reachable broker
    res = run_cli(s2, "publish", "--run", "test/pw", "--drain")
    assert res.returncode == 0, res.stderr.decode()
    assert [e.get("line") for e in entries(s2, "test/pw")] == [b"x", None]
    assert not spool_path(s2, "test/pw").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("broker_down_first", [True, False], ids=["broker-down", "broker-up"])
def test_tap_sigkill_and_resume(settings, private_redis, tmp_path, broker_down_first):
    s = on(settings, private_redis)
    run = "test/crash"
    pidfile = tmp_path / "child.pid"
    first = textwrap.dedent(f"""
        import os, sys, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        for i in range(5):
            print(f"A{{i}}", flush=True)
        print("Aerr", file=sys.stderr, flush=True)
        time.sleep(60)
    """)
    if broker_down_first:
        private_redis.stop()
    tap = subprocess.Popen(cli("tap", "--run", run, "--quiet", "--", sys.executable, "-c", first), cwd=ROOT,
                           env=cli_env(s), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        wait_for(lambda: spooled(s, run) == 6, 30, "6 entries spooled")
        if not broker_down_first:
            wait_for(lambda: len(entries(s, run)) == 6, 30, "6 entries delivered")
        tap.kill()  # SIGKILL: no cleanup at all
        tap.wait(timeout=10)
    finally:
        tap.kill()
        tap.communicate()
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert spool_path(s, run).exists()
    if broker_down_first:
        assert entries_safe(s, run) == []
        private_redis.start()

    second = "import sys\nfor i in range(4): print(f'B{i}', flush=True)\n"
    res = subprocess.run(cli("tap", "--run", run, "--", sys.executable, "-c", second), cwd=ROOT, env=cli_env(s),
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    assert b"resuming run test/crash" in res.stderr

    got = entries(s, run)
    by_seq: dict[int, dict] = {}
    for e in got:  # re-sent entries (lost confirmations) must be identical copies
        seq = int(e["seq"])
        assert by_seq.setdefault(seq, e) == e
    assert sorted(by_seq) == list(range(11))
    first_six = [by_seq[i] for i in range(6)]
    assert [e["line"] for e in first_six if e["stream"] == b"stdout"] == [b"A0", b"A1", b"A2", b"A3", b"A4"]
    assert [e["line"] for e in first_six if e["stream"] == b"stderr"] == [b"Aerr"]
    assert [by_seq[i]["line"] for i in range(6, 10)] == [b"B0", b"B1", b"B2", b"B3"]
    assert by_seq[10]["kind"] == b"eof" and by_seq[10]["exit"] == b"0"
    if broker_down_first:
        assert len(got) == 11  # nothing was sent before the crash: no duplicates at all
    assert not spool_path(s, run).exists()


def entries_safe(settings, run):
    try:
        return entries(settings, run)
    except redis.ConnectionError:
        return []


# --- the Publisher API --------------------------------------------------------------------------------
def test_publisher_api(settings):
    run = "test/api"
    with Publisher(settings, run, {"host": "h1", "agent": "goose/1.2"}) as pub:
        assert pub.add_line(b"one", "stdout", ts_ms=1234) == 0
        assert pub.add_line("two", "stderr", extra={"source": "backfill", "file": "x.jsonl"}) == 1
        with pytest.raises(ValueError):
            pub.add_line(b"x", extra={"seq": "9"})  # reserved
        with pytest.raises(ValueError):
            pub.add_line(b"x", "stdin")
        assert pub.flush(timeout=10)
        assert pub.sent_count == 2 and pub.pending == 0
        assert pub.add_eof(-9) == 2
        with pytest.raises(RunFinished):
            pub.add_line(b"late")
    got = entries(settings, run)
    assert got[0] == {"run": run.encode(), "seq": b"0", "ts": b"1234", "kind": b"line", "stream": b"stdout",
                      "line": b"one", "host": b"h1", "agent": b"goose/1.2"}
    assert got[1]["source"] == b"backfill" and got[1]["file"] == b"x.jsonl" and got[1]["stream"] == b"stderr"
    assert got[2]["kind"] == b"eof" and got[2]["exit"] == b"-9"
    assert not spool_path(settings, run).exists()


def test_publisher_resume_in_process(settings, private_redis):
    s = on(settings, private_redis)
    run = "test/api-resume"
    private_redis.stop()
    pub = Publisher(s, run, {"host": "h"})
    for i in range(10):
        pub.add_line(b"L%d" % i, source="f")
    assert not pub.flush(timeout=0.3)
    with pytest.raises(SpoolLocked):
        Publisher(s, run)  # one process per run
    assert not pub.close(timeout=0.2)
    private_redis.start()
    with Publisher(s, run, {"host": "h"}) as pub2:
        assert pub2.resumed == 10 and pub2.next_seq == 10 and pub2.lines_from("f") == 10
        pub2.add_line(b"L10")
        pub2.add_eof(0)
    got = entries(s, run)
    assert [e.get("line") for e in got] == [b"L%d" % i for i in range(11)] + [None]
    assert [int(e["seq"]) for e in got] == list(range(12))


def test_publisher_batches_in_pipelines(settings):
    s = settings.model_copy(update={"publish_batch": 50})
    run = "test/batch"
    with Publisher(s, run) as pub:
        for i in range(1000):
            pub.add_line(b"x%d" % i)
        pub.add_eof(0)
    got = entries(s, run)
    assert [int(e["seq"]) for e in got] == list(range(1001))


@pytest.mark.e2e
def test_publish_sigkilled_mid_file_resumes_without_loss(settings, private_redis, tmp_path):
    s = on(settings, private_redis)
    n = 200_000
    src = tmp_path / "big.jsonl"
    src.write_bytes(b"".join(b'{"i":%d}\n' % i for i in range(n)))
    run = "test/publish-crash"
    private_redis.stop()
    proc = subprocess.Popen(cli("publish", "--run", run, str(src)), cwd=ROOT, env=cli_env(s),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: spooled(s, run) >= 2000, 60, "2000 entries spooled")
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.communicate()
    at_kill = spooled(s, run)
    print(f"spooled at kill: {at_kill} of {n}")
    private_redis.start()
    res = run_cli(s, "publish", "--run", run, str(src), timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    got = entries(s, run)
    assert [int(e["seq"]) for e in got] == list(range(n + 1))
    assert [e["line"] for e in got[:-1]] == file_lines(src)
    if at_kill < n:
        assert b"skipping the first" in res.stderr


@pytest.mark.e2e
def test_publish_same_file_again_skips_spooled_lines(settings, private_redis, tmp_path):
    s = on(settings, private_redis)
    src = tmp_path / "f.txt"
    src.write_bytes(b"l0\nl1\nl2\n")
    run = "test/same-file"
    private_redis.stop()
    res = run_cli(s, "publish", "--run", run, "--no-eof", "--drain-timeout", "0.3", str(src))
    assert res.returncode == 1 and spooled(s, run) == 3
    private_redis.start()
    res = run_cli(s, "publish", "--run", run, str(src))
    assert res.returncode == 0, res.stderr.decode()
    got = entries(s, run)
    assert [e.get("line") for e in got] == [b"l0", b"l1", b"l2", None]
    # --no-skip appends the same input again (e.g. a second batch read from stdin)
    run2 = "test/no-skip"
    assert run_cli(s, "publish", "--run", run2, "--no-eof", "-", input=b"x\n").returncode == 0
    assert run_cli(s, "publish", "--run", run2, "--no-skip", "-", input=b"x\n").returncode == 0
    assert [e.get("line") for e in entries(s, run2)] == [b"x", b"x", None]


def test_spool_recovers_a_torn_last_write(settings):
    run = "test/torn"
    with Publisher(settings, run, client=redis.Redis(host="127.0.0.1", port=1)) as pub:  # nothing answers
        pub.add_line(b"a")
        pub.add_line(b"b")
        pub.close(timeout=0)
    log = spool_path(settings, run) / LOG
    log.write_bytes(log.read_bytes() + b'{"run":"test/torn","seq":"2","ts":"1","ki')  # killed mid-append
    with Publisher(settings, run) as pub:
        assert pub.next_seq == 2 and pub.pending == 2
        assert pub.add_line(b"c") == 2
        pub.add_eof(0)
    assert [e.get("line") for e in entries(settings, run)] == [b"a", b"b", b"c", None]


# --- the tap's fast paths against their references (issue 13 part 3) ------------------------------
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_LINE = st.one_of(st.binary(max_size=60), _TEXT.map(lambda t: t.encode()),
                  st.lists(st.sampled_from([b"a", b"\r", b"\xff", b"\xc3\xa9", b'"', b"\\", b"\x00", b" "]),
                           max_size=20).map(b"".join))
_LABELS = st.fixed_dictionaries({}, optional={"host": _TEXT, "agent": _TEXT, "format": _TEXT, "parent": _TEXT,
                                              "continues": _TEXT, "team": _TEXT, "zone": _TEXT})


def _reference_readline(data: bytes) -> list[bytes]:
    """What the tap published before: readline() then strip one \\n and one \\r."""
    return [strip_newline(raw) for raw in iter(io.BytesIO(data).readline, b"")]


@settings_h(max_examples=400, deadline=None)
@given(data=st.lists(st.sampled_from([b"x", b"\n", b"\r", b"\r\n", b"\xff", b"yz"]), max_size=40).map(b"".join),
       cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8))
def test_line_splitter_gives_the_lines_readline_gave(data, cuts):
    splitter = LineSplitter()
    got: list[bytes] = []
    bounds = sorted({c for c in cuts if c <= len(data)} | {0, len(data)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        got += splitter.feed(data[a:b])
    got += splitter.feed(b"")  # an empty read adds nothing
    tail = splitter.rest()
    if tail is not None:
        got.append(tail)
    assert got == _reference_readline(data)
    assert splitter.rest() is None


@settings_h(max_examples=300, deadline=None)
@given(lines=st.lists(_LINE, min_size=1, max_size=5), labels=_LABELS, stream=st.sampled_from(["stdout", "stderr"]),
       first=st.integers(min_value=0, max_value=2**53), ts=st.integers(min_value=0, max_value=2**47))
def test_line_encoder_equals_the_reference_encoders(lines, labels, stream, first, ts):
    """Fast records == encode_record(Publisher._fields(Entry)) and fast XADDs == the spool-record path,
    which is itself checked against redis-py below."""
    run, key = "host/run-1", b"ns:goose.raw.1"
    pub = Publisher.__new__(Publisher)  # only the label state _entry/_fields use: no spool, no thread
    pub.run = run
    pub._entry_labels = {k: labels[k] for k in ENTRY_LABELS if k in labels}
    pub._other_labels = {k: v for k, v in labels.items() if k not in ENTRY_LABELS}
    enc = LineEncoder(run, key, {**pub._entry_labels, **pub._other_labels})
    want = [encode_record(pub._fields(pub._entry(first + i, ts, "line", stream), line=line))
            for i, line in enumerate(lines)]
    assert enc.records(first, ts, lines, stream) == want
    assert [enc.record(first + i, ts, line, stream) for i, line in enumerate(lines)] == want
    assert enc.commands(first, ts, lines, stream) == [xadd_records(key, [r]) for r in want]
    for rec, line in zip(want, lines, strict=True):
        assert decode_record(rec)["line"] == line  # the exact bytes survive the spool


@settings_h(max_examples=300, deadline=None)
@given(labels=_LABELS, seq=st.integers(min_value=0, max_value=2**53), ts=st.integers(min_value=0, max_value=2**47),
       exit_code=st.one_of(st.none(), st.integers(min_value=-(2**31), max_value=2**31 - 1)),
       extra=st.dictionaries(_TEXT.filter(lambda k: k not in RESERVED_FIELDS), _TEXT, max_size=3))
def test_eof_record_equals_the_reference_encoder(labels, seq, ts, exit_code, extra):
    """The eof record the publisher spools (no sequencer import) == encode_record of Entry.to_fields
    (what add_eof spooled before), extra fields last."""
    run = "host/run-1"
    pub = Publisher.__new__(Publisher)
    pub.run = run
    pub._entry_labels = {k: labels[k] for k in ENTRY_LABELS if k in labels}
    pub._other_labels = {k: v for k, v in labels.items() if k not in ENTRY_LABELS}
    enc = LineEncoder(run, b"unused", {**pub._entry_labels, **pub._other_labels})
    fields = pub._fields(pub._entry(seq, ts, "eof", "stdout", exit_code))
    fields.update(extra)
    assert enc.eof_record(seq, ts, exit_code, extra or None) == encode_record(fields)


def _redis_py_xadd_bytes(stream: str, fields: dict) -> bytes:
    pipe = redis.Redis().pipeline(transaction=False)  # never connects: only builds the command
    pipe.xadd(stream, fields)
    args = pipe.command_stack[0][0]
    conn = redis.connection.Connection()  # hiredis' packer when hiredis is installed
    packed = b"".join(conn.pack_command(*args))
    pure = redis.connection.PythonRespSerializer(conn._buffer_cutoff, conn.encoder.encode)
    assert b"".join(pure.pack(*args)) == packed  # both of redis-py's packers agree
    return packed


# `line_b64` and the `_src` tag are the spool record's own encoding (services/tap/spool.py), never a
# field a record carries: a label of either name is refused (RESERVED_FIELDS)
_RECORD_KEYS = frozenset({"line_b64", "_src"})


@settings_h(max_examples=300, deadline=None)
@given(line=_LINE, labels=_LABELS, extra=st.dictionaries(_TEXT.filter(lambda k: k not in _RECORD_KEYS), _TEXT, max_size=3),
       seq=st.integers(min_value=0, max_value=2**53))
def test_hand_built_xadd_is_byte_equal_to_redis_py(line, labels, extra, seq):
    fields = {"run": "h/r", "seq": str(seq), "ts": "1700000000000", "kind": "line", "stream": "stdout",
              "line": line, **labels, **extra}
    raw = encode_record(fields)
    assert xadd_records(b"s:1", [raw]) == _redis_py_xadd_bytes("s:1", decode_record(raw))


def test_hand_built_wait_is_byte_equal_to_redis_py():
    assert resp.command(b"WAIT", b"1", b"1000") == b"".join(redis.connection.Connection().pack_command("WAIT", 1, 1000))


def test_hand_built_pipeline_stores_what_redis_py_stores(settings):
    """One real Redis: the same spool records as one hand-built pipeline on a socket and through redis-py's
    xadd give identical entries, in order (non-UTF-8 bytes, CR, empty and 70 kB lines, labels)."""
    lines = [b"plain", b"", b"caf\xc3\xa9", b"\xff\xfe binary", b"cr\r", b'{"json": "\\u0000"}', b"x" * 70_000]
    enc = LineEncoder("test/packed", b"unused", {"host": "h", "agent": "a", "format": "goose", "team": "t"})
    raws = enc.records(5, 1234, lines, "stderr")
    ns = settings.namespace
    packed, ref = f"{ns}:packed", f"{ns}:ref"
    client = redis.Redis.from_url(settings.redis_url)
    try:
        conn = client.connection_pool.get_connection()
        conn.send_packed_command([xadd_records(packed.encode(), raws)])
        ids = [conn.read_response() for _ in raws]
        client.connection_pool.release(conn)
        assert len(ids) == len(lines)
        for raw in raws:
            client.xadd(ref, decode_record(raw))
        got = [f for _, f in client.xrange(packed)]
        want = [f for _, f in client.xrange(ref)]
    finally:
        client.delete(packed, ref)
        client.close()
    assert got == want
    assert [list(f.items()) for f in got] == [list(f.items()) for f in want]  # same field order too
    assert [f[b"line"] for f in got] == lines


def test_publisher_packed_path_delivers_exact_entries(settings):
    lines = [b"plain", b"", b"caf\xc3\xa9", b"\xff\xfe binary", b"cr\r", b"x" * 70_000]
    run = "test/packed-publisher"
    with Publisher(settings, run, {"host": "h", "agent": "a", "team": "t"}, format="goose") as pub:
        assert pub._packed
        assert pub.add_lines(lines, "stderr", ts_ms=1234) == 0
        assert pub.add_lines([], "stderr") == len(lines)
        pub.add_line(b"extra", extra={"source": "x"})
        pub.add_eof(7)
    got = entries(settings, run)
    assert [int(e["seq"]) for e in got] == list(range(len(lines) + 2))
    assert [e["line"] for e in got[:len(lines)]] == lines
    assert got[0] == {"run": run.encode(), "seq": b"0", "ts": b"1234", "kind": b"line", "stream": b"stderr",
                      "line": b"plain", "host": b"h", "agent": b"a", "format": b"goose", "team": b"t"}
    assert got[len(lines)]["source"] == b"x" and got[-1]["kind"] == b"eof" and got[-1]["exit"] == b"7"


def test_publisher_sends_from_the_spool_when_its_memory_is_full(settings, private_redis):
    """Broker down with DEFAULT settings: more than MEM_CAP_BYTES of entries pile up, the in-memory
    commands are dropped and the sender continues from the spool file; once the broker is back every
    entry arrives exactly once and in order, and later entries (memory again) follow without a gap."""
    s = on(settings, private_redis)
    run = "test/mem-overflow"
    line = b"y" * 500
    n = MEM_CAP_BYTES // len(line) + 2000
    private_redis.stop()
    pub = Publisher(s, run, {"host": "h"})
    try:
        for first in range(0, n, 1000):
            pub.add_lines([line + b"%d" % i for i in range(first, min(n, first + 1000))])
        assert not pub._mem_on and pub.pending == n  # the overflow switched to the spool
        private_redis.start()
        assert pub.flush(timeout=60)
        pub.add_lines([b"after-1", b"after-2"])
        assert pub._mem_on  # caught up: new entries are kept in memory again
        pub.add_eof(0)
    finally:
        assert pub.close(timeout=60)
    got = entries(s, run)
    assert [int(e["seq"]) for e in got] == list(range(n + 3))
    assert [e["line"] for e in got[:n]] == [line + b"%d" % i for i in range(n)]
    assert [e["line"] for e in got[n:n + 2]] == [b"after-1", b"after-2"]


def test_idle_publisher_sends_at_once_and_a_busy_one_paces(settings):
    """No batching timer for a lone line: with a one-hour pacing interval the first line still goes out
    at once (the sender was idle); the next one waits for the interval, or for flush()."""
    run = "test/pacing"
    with Publisher(settings, run, {"host": "h"}, min_interval_s=3600) as pub:
        pub.add_line(b"first")
        wait_for(lambda: len(entries(settings, run)) == 1, 30, "the first line delivered without waiting")
        pub.add_line(b"second")
        time.sleep(0.5)
        assert len(entries(settings, run)) == 1  # paced: the sender sent a batch less than an hour ago
        assert pub.flush(timeout=30)  # a flush does not wait for the pacing
        assert [e["line"] for e in entries(settings, run)] == [b"first", b"second"]
        pub.add_eof(0)


@pytest.mark.e2e
def test_tap_publishes_chunked_output_exactly(settings):
    """The tap reads its command's pipes in large chunks: lines split across reads, CRLF, non-UTF-8
    bytes, a 300 kB line, bursts and a last line without a newline all arrive exactly, in order."""
    child = textwrap.dedent("""
        import os, sys, time
        out = sys.stdout.buffer
        out.write(b"a\\r\\nb\\xff\\n"); out.flush()
        for i in range(2000):
            out.write(b"burst %d\\n" % i)
        out.write(b"part-"); out.flush(); time.sleep(0.05); out.write(b"two\\n")
        out.write(b"L" * 300_000 + b"\\n")
        os.write(2, b"err 1\\r\\nerr 2")
        out.write(b"no newline"); out.flush()
    """)
    res = run_cli(settings, "tap", "--run", "test/chunked", "--", sys.executable, "-c", child)
    assert res.returncode == 0, res.stderr.decode()
    want_out = [b"a", b"b\xff"] + [b"burst %d" % i for i in range(2000)] + [b"part-two", b"L" * 300_000,
                                                                            b"no newline"]
    assert res.stdout == b"a\r\nb\xff\n" + b"".join(b"burst %d\n" % i for i in range(2000)) + \
        b"part-two\n" + b"L" * 300_000 + b"\nno newline"  # echoed byte for byte
    got = entries(settings, "test/chunked")
    assert [int(e["seq"]) for e in got] == list(range(len(got)))
    assert [e["line"] for e in got if e.get("stream") == b"stdout"] == want_out
    assert [e["line"] for e in got if e.get("stream") == b"stderr"] == [b"err 1", b"err 2"]
    assert got[-1]["kind"] == b"eof" and got[-1]["exit"] == b"0"


def test_drain_gives_up_when_the_sender_died(settings, caplog):
    """A sender thread that fails (here: an injected bug) must not leave `tap` waiting forever with
    the default unlimited drain: drain reports the undelivered entries and returns False."""
    from services.tap.delivery import drain

    run = "test/sender-died"
    pub = Publisher(settings, run, {"host": "h"})

    def broken(batch):
        raise ValueError("injected")

    pub._transport.send = broken
    pub.add_line(b"x")
    wait_for(lambda: not pub.sender_alive, 30, "the sender to stop")
    assert drain(pub, None, threading.Event()) is False
    assert "publisher for run test/sender-died stopped" in caplog.text
    assert spool_path(settings, run).exists()  # the entry is kept for a later `publish --drain`


def test_packed_pipeline_waits_for_replicas(settings, private_redis, tmp_path):
    """REDIS_WAIT_REPLICAS on a single node: the hand-built pipeline ends with WAIT. With one replica a
    batch counts as sent; asking for two, WAIT falls short, the batch is not confirmed (and retried),
    and nothing is lost once the requirement is met."""
    from services.broker.embedded import start_redis

    primary_port = int(private_redis.url.rsplit(":", 1)[1].split("/")[0])
    replica = start_redis(dir=str(tmp_path / "replica"), extra_args=["--replicaof", "127.0.0.1", str(primary_port)])
    try:
        client = redis.Redis.from_url(private_redis.url)
        wait_for(lambda: client.info("replication").get("connected_slaves") == 1, 30, "the replica to attach")
        client.close()
        s = on(settings, private_redis).model_copy(update={"redis_wait_replicas": 1})  # default WAIT timeout
        with Publisher(s, "test/wait-1", {"host": "h"}) as pub:
            assert pub._packed
            pub.add_lines([b"a", b"b"])
            assert pub.flush(timeout=30)
            pub.add_eof(0)
        by_seq = {int(e["seq"]): e.get("line") for e in entries(s, "test/wait-1")}  # a slow ack re-sends
        assert by_seq == {0: b"a", 1: b"b", 2: None}

        s2 = s.model_copy(update={"redis_wait_replicas": 2})
        pub = Publisher(s2, "test/wait-2", {"host": "h"})
        pub.add_line(b"c")
        assert not pub.flush(timeout=3)  # WAIT 2 answers at most 1 after its 1 s: never confirmed
        assert pub.pending == 1 and pub.broker_up is False
        assert not pub.close(timeout=0)
        assert spool_path(s2, "test/wait-2").exists()  # kept for a later delivery
    finally:
        replica.close()
