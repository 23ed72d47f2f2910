"""Redaction's share of the worker's per-line path, in instructions (valgrind's callgrind), not seconds.

Wall-clock benches scatter on a shared machine (bench/redaction.py and bench/pipeline.py gave
-9..49 % for the same code under load); an instruction count does not depend on what else runs.
This counts the instructions of the worker's pure per-line path -- ``feed`` (services/sequencer/
feed.py) into a ``RunSequencer``, which runs the normalizer and, when it has a redactor, redaction
of every event and envelope string -- once with the default redactor (``Settings().redactor()``,
prefilter on) and once without one, and prints the ratio.

Corpus: every ``*.jsonl`` transcript of the shared fixtures (goose, Claude Code, Codex), each as its
own run ending in an eof, repeated to about ``--lines`` lines.

Each variant runs in its own process under ``valgrind --tool=callgrind`` twice: with 1 pass over
the corpus and with ``1 + --passes`` passes (fresh runs each pass). The difference, divided by
``--passes``, is the cost of a pass alone: interpreter start, imports, building the redactor (its
regexes) and the first pass's warm-up cancel out. ``PYTHONHASHSEED=0`` makes the counts repeat.

Which core runs is whatever this interpreter imports (``goose-ingest --version`` says; the
compiled one only where it was built, ``GOOSE_INGEST_PURE_PYTHON=1`` forces the Python one); the
report names it. The worker also spends instructions this path does not count (Redis round trips,
encoding events, the commit script), so the share here is an upper bound of redaction's share of
the worker's throughput (target: < 25 %).

``--worker`` counts a whole worker process instead (``goose-ingest worker`` under callgrind, against
a private redis-server; bench/pipeline.py's interleaved corpus of the goose transcripts, published
before the worker starts): once with ``--lines`` lines and once with twice as many, per variant;
the difference over the extra lines is the worker's instructions per line with everything it does
per line (reads, decoding, the sequencer, encoding, the commit), and the on/off ratio is
redaction's share of the worker's CPU. Not counted: redis-server (another process), and the
worker's timers tick with wall time, which callgrind stretches (a small, unequal remainder).

    python bench/redaction_instructions.py [--lines 3000] [--passes 2]
    python bench/redaction_instructions.py --worker --lines 5000   (fewer lines: the timers' share shows)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T0 = 1_790_000_000_000
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _corpus(lines_wanted: int) -> list[list[str]]:
    from tests.support.fixtures import SHARED, transcript_lines

    transcripts = [transcript_lines(p) for p in sorted((SHARED / "fixtures").glob("*/*.jsonl"))]
    runs: list[list[str]] = []
    n = 0
    while n < lines_wanted:
        for lines in transcripts:
            runs.append(lines)
            n += len(lines)
    return runs


def child(variant: str, passes: int, lines_wanted: int) -> None:
    """Setup, then `passes` passes of the per-line path; the parent reads callgrind's total."""
    from services.sequencer.entries import Entry
    from services.sequencer.feed import feed
    from services.sequencer.run import RunSequencer
    from services.settings import Settings

    runs = _corpus(lines_wanted)
    redactor = Settings().redactor() if variant == "on" else None
    for p in range(passes):
        for i, lines in enumerate(runs):
            run = f"bench/{p}/{i}"
            items = [Entry.of_line(run, seq, T0 + seq, line, host="bench-host", agent="goose")
                     for seq, line in enumerate(lines)]
            items.append(Entry.of_eof(run, len(lines), T0 + len(lines), 0, host="bench-host", agent="goose"))
            feed(RunSequencer(run, redactor=redactor), items)


def _count(variant: str, passes: int, lines_wanted: int, out_dir: Path) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir / f'callgrind.{variant}.{passes}'}",
           sys.executable, __file__, "--child", variant, "--passes", str(passes), "--lines", str(lines_wanted)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        sys.exit(f"redaction_instructions: {variant} x{passes} failed (exit {done.returncode}): "
                 f"{done.stderr.strip().splitlines()[-1:]}")
    return int(found[-1])


def _core() -> str:
    from services.native import PURE_ENV, core_kind

    kind = {"compiled": "compiled (mypyc)", "pure": "Python"}.get(core_kind(), core_kind())
    return kind + (f" ({PURE_ENV}=1)" if os.environ.get(PURE_ENV) else "")


def _worker_count(variant: str, nlines: int, url: str, out_dir: Path) -> int:
    """Instructions of one `goose-ingest worker` that processes a backlog of about `nlines` lines."""
    import time
    import uuid

    import redis

    from bench.pipeline import BATCH, SHARDS, delete_namespace, publish_backlog, schedule
    from services.native import PURE_ENV
    from services.settings import Settings
    from tests.support.fixtures import TRANSCRIPTS, transcript_lines

    transcripts = [[ln.encode("utf-8") for ln in transcript_lines(p)] for p in TRANSCRIPTS]
    ns = f"bench-cg-{uuid.uuid4().hex[:8]}"
    settings = Settings(namespace=ns, shards=SHARDS, batch_size=BATCH, redis_url=url)
    items, runs = schedule(transcripts, nlines, 50, ns)
    client = redis.Redis.from_url(url, socket_timeout=None)
    publish_backlog(client, settings, items)
    # The gate (as bench/pipeline.py): the group starts at `$`, so the worker starts with nothing to
    # read, and moves to 0 once it is ready. A backlog read during start-up made a batch that held
    # the event loop (callgrind runs it ~50x slower) past FastStream's 3 s subscriber start timeout.
    for stream in settings.layout.raw_streams():
        client.xgroup_create(stream, settings.group, id="$", mkstream=True)
    port_file = out_dir / f"worker.{variant}.{nlines}.port"
    port_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GOOSE_INGEST_") or k in ("GOOSE_INGEST_SHARED", "GOOSE_INGEST_REDIS_SERVER", PURE_ENV)}
    env.update({"GOOSE_INGEST_REDIS_URL": url, "GOOSE_INGEST_NAMESPACE": ns, "GOOSE_INGEST_SHARDS": str(SHARDS),
                "GOOSE_INGEST_BATCH_SIZE": str(BATCH), "GOOSE_INGEST_METRICS_PORT": "0", "PYTHONHASHSEED": "0",
                "GOOSE_INGEST_REDACTION_ENABLED": "true" if variant == "on" else "false",
                "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file)})
    log = out_dir / f"worker.{variant}.{nlines}.log"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir / f'callgrind.worker.{variant}.{nlines}'}",
           sys.executable, "-m", "services.cli", "worker"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT)
    try:
        while not _ready(port_file):
            if proc.poll() is not None:
                sys.exit(f"redaction_instructions: the worker exited ({proc.returncode}); see {log}")
            time.sleep(0.5)
        for stream in settings.layout.raw_streams():
            client.xgroup_setid(stream, settings.group, id="0")
        while True:
            ended = sum(1 for stream in settings.layout.runs_partitions() for _, f in client.xrange(stream)
                        if f.get(b"state") == b"ended")
            if ended >= len(runs):
                break
            if proc.poll() is not None:
                sys.exit(f"redaction_instructions: the worker exited ({proc.returncode}); see {log}")
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        delete_namespace(client, ns)
        client.close()
    found = COLLECTED.findall(log.read_text(errors="replace"))
    if not found:
        sys.exit(f"redaction_instructions: no callgrind total in {log}")
    return int(found[-1])


def _ready(port_file: Path) -> bool:
    import urllib.error
    import urllib.request

    try:
        _host, port = port_file.read_text().split()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError, urllib.error.URLError):
        return False


def worker_main(lines: int, out_dir: Path) -> None:
    from services.broker.embedded import start_redis

    server = start_redis()
    try:
        per_line: dict[str, float] = {}
        for variant in ("off", "on"):
            one = _worker_count(variant, lines, server.url, out_dir)
            two = _worker_count(variant, 2 * lines, server.url, out_dir)
            per_line[variant] = (two - one) / lines
            print(f"worker, redaction {variant:>3}: {one:,} instructions ({lines:,} lines), {two:,} ({2 * lines:,} "
                  f"lines): {per_line[variant]:,.0f} per line", flush=True)
    finally:
        server.close()
    off, on = per_line["off"], per_line["on"]
    print(f"core: {_core()}; the worker process only (not redis-server)")
    print(f"redaction adds {(on - off) / off:.1%} to the worker's instructions per line; its share of the worker "
          f"with redaction on (the throughput it costs): {(on - off) / on:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=3000, help="lines per pass (about)")
    parser.add_argument("--passes", type=int, default=2, help="passes measured on top of the first")
    parser.add_argument("--out-dir", default="/tmp", help="where callgrind writes its profiles")
    parser.add_argument("--worker", action="store_true", help="count a whole worker process (see above)")
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.passes, args.lines)
        return
    if shutil.which("valgrind") is None:
        sys.exit("redaction_instructions: valgrind is not on the PATH (apt-get install -y valgrind)")
    out_dir = Path(args.out_dir)
    if args.worker:
        worker_main(args.lines, out_dir)
        return
    n_lines = sum(len(lines) + 1 for lines in _corpus(args.lines))  # + the eof of each run
    per_pass: dict[str, float] = {}
    for variant in ("off", "on"):
        one = _count(variant, 1, args.lines, out_dir)
        more = _count(variant, 1 + args.passes, args.lines, out_dir)
        per_pass[variant] = (more - one) / args.passes
        print(f"redaction {variant:>3}: {one:,} instructions (1 pass), {more:,} ({1 + args.passes} passes): "
              f"{per_pass[variant]:,.0f} per pass, {per_pass[variant] / n_lines:,.0f} per line", flush=True)
    off, on = per_pass["off"], per_pass["on"]
    print(f"core: {_core()}; corpus: {n_lines:,} entries per pass (shared fixtures: goose, claude-code, codex)")
    print(f"redaction adds {(on - off) / off:.1%} to the per-line path; its share of the path with redaction on "
          f"(the throughput it costs, at most): {(on - off) / on:.1%}")


if __name__ == "__main__":
    main()
