"""Before a long-running command's app runs: probes at once, and a stop that works in every state.

A worker (or exporter) usually starts before its broker. While it waits:
- /healthz already answers 200 (it is alive: a scheduler must not restart it for waiting), and
  /readyz answers 503 with what it waits for (``serve_early``, services/metrics/server.py);
- SIGTERM and SIGINT end the wait and the command exits 0 (a stop requested before anything
  happened). Without this, a process that is PID 1 in a container ignores SIGTERM (the kernel
  applies no default action to PID 1) and is killed after the grace period; elsewhere SIGTERM
  kills it with 143 instead of 0.

The handlers stay installed until FastStream's ``app.run()`` installs its own (the same signals,
replaced synchronously before its first await); a stop that came in between is forwarded to the
app (``forward``), so no signal is lost in the hand-over.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger("goose_ingest.startup")

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
    """SIGTERM/SIGINT as a request to stop: cancels the current wait, then tells whoever took over."""

    def __init__(self) -> None:
        self.requested = False
        self._targets: list[Callable[[], object]] = []

    def install(self) -> StopOnSignal:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._fire, sig)
        return self

    def _fire(self, signum: int) -> None:
        if not self.requested:
            log.info("%s while starting: stopping", signal.Signals(signum).name)
        self.requested = True
        for target in list(self._targets):
            target()

    def forward(self, stop: Callable[[], object]) -> None:
        """Call ``stop`` on a later signal (and now, when one came already)."""
        self._targets.append(stop)
        if self.requested:
            stop()

    async def wait(self, aw: Awaitable[T]) -> T | None:
        """``aw``'s result, or None when a stop signal came first (``aw`` is cancelled)."""
        task = asyncio.ensure_future(aw)
        self._targets.append(task.cancel)
        try:
            if self.requested:
                task.cancel()
            return await task
        except asyncio.CancelledError:
            if self.requested and task.cancelled():
                return None
            raise
        finally:
            self._targets.remove(task.cancel)


def stop_on_signals(logger: logging.Logger, doing: str, stop: Callable[[], object]) -> None:
    """SIGTERM/SIGINT call ``stop`` in a synchronous consumer (`export postgres`, `archive`): its loop
    ends after ``doing`` (what it finishes first, said in the log line)."""

    def _stop(signum: int, _frame: object) -> None:
        logger.info("signal %d: %s", signum, doing)
        stop()

    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
