"""`goose-ingest publish`: the lines of a file or a pipe as one run's raw entries.

Restartable: the spool remembers how many lines of which input it took, so the same command after a
crash skips them (`--no-skip` does not). services/tap/command.py has checked the arguments and
opened the input; here its lines are read, spooled and delivered.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
import threading
from collections.abc import Iterator
from typing import BinaryIO

from services.settings import Settings
from services.tap.console import err, log
from services.tap.delivery import drain, open_publisher, run_labels
from services.tap.sniff import HEAD_BYTES, binary_kind, document_kind


class _Stop(Exception):
    pass


def strip_newline(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


def input_lines(fh: BinaryIO, args: argparse.Namespace) -> Iterator[bytes] | str:
    """The input's lines, or the sentence saying what it is when it is no line stream (services/tap/sniff.py)."""
    label = "standard input" if args.file == "-" else args.file
    shown = "FILE" if args.file == "-" else args.file
    peek = getattr(fh, "peek", None)
    why = binary_kind(peek(HEAD_BYTES)[:HEAD_BYTES] if peek else b"", label, shown,
                      f"goose-ingest publish --run {args.run} -")
    if why:
        return why
    first: list[bytes] = []  # read up to the first non-blank line, then given back in front of the rest
    for raw in iter(fh.readline, b""):
        first.append(raw)
        if raw.strip():
            why = document_kind(raw.decode("utf-8", "replace"), label)
            if why:
                return why
            break
    return itertools.chain(first, iter(fh.readline, b""))


def publish(args: argparse.Namespace, settings: Settings, fh: BinaryIO | None, source: str | None,
            lines: Iterator[bytes]) -> int:
    """Spool and deliver `lines` (none with --drain: `fh` is None), closing `fh` unless it is stdin."""
    pub = open_publisher(settings, args.run, run_labels(settings, args.agent), args.format)
    if isinstance(pub, int):
        return pub
    abort = threading.Event()

    def on_term(signum, _frame):
        raise _Stop(signum)

    previous = {s: signal.signal(s, on_term) for s in (signal.SIGTERM, signal.SIGHUP)}
    added = skip = 0
    summary = fh is not None and not pub.finished  # an ended run only delivers what was spooled
    try:
        if fh is not None and pub.finished:
            err(f"run {args.run} already ended (its eof is in the spool {pub.spool_dir}); delivering what is spooled")
        elif fh is not None:
            skip = 0 if args.no_skip or source is None else pub.lines_from(source)
            if skip:
                log.info("skipping the first %d lines of %s: already spooled for run %s", skip, args.file, args.run)
            for i, raw in enumerate(lines):
                if i < skip:
                    continue
                pub.add_line(strip_newline(raw), "stdout", source=source)
                added += 1
            if not args.no_eof:
                pub.add_eof(None)
    except (KeyboardInterrupt, _Stop) as exc:
        signum = exc.args[0] if isinstance(exc, _Stop) else signal.SIGINT
        abort.set()
        pub.close(timeout=2.0)
        err(f"interrupted: {pub.next_seq} entries of run {args.run} assigned; undelivered ones and the resume "
            f"point are kept in {pub.spool_dir}")
        return 128 + int(signum)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if fh is not None and fh is not sys.stdin.buffer:
            fh.close()
    try:
        if not drain(pub, args.drain_timeout, abort):
            return 1
    except KeyboardInterrupt:
        pub.close(timeout=0)
        return 130
    if summary:  # the command's result, on stdout
        print(f"published {added} {'line' if added == 1 else 'lines'} to run {args.run}"
              + (f" ({skip} already spooled were skipped)" if skip else "")
              + (" (left open: --no-eof)" if args.no_eof else ""), flush=True)
    return 0
