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

    python bench/redaction_instructions.py [--lines 3000] [--passes 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=3000, help="lines per pass (about)")
    parser.add_argument("--passes", type=int, default=2, help="passes measured on top of the first")
    parser.add_argument("--out-dir", default="/tmp", help="where callgrind writes its profiles")
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.passes, args.lines)
        return
    if shutil.which("valgrind") is None:
        sys.exit("redaction_instructions: valgrind is not on the PATH (apt-get install -y valgrind)")
    out_dir = Path(args.out_dir)
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
