"""The command's stdout and stderr, echoed and published: one reader thread per pipe.

Reads carry as many lines as have collected (the cost of a tap is per read and per spool write, not
per line), and a line that arrives after the run ended is counted, not lost silently.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import IO, BinaryIO

from services.tap.console import err, log
from services.tap.lines import LineSplitter
from services.tap.publisher import Publisher, RunFinished, now_ms
from services.tap.sniff import LiveSniffer

PIPE_READ_BYTES = 1 << 16  # per read; below malloc's mmap threshold (a larger buffer measured no better)
# While the publisher is busy (a batch in flight or paced), the readers let output collect in the pipe
# this long before the next read: one read and one spool write then carry dozens of lines instead of
# one each. An idle publisher means no wait (a lone line is read and sent at once). The pipes are grown
# to PIPE_BUFFER_BYTES so a fast command does not block on a full pipe meanwhile.
PIPE_COALESCE_S = 0.005
PIPE_BUFFER_BYTES = 1 << 20


def grow_pipe(pipe: IO[bytes] | None) -> None:
    """Linux: raise the pipe's capacity to PIPE_BUFFER_BYTES (best effort: the default 64 KiB also works)."""
    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or setsz is None:
        return
    try:
        fcntl.fcntl(pipe.fileno(), setsz, PIPE_BUFFER_BYTES)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size for an unprivileged user


def pump(pipe: BinaryIO, stream: str, echo, pub: Publisher, sniff: LiveSniffer | None = None) -> None:
    """Echo and publish a pipe's output: one read of up to PIPE_READ_BYTES, one echo write and one
    spool write per chunk, however many lines it holds (reads return as soon as anything arrived)."""
    out = getattr(echo, "buffer", None) if echo is not None else None
    fd = pipe.fileno()  # read the fd directly: the BufferedReader's readline costs a call per line
    splitter = LineSplitter()
    late = 0
    while True:
        chunk = os.read(fd, PIPE_READ_BYTES)
        if not chunk:
            break
        ts = now_ms()
        if sniff is not None and not sniff.done:
            why = sniff.feed(chunk)
            if why:
                err(f"warning: {why}; its lines are published anyway, each one a warning event")
        if out is not None:
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None  # our own stdout/stderr went away: keep publishing
        lines = splitter.feed(chunk)
        if lines:
            late += _add_lines(pub, lines, stream, ts)
        if pub.sender_busy and len(chunk) < PIPE_READ_BYTES:  # a full read: more is waiting, read on
            time.sleep(PIPE_COALESCE_S)
    tail = splitter.rest()
    if tail is not None:
        late += _add_lines(pub, [tail], stream, now_ms())
    if late:
        log.warning("%d %s lines arrived after the run ended and were not published", late, stream)


def _add_lines(pub: Publisher, lines: list[bytes], stream: str, ts: int) -> int:
    """Publish lines; returns how many could not be (the run already ended)."""
    try:
        pub.add_lines(lines, stream, ts)
    except (RunFinished, RuntimeError):
        return len(lines)
    return 0
