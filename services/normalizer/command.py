"""`goose-ingest normalize`: an agent's raw stream lines in, harness events (JSON lines) out.

Exit codes: 0 events written (also when stdout is closed early); 2 a usage error, an unreadable
file, or input that is not a line stream at all (a SQLite database such as goose's sessions.db,
a compressed file, or one multi-line JSON document such as `goose run --output-format json` prints): one line on
stderr says what the input looks like and what to use instead, and nothing is written to stdout.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from contracts.raw import RUN_KEY_PATTERN
from services.normalizer import FORMATS, Limits, RunNormalizer
from services.normalizer.timefmt import parse_ts
from services.tap.sniff import HEAD_BYTES, binary_kind, document_kind

_RUN_RE = re.compile(RUN_KEY_PATTERN)
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/@-]")


class NotAStream(Exception):
    """The input is something else than one record per line; the message says what to use."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "normalize",
        help="normalize an agent's stream lines (goose, Claude Code, Codex, Gemini CLI or opencode) from a file or stdin "
        "into harness events",
        description="Reads lines as `goose run --output-format stream-json`, `claude -p --output-format stream-json "
        "--verbose`, `codex exec --json`, `gemini -p ... --output-format stream-json` or `opencode run --format json` "
        "print them and writes one harness event per line as compact JSON. "
        "End of input is the run's eof. Exit 2: usage error, unreadable input, or input that is not a line "
        "stream (a sessions.db, an --output-format json document); stderr says what to use instead.",
    )
    p.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("--run", help="run key (default: the file name without its last extension, or 'stdin')")
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="the input format (default: detected from the first JSON object, goose when unrecognised)",
    )
    p.add_argument("--stderr", metavar="FILE", help="the agent's stderr lines; they are taken before stdout's")
    p.add_argument("--epoch", help="give line n the time EPOCH + n ms (Unix ms or RFC 3339) for reproducible output")
    p.add_argument("--max-span-chars", type=int, default=Limits().max_span_chars)
    p.add_argument("--max-pending-tools", type=int, default=Limits().max_pending_tools)
    p.add_argument("--max-pending-tool-bytes", type=int, default=Limits().max_pending_tool_bytes,
                   help="cap on the bytes of unanswered tool calls; beyond it the oldest becomes `unknown`")
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"goose-ingest normalize: {message}", file=sys.stderr)
    return 2


def _open(name: str) -> BinaryIO:
    return sys.stdin.buffer if name == "-" else open(name, "rb")


def _label(name: str) -> str:
    return "standard input" if name == "-" else name


def _lines(stream: BinaryIO, name: str, check: bool) -> Iterator[str]:
    """Decoded lines without their newline; `check`: refuse input that is not a line stream."""
    if check:
        head = stream.peek(HEAD_BYTES) if hasattr(stream, "peek") else b""
        why = binary_kind(head, _label(name), name if name != "-" else "FILE", "goose-ingest normalize -")
        if why:
            raise NotAStream(why)
    looking = check
    for raw in stream:
        text = raw.rstrip(b"\r\n").decode("utf-8", "replace")
        if looking and text.strip():
            looking = False
            why = document_kind(text, _label(name))
            if why:
                raise NotAStream(why)
        yield text


def default_run_key(name: str) -> str:
    """The file name without its last extension (dots inside the name are kept)."""
    if name == "-":
        return "stdin"
    stem = _UNSAFE.sub("_", Path(name).stem)[:200]
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
    if args.max_span_chars < 16 or args.max_pending_tools < 1 or args.max_pending_tool_bytes < 1024:
        return _fail("--max-span-chars must be >= 16, --max-pending-tools >= 1 and --max-pending-tool-bytes >= 1024")
    sources: list[tuple[str, str]] = []
    if args.stderr:
        sources.append((args.stderr, "stderr"))
    sources.append((args.file, "stdout"))
    handles = []
    try:
        for name, stream_name in sources:
            handles.append((_open(name), name, stream_name))
    except OSError as exc:
        return _fail(f"cannot read {exc.filename}: {exc.strerror}")

    norm = RunNormalizer(run_key, Limits(args.max_span_chars, args.max_pending_tools, args.max_pending_tool_bytes),
                         args.format)
    # Events are held until the input proved to be a line stream, so a refused input prints nothing.
    held: list[bytes] | None = []
    out = sys.stdout.buffer
    dumps = orjson.dumps
    seq = 0

    def now(n: int) -> int:
        return epoch + n if epoch is not None else time.time_ns() // 1_000_000

    def write(events: list[dict[str, Any]]) -> None:
        for event in events:
            data = dumps(event) + b"\n"
            if held is None:
                out.write(data)
            else:
                held.append(data)

    try:
        for handle, name, stream_name in handles:
            check = stream_name == "stdout"
            for text in _lines(handle, name, check):
                write(norm.line(seq, now(seq), text, stream_name))
                seq += 1
                if held is not None and (check and text.strip()):
                    for data in held:
                        out.write(data)
                    held = None
        write(norm.end(seq, now(seq)))
        if held is not None:
            for data in held:
                out.write(data)
        out.flush()
    except NotAStream as exc:
        return _fail(str(exc))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            return 0
        return _fail(f"cannot read: {exc.strerror or exc}")
    finally:
        for handle, _, _ in handles:
            if handle is not sys.stdin.buffer:
                handle.close()
    return 0
