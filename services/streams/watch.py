"""The one watch over a consumer's readers (issue 33 item 1): a reader that stopped on its own
turns readiness false with a reason and ends the process with status 1, for its supervisor to
restart it; a reader stopped by a requested shutdown is no death.

FastStream 0.7.8 stops a subscriber whose read task fails (an error it treats as terminal) and
carries on with the others: the process stays up, half deaf, and /readyz could not tell. The
worker watched its subscribers since issue 20; `export otlp` did not (issue 33). Both run this one.
The thread consumers (`export postgres`, archive, `export jsonl`) run this one too, over their
reader thread (services/streams/thread_shell.py `ReaderThread`).

A reader is anything with a `running` attribute (a FastStream subscriber has one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from services.streams.readiness import READY, Readiness, not_ready

WATCH_INTERVAL_S = 0.5  # how often the readers' liveness is checked

log = logging.getLogger("goose_ingest.streams")

# The status of a consumer whose reader stopped on its own: its supervisor restarts it.
EXIT_READER_DIED = 1


class ReaderWatch:
    """The readers of one process, by stream: alive, died, or stopped on request.

    `consuming` once every reader has started (a stop before that is requested, not a death);
    `shutting_down` once the process stops on request; `stopped`: stream -> why its reader died."""

    # what `stopped` says of a reader that stopped without a reason of its own
    PLAIN = frozenset({"stopped", "stopped before shutdown"})

    def __init__(self, readers: list[tuple[str, Any]] | None = None, interval_s: float = WATCH_INTERVAL_S,
                 noun: str = "subscriber") -> None:
        self.readers: list[tuple[str, Any]] = readers if readers is not None else []
        self.interval_s = interval_s
        self.noun = noun  # what /readyz calls a reader: a FastStream subscriber, a reader thread
        self.stopped: dict[str, str] = {}
        self.consuming = False
        self.shutting_down = False

    def add(self, stream: str, reader: Any) -> None:
        self.readers.append((stream, reader))

    def dead(self) -> list[str]:
        return [stream for stream, reader in self.readers if not reader.running]

    @property
    def exit_code(self) -> int:
        """0 after a requested shutdown; 1 when a reader stopped on its own (a supervisor restarts us)."""
        return EXIT_READER_DIED if self.stopped else 0

    def readiness(self) -> Readiness:
        if not self.consuming and not self.stopped:  # not all started yet: none died
            return not_ready("subscribers not running")
        dead = self.dead()
        if self.stopped or (dead and not self.shutting_down):
            names = sorted(set(self.stopped) | set(dead))
            whys = sorted(set(self.stopped.values()) - self.PLAIN)
            detail = f" ({'; '.join(whys)})" if whys else ""
            return not_ready(f"{self.noun} stopped on {', '.join(names)}{detail}: exiting with status 1 for a restart")
        if self.shutting_down:
            return not_ready("stopping")
        if not self.readers or dead:
            return not_ready("subscribers not running")
        return READY

    async def run(self, exit_app: Callable[[], None]) -> None:
        """Until shutdown: a reader found stopped ends the process (`exit_app`, status 1)."""
        while True:
            await asyncio.sleep(self.interval_s)
            if self.shutting_down:
                return
            dead = self.dead()
            if dead:
                for stream in dead:
                    self.stopped[stream] = "stopped"
                log.error("subscriber stopped on %s: exiting with status 1", ", ".join(dead))
                exit_app()
                return

    def shutdown(self) -> None:
        """A shutdown begins: a reader already stopped (after the start) died before it, on its own."""
        for stream, reader in self.readers:
            if self.consuming and not reader.running and stream not in self.stopped:
                self.stopped[stream] = "stopped before shutdown"
        self.shutting_down = True
