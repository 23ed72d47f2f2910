"""The live path recognises what `normalize` refuses (issue 38 item 4): `publish` of a compressed file,
a sessions.db or one JSON document is one line and exit 2 (nothing published, no spool); a live `tap`
warns once on stderr and still publishes the lines; `publish` says what it published; `tail` says
that it waits. The detection is one module, services/tap/sniff.py, shared with `normalize`."""

from __future__ import annotations

import bz2
import gzip
import lzma
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from services.broker.connect import sync_client
from services.tap.sniff import LiveSniffer, binary_kind, document_kind
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.redis_server import cli_env

DOCUMENT = b'{\n  "messages": [\n    {"role": "user"}\n  ]\n}\n'


def _gi(settings, *args: str, stdin=subprocess.DEVNULL, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=cli_env(settings), stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)


def _raw_of(settings, run: str) -> int:
    client = sync_client(settings)
    return sum(1 for s in settings.layout.raw_streams() for _, f in client.xrange(s) if f.get(b"run") == run.encode())


def _sqlite(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("create table sessions (id text)")
    con.commit()
    con.close()
    return path


def _inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    data = TRANSCRIPTS[0].read_bytes()
    out = {}
    for kind, pack, suffix in (("gzip", gzip.compress, ".gz"), ("bzip2", bz2.compress, ".bz2"), ("xz", lzma.compress, ".xz")):
        path = tmp_path / f"run.jsonl{suffix}"
        path.write_bytes(pack(data))
        out[kind] = (path, f"{kind}-compressed")
    doc = tmp_path / "run.json"
    doc.write_bytes(b"\n" + DOCUMENT)  # a blank line first: the first non-blank line decides
    out["document"] = (doc, "one multi-line JSON document")
    out["sqlite"] = (_sqlite(tmp_path / "sessions.db"), "SQLite database")
    return out


# --- the detection itself -------------------------------------------------------------------------
def test_the_detection_names_each_kind_and_passes_a_line_stream():
    assert "gzip-compressed" in (binary_kind(gzip.compress(b"x"), "f", "f", "r") or "")
    assert binary_kind(b"BZh is a word", "f", "f", "r") is None  # BZh not followed by a block size digit
    assert binary_kind(b'{"type": "message"}', "f", "f", "r") is None
    assert document_kind("{", "f") and document_kind(" [ ", "f") and document_kind('{"a": 1}', "f") is None


def test_the_live_sniffer_waits_for_enough_bytes_then_answers_once():
    sniff = LiveSniffer("out", "FILE", "reader")
    assert sniff.feed(b"\n\n") is None and not sniff.done  # blank lines: no verdict yet
    assert "multi-line JSON document" in (sniff.feed(b"{\n") or "")
    assert sniff.done and sniff.feed(b"{\n") is None
    lines = LiveSniffer("out", "FILE", "reader")
    assert lines.feed(b'{"type": "message", "id": 1}\n') is None and lines.done
    packed = LiveSniffer("out", "FILE", "reader")
    blob = gzip.compress(b"x" * 100)
    assert packed.feed(blob[:1]) is None and "gzip" in (packed.feed(blob[1:]) or "")


# --- publish: refused, one line, nothing published ------------------------------------------------------
@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "document", "sqlite"])
def test_publish_of_what_is_not_a_line_stream_is_one_line_and_publishes_nothing(settings, tmp_path, kind):
    path, says = _inputs(tmp_path)[kind]
    run = f"sniff/{kind}"
    for args, stdin in (([str(path)], subprocess.DEVNULL), (["-"], path)):
        with open(stdin, "rb") if isinstance(stdin, Path) else open("/dev/null", "rb") as fh:
            out = _gi(settings, "publish", "--run", run, *args, stdin=fh)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr
        assert "Traceback" not in out.stderr and out.stdout == ""
    assert _raw_of(settings, run) == 0
    assert not any(Path(settings.spool_dir).rglob("*sniff*")), list(Path(settings.spool_dir).rglob("*"))


def test_publish_says_how_many_lines_it_published(settings, tmp_path):
    lines = len(TRANSCRIPTS[0].read_bytes().splitlines())
    out = _gi(settings, "publish", "--run", "sniff/good", str(TRANSCRIPTS[0]))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"published {lines} lines to run sniff/good\n"
    assert _raw_of(settings, "sniff/good") == lines + 1  # and the eof
    src = tmp_path / "one.jsonl"
    src.write_bytes(b'{"type": "message"}\n')
    with open(src, "rb") as fh:
        one = _gi(settings, "publish", "--run", "sniff/one", "--no-eof", "-", stdin=fh)
    assert one.returncode == 0 and one.stdout == "published 1 line to run sniff/one (left open: --no-eof)\n", one


# --- tap: a warning, the lines still published ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gzip", "document", "sqlite"])
def test_a_live_tap_warns_once_and_still_publishes_the_lines(settings, tmp_path, kind):
    path, says = _inputs(tmp_path)[kind]
    run = f"sniff/tap-{kind}"
    out = _gi(settings, "tap", "--quiet", "--run", run, "--", "cat", str(path))
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if says in line]
    assert len(warnings) == 1 and "published anyway" in warnings[0], out.stderr
    assert _raw_of(settings, run) > 1  # its lines and the eof


def test_a_tap_of_a_line_stream_says_nothing_of_the_kind(settings):
    out = _gi(settings, "tap", "--quiet", "--run", "sniff/tap-good", "--", "cat", str(TRANSCRIPTS[0]))
    assert out.returncode == 0 and "warning" not in out.stderr, out.stderr


# --- tail: says once that it waits ------------------------------------------------------------------------
def test_tail_says_once_on_stderr_that_it_is_waiting(settings):
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "tail"], cwd=REPO, env=cli_env(settings),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert "waiting for events" in first and "Ctrl-C" in first, first
    assert "waiting" not in err and out == "" and proc.returncode == 0, (out, err)
    done = _gi(settings, "tail", "--no-follow")
    assert done.returncode == 0 and "waiting" not in done.stderr, done.stderr
