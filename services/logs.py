"""How every long-running command logs: one plain format on stderr, FastStream's loggers included,
nothing on stdout (the commands promise nothing there), and a repeated failure logged once a
minute with a count instead of once per read. Shared by the worker, the exporters, the archive
and `up`: one module, so no command imports another for it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_FASTSTREAM_LOGGERS = ("faststream", "faststream.access.redis")
# FastStream's Redis subscribers log this (ERROR, with the traceback) on every failed read, each
# subscriber every 5 s: hundreds of traceback lines a minute while the broker is down.
_FETCH_ERROR_LOGGER = "faststream.access.redis"
_FETCH_ERROR_MESSAGE = "Message fetch error"
FETCH_ERROR_REPEAT_S = 60.0  # the same failure is logged again at most this often, with a count


class _AtLeast(logging.Filter):
    """Passes records at or above a level (a handler's level alone would also gate DEBUG runs)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


class FetchErrorDigest(logging.Filter):
    """Turns FastStream's "Message fetch error" tracebacks into one line per change of the failure
    (its class and server text), and while it lasts one line per FETCH_ERROR_REPEAT_S with how many
    reads failed meanwhile. The traceback is shown only at DEBUG (`--log-level DEBUG`)."""

    def __init__(self, keep_traceback: bool = False, clock: Callable[[], float] | None = None) -> None:
        super().__init__()

        self.keep_traceback = keep_traceback
        self._clock = clock or time.monotonic
        self._state: str | None = None
        self._shown_at = 0.0
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != _FETCH_ERROR_MESSAGE:
            return True
        from services.broker.errors import describe

        exc = record.exc_info[1] if record.exc_info else None
        state = describe(exc) if exc is not None else "unknown error"
        now = self._clock()
        if state == self._state and now - self._shown_at < FETCH_ERROR_REPEAT_S:
            self._suppressed += 1
            return False
        if state == self._state:
            record.msg = (f"message fetch still failing: {state} ({self._suppressed + 1} failed reads in the last "
                          f"{FETCH_ERROR_REPEAT_S:.0f} s; FastStream retries on its own)")
        else:
            record.msg = f"message fetch failing: {state} (FastStream retries on its own; repeats are summarised)"
        record.args = None
        if not self.keep_traceback:
            record.exc_info = None
            record.exc_text = None
        self._state, self._shown_at, self._suppressed = state, now, 0
        return True


class RepeatDigest(logging.Filter):
    """The worker's own warnings during an outage ("housekeeping: broker unavailable", every sweep):
    the same text is shown once, then at most once per FETCH_ERROR_REPEAT_S with how often it recurred.
    Keyed by the whole message (a different shard or error is news), bounded to REPEAT_KEYS texts."""

    REPEAT_KEYS = 64

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        super().__init__()

        self._clock = clock or time.monotonic
        self._seen: dict[str, tuple[float, int]] = {}  # message -> (shown at, suppressed since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        text = record.getMessage()
        now = self._clock()
        shown_at, suppressed = self._seen.get(text, (None, 0))
        if shown_at is not None and now - shown_at < FETCH_ERROR_REPEAT_S:
            self._seen[text] = (shown_at, suppressed + 1)
            return False
        if suppressed:
            record.msg, record.args = f"{text} (repeated {suppressed} times in the last {FETCH_ERROR_REPEAT_S:.0f} s)", None
        self._seen.pop(text, None)
        if len(self._seen) >= self.REPEAT_KEYS:
            self._seen.pop(next(iter(self._seen)))
        self._seen[text] = (now, 0)
        return True


def configure_logging(level: str) -> None:
    """Everything on stderr in one plain format (no ANSI colour), FastStream's loggers included."""
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, format=LOG_FORMAT, stream=sys.stderr)
    formatter = logging.Formatter(LOG_FORMAT)
    # FastStream logs INFO lines per message and per shutdown task ("callback for Task-N is being
    # executed"): only its warnings are news, unless we are debugging.
    threshold = logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING
    for name in _FASTSTREAM_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter)
        handler.addFilter(_AtLeast(threshold))
        logger.addHandler(handler)
        logger.propagate = False
    fetch_logger = logging.getLogger(_FETCH_ERROR_LOGGER)
    for old_filter in [f for f in fetch_logger.filters if isinstance(f, FetchErrorDigest)]:
        fetch_logger.removeFilter(old_filter)
    fetch_logger.addFilter(FetchErrorDigest(keep_traceback=numeric <= logging.DEBUG))
    worker_logger = logging.getLogger("goose_ingest.worker")
    for stale in [f for f in worker_logger.filters if isinstance(f, RepeatDigest)]:
        worker_logger.removeFilter(stale)
    worker_logger.addFilter(RepeatDigest())


def stdout_to_stderr() -> None:
    """Make this process's `sys.stdout` its stderr: a worker promises nothing on stdout.

    FastStream creates its per-broker logger with a coloured handler on `sys.stdout` unless that
    logger already has a handler on `sys.stdout`; with stdout being stderr, the plain handler
    `configure_logging` installed counts as that one, so nothing (coloured or not) reaches stdout."""
    sys.stdout.flush()
    sys.stdout = sys.stderr
