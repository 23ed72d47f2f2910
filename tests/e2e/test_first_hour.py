"""A first hour without tracebacks (issue 8 part 6): each step as a new user takes it -- a subprocess,
its exit code, its stderr and its stdout."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from services.broker.embedded import free_port
from services.settings import Settings
from services.tap.publisher import Publisher
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.pipeline import ended_runs, start_worker, stop, wait_until
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

ANSI = re.compile(r"\x1b\[[0-9;]*m")
DATED_LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} ")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    env.update(extra)
    return env


def goose_ingest(*args: str, env: dict[str, str], timeout: float = 60, cwd: Path = REPO,
                 stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=cwd, env=env, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_exit_2(out: subprocess.CompletedProcess, *needles: str) -> str:
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert out.stdout == "", out.stdout[:500]
    return lines[0]


def _publish(settings, run: str, path: Path, exit_code: int = 0) -> None:
    with Publisher(settings, run, {"host": "first-hour"}) as pub:
        for line in path.read_bytes().splitlines():
            pub.add_line(line, "stdout")
        pub.add_eof(exit_code)


# --- configuration errors: one line naming the variable, exit 2, in every command ----------------------
BAD_SETTINGS = [
    ("GOOSE_INGEST_REDIS_URL", "redis://127.0.0.1:PORT/0", "'PORT'"),  # the README's own placeholder
    ("GOOSE_INGEST_REDIS_URL", "http://127.0.0.1:6379/0", "scheme"),
    ("GOOSE_INGEST_SHARDS", "0", "greater than or equal to 1"),
    ("GOOSE_INGEST_SHARDS", "abc", "valid integer"),
    ("GOOSE_INGEST_REDACTION_DISABLE", "jwt", "JSON list"),
    ("GOOSE_INGEST_REDACTION_DISABLE", '["no-such-rule"]', "no-such-rule"),
    ("GOOSE_INGEST_REDACTION_EXTRA_RULES", '{"mine": "("}', "mine"),
    ("GOOSE_INGEST_REDACTION_EXTRA_RULES", "password=.*", "JSON object"),
    ("GOOSE_INGEST_METRICS_PORT", "99999", "65535"),
    ("GOOSE_INGEST_REDIS_CLUSTER", "maybe", "boolean"),
]


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    transcript = str(TRANSCRIPTS[0])
    return {
        "worker": ["worker"],
        "up": ["up"],
        "demo": ["demo"],
        "tap": ["tap", "--run", "fh/tap", "--", sys.executable, "-c", "print(1)"],
        "publish": ["publish", "--run", "fh/publish", transcript],
        "tail": ["tail", "--no-follow"],
        "replay": ["replay"],
        "import-sessions": ["import-sessions", str(tmp_path / "sessions.db"), "--namespace", "fh"],
        "normalize": ["normalize", transcript],
        "acl": ["acl"],
    }


@pytest.mark.parametrize("variable,value,why", BAD_SETTINGS, ids=[f"{v}={x}" for v, x, _ in BAD_SETTINGS])
def test_every_bad_setting_is_one_line_naming_the_variable(variable, value, why, tmp_path):
    env = clean_env(GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"), **{variable: value})
    if variable != "GOOSE_INGEST_REDIS_URL":
        env["GOOSE_INGEST_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    line = assert_one_line_exit_2(goose_ingest("worker", env=env), variable, why)
    assert line.startswith("goose-ingest worker: ")


@pytest.mark.parametrize("command", ["worker", "up", "demo", "tap", "publish", "tail", "replay", "import-sessions",
                                     "normalize", "acl"])
def test_every_command_reports_a_bad_setting_in_one_line(command, tmp_path):
    args = _commands(tmp_path)[command]
    for variable, value, why in (("GOOSE_INGEST_REDIS_URL", "redis://127.0.0.1:PORT/0", "'PORT'"),
                                 ("GOOSE_INGEST_SHARDS", "abc", "valid integer"),
                                 ("GOOSE_INGEST_REDACTION_DISABLE", "jwt", "JSON list")):
        env = clean_env(GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"), **{variable: value})
        assert_one_line_exit_2(goose_ingest(*args, env=env), variable, why)
    assert not (tmp_path / "spool").exists()  # nothing was started or spooled


def test_a_bad_url_never_shows_its_password(tmp_path):
    env = clean_env(GOOSE_INGEST_REDIS_URL="redis://:hunter2@127.0.0.1:PORT/0")
    line = assert_one_line_exit_2(goose_ingest("tail", env=env), "GOOSE_INGEST_REDIS_URL")
    assert "hunter2" not in line


# --- a second worker on the same host ----------------------------------------------------------------
@pytest.fixture
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_a_second_worker_on_the_same_metrics_port_is_one_line(settings, taken_port):
    out = goose_ingest("worker", env=cli_env(settings, GOOSE_INGEST_METRICS_PORT=str(taken_port)))
    assert_one_line_exit_2(out, "GOOSE_INGEST_METRICS_PORT", str(taken_port), "already in use")


def test_up_with_its_metrics_port_taken_is_one_line_and_starts_no_server(taken_port):
    out = goose_ingest("up", env=clean_env(GOOSE_INGEST_METRICS_PORT=str(taken_port)), timeout=60)
    assert_one_line_exit_2(out, "GOOSE_INGEST_METRICS_PORT", "already in use")
    assert "embedded redis-server" not in out.stderr


def test_the_metrics_server_itself_refuses_a_taken_port_with_a_config_error(taken_port):
    """The race behind the early check: the port is taken between the check and the bind."""
    from services.metrics import Metrics
    from services.metrics.server import MetricsPortUnavailable, serve
    from services.settings import ConfigError

    with pytest.raises(MetricsPortUnavailable) as info:
        serve(Metrics(), "0.0.0.0", taken_port, lambda: True)
    assert isinstance(info.value, ConfigError) and "GOOSE_INGEST_METRICS_PORT" in str(info.value)


# --- tail ----------------------------------------------------------------------------------------------
@pytest.fixture
def processed_run(settings, tmp_path):
    worker = start_worker(settings, tmp_path / "w.log")
    try:
        _publish(settings, "fh/one", TRANSCRIPTS[1], exit_code=2)
        wait_until(lambda: "fh/one" in ended_runs(settings), timeout=60)
    finally:
        stop(worker)
    return "fh/one"


def test_tail_no_follow_prints_what_the_topics_hold(settings, processed_run):
    out = goose_ingest("tail", "--no-follow", env=cli_env(settings))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(f"{processed_run}#0 " in line for line in lines)
    assert any("RUN ENDED exit=2" in line for line in lines)


def test_tail_from_start_interleaves_records_and_events_in_commit_order(settings, processed_run):
    out = goose_ingest("tail", "--from-start", "--no-follow", "--run", processed_run, env=cli_env(settings))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines and all(DATED_LINE.match(line) for line in lines), lines[:3]
    kinds = ["RUN " + line.split(" RUN ")[1].split()[0] if " RUN " in line else "event" for line in lines]
    assert kinds[0] == "RUN STARTED", lines[:3]
    assert kinds[-1] == "RUN ENDED", lines[-3:]
    # the events between are in raw-seq order, and `completed` comes after the events of its seq
    seqs = [int(m.group(1)) for line in lines if (m := re.search(rf"{re.escape(processed_run)}#(\d+) ", line))]
    assert seqs == sorted(seqs) and len(seqs) > 5
    assert kinds.index("RUN COMPLETED") > kinds.index("event")
    # the exit error of the eof comes before the ENDED record it caused
    assert "goose exited with code 2" in lines[-2]


def test_tail_follows_what_is_published_after_it_started(settings, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "tail", "--run", "fh/later"], cwd=REPO,
                            env=cli_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = start_worker(settings, tmp_path / "w.log")
    try:
        time.sleep(1.5)  # tail is reading (it resolved "now" to ids before the run existed)
        _publish(settings, "fh/later", TRANSCRIPTS[0])
        wait_until(lambda: "fh/later" in ended_runs(settings), timeout=60)
        time.sleep(1.5)  # one more read of tail's
    finally:
        stop(worker)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr[-2000:]
    lines = stdout.splitlines()
    assert lines and "RUN STARTED" in lines[0] and "RUN ENDED" in lines[-1], lines


# --- demo and up: results on stdout, logs on stderr, no colour ----------------------------------------
def test_demo_prints_only_results_on_stdout_and_no_colour(tmp_path):
    out = goose_ingest("demo", env=clean_env(GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool")), timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not ANSI.search(out.stdout) and not ANSI.search(out.stderr)
    assert "callback for Task" not in out.stdout and " INFO " not in out.stdout
    lines = [line for line in out.stdout.splitlines() if line]
    summary = lines.pop()
    assert summary.startswith("goose-ingest demo: ") and "runs normalized by a live worker" in summary
    assert all(DATED_LINE.match(line) for line in lines), [line for line in lines if not DATED_LINE.match(line)][:3]
    # each run is printed in commit order: its STARTED record first
    blocks = [b.splitlines() for b in out.stdout.strip().split("\n\n") if "RUN " in b]
    assert blocks and all("RUN STARTED" in block[0] for block in blocks)


def test_up_prints_nothing_on_stdout_and_logs_without_colour(tmp_path):
    env = clean_env(GOOSE_INGEST_METRICS_PORT="0", GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"))
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            match = re.search(r"export GOOSE_INGEST_REDIS_URL=(\S+)", proc.stderr.readline())
            url = match.group(1) if match else None
        assert url
        settings = Settings(redis_url=url, spool_dir=str(tmp_path / "spool2"))
        _publish(settings, "fh/up", TRANSCRIPTS[0])
        wait_until(lambda: "fh/up" in ended_runs(settings), timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert stdout == ""
    assert not ANSI.search(stderr) and "Traceback" not in stderr


# --- the rest of the first hour ------------------------------------------------------------------------
def test_demo_of_a_missing_file_is_one_line(tmp_path):
    out = goose_ingest("demo", str(tmp_path / "missing.jsonl"), env=clean_env())
    assert_one_line_exit_2(out, "missing.jsonl", "no such")


@pytest.mark.parametrize("command", ["worker", "replay", "tail", "up", "demo"])
def test_every_command_has_a_description_in_help(command):
    from services.cli import SUBCOMMAND, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == SUBCOMMAND)
    description = sub.choices[command].description
    assert description and len(description) > 40
    out = goose_ingest(command, "--help", env=clean_env())
    assert out.returncode == 0 and " ".join(description.split()[:4]) in " ".join(out.stdout.split())


def test_version():
    out = goose_ingest("--version", env=clean_env())
    from services.native import core_kind

    assert out.returncode == 0
    assert out.stdout.strip() == f"goose-ingest {metadata.version('goose-ingest')} (core: {core_kind()})"


def test_readme_and_backfill_doc_name_what_exists():
    readme = (REPO / "README.md").read_text()
    assert "contracts/asyncapi.json" in readme and "asyncapi.yaml" not in readme
    assert (REPO / "contracts" / "asyncapi.json").is_file()
    assert "redis://127.0.0.1:PORT/0" not in readme  # the placeholder a new user would paste
    backfill = (REPO / "docs" / "backfill.md").read_text()
    assert "to be wired" not in backfill and "parentRunId" in backfill
