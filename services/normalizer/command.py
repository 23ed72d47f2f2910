"""`goose-ingest normalize`: raw goose stream-json lines in, harness events (JSON lines) out."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import BinaryIO, Iterator

import orjson

from contracts.raw import RUN_KEY_PATTERN
from services.normalizer.machine import Limits, RunNormalizer
from services.normalizer.timefmt import parse_ts

_RUN_RE = re.compile(RUN_KEY_PATTERN)
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/@-]")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "normalize",
        help="normalize goose stream-json lines from a file or stdin into harness events",
        description="Reads lines as `goose run --output-format stream-json` prints them and writes one "
        "harness event per line as compact JSON. End of input is the run's eof.",
    )
    p.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("--run", help="run key (default: the file name without extension, or 'stdin')")
    p.add_argument("--stderr", metavar="FILE", help="goose's stderr lines; they are taken before stdout's")
    p.add_argument("--epoch", help="give line n the time EPOCH + n ms (Unix ms or RFC 3339) for reproducible output")
    p.add_argument("--max-span-chars", type=int, default=Limits().max_span_chars)
    p.add_argument("--max-pending-tools", type=int, default=Limits().max_pending_tools)
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"goose-ingest normalize: {message}", file=sys.stderr)
    return 2


def _open(name: str) -> BinaryIO:
    return sys.stdin.buffer if name == "-" else open(name, "rb")


def _lines(stream: BinaryIO) -> Iterator[str]:
    for raw in stream:
        yield raw.rstrip(b"\r\n").decode("utf-8", "replace")


def default_run_key(name: str) -> str:
    if name == "-":
        return "stdin"
    stem = _UNSAFE.sub("_", Path(name).name.split(".")[0])[:200]
    return stem or "run"


def run(args: argparse.Namespace) -> int:
    run_key = args.run or default_run_key(args.file)
    if not _RUN_RE.match(run_key):
        return _fail(f"--run {run_key!r} is not a run key (1-200 chars of [A-Za-z0-9._:/@-])")
    epoch = None
    if args.epoch is not None:
        epoch = parse_ts(args.epoch)
        if epoch is None:
            return _fail(f"--epoch {args.epoch!r} is neither Unix milliseconds nor an RFC 3339 time")
    if args.max_span_chars < 16 or args.max_pending_tools < 1:
        return _fail("--max-span-chars must be >= 16 and --max-pending-tools >= 1")
    sources: list[tuple[str, str]] = []
    if args.stderr:
        sources.append((args.stderr, "stderr"))
    sources.append((args.file, "stdout"))
    handles = []
    try:
        for name, stream_name in sources:
            handles.append((_open(name), stream_name))
    except OSError as exc:
        return _fail(f"cannot read {exc.filename}: {exc.strerror}")

    norm = RunNormalizer(run_key, Limits(args.max_span_chars, args.max_pending_tools))
    out = sys.stdout.buffer
    dumps = orjson.dumps
    seq = 0

    def now(n: int) -> int:
        return epoch + n if epoch is not None else time.time_ns() // 1_000_000

    try:
        for handle, stream_name in handles:
            for text in _lines(handle):
                for event in norm.line(seq, now(seq), text, stream_name):
                    out.write(dumps(event) + b"\n")
                seq += 1
        for event in norm.end(seq, now(seq)):
            out.write(dumps(event) + b"\n")
        out.flush()
    except BrokenPipeError:
        return 0
    finally:
        for handle, _ in handles:
            if handle is not sys.stdin.buffer:
                handle.close()
    return 0
