"""The one shell of the thread consumers (issue 33 item 1): `export postgres`, the archive and
`export jsonl` start, stop and are watched by this code, and keep only their own loop.

Those three read through `GroupReader` in a thread because their targets are synchronous (psycopg's
sync connection, object-store writes, files); the async consumers read through FastStream
subscribers and are watched by the same `ReaderWatch` (services/streams/watch.py). Before, each of
the three had its own copy of this sequence, in its own order (`export postgres` had no early
/healthz; the archive's thread failure was its own exit), which is where they drifted.

The start sequence, the same for each:

1. /healthz at once and a /readyz that says what is awaited (`serve_early`): a liveness probe never
   restarts a process that waits for its broker or its store;
2. one PING of the broker: refused credentials or permissions and TLS misconfiguration are raised
   (the CLI: one line, exit 2); a broker that is down is waited for by the consumer's loop;
3. the consumer built on that client; SIGTERM/SIGINT call its `stop` (it finishes what it does);
4. `prepare` (the archive's lease, store and deployment checks), which may wait and answers False
   when a stop came first: exit 0;
5. /metrics and /readyz switched to the consumer's (the early server adopted);
6. the consumer's `run` in its reader thread, watched: a run that raised, or ended with a `fault()`
   (a failed thread of its own, a fenced archive), or ended without being asked, turns /readyz false
   naming the streams it reads and exits 1 for the supervisor to restart it. A requested stop is
   exit 0.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

from services.settings import Settings
from services.streams.readiness import Readiness
from services.streams.watch import WATCH_INTERVAL_S, ReaderWatch


class ThreadConsumer(Protocol):
    def readiness(self) -> Readiness: ...

    def stop(self) -> None: ...

    def run(self) -> None: ...

    def fault(self) -> str | None:
        """Why `run` ended on its own (one line), None after a requested stop."""
        ...


C = TypeVar("C", bound=ThreadConsumer)


class ReaderThread:
    """A consumer's `run` in a thread, seen by `ReaderWatch` as a subscriber is (`running`)."""

    def __init__(self, name: str, body: Callable[[], None], log: logging.Logger) -> None:
        self.error: str | None = None
        self._body, self._log = body, log
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def _run(self) -> None:
        try:
            self._body()
        except Exception as exc:  # a bug of the loop: said once with its traceback, then exit 1
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
            self._log.exception("the reader thread raised")


class ThreadShell:
    """One consumer's reader thread and its watch; `readiness` is what /readyz asks."""

    def __init__(self, name: str, streams: Sequence[str], consumer: ThreadConsumer, log: logging.Logger) -> None:
        self.name, self.consumer, self.log = name, consumer, log
        self.streams = ", ".join(streams)
        # the consumer's whole loop runs there (export postgres's writer, which starts its own reader)
        self.reader = ReaderThread(f"{name} loop", consumer.run, log)
        self.watch = ReaderWatch([(self.streams, self.reader)], noun="reader thread")
        self.requested = False

    def stop(self) -> None:
        self.requested = True
        self.watch.shutdown()  # the reader still runs: a death after this is the fault below, not the stop
        self.consumer.stop()

    def readiness(self) -> Readiness:
        return self.watch.readiness() if self.watch.stopped else self.consumer.readiness()

    def run(self) -> int:
        """Until the reader thread ends; the exit status (0: asked to stop, 1: it died)."""
        self.reader.thread.start()
        self.watch.consuming = True
        while self.reader.running:
            self.reader.thread.join(WATCH_INTERVAL_S)  # short joins: the signal handlers run in between
        why = self.reader.error or self.consumer.fault() or (None if self.requested else "ended unasked")
        if why is None:
            return 0
        self.watch.stopped[self.streams] = why
        # the why is on /readyz; the log has it already (the consumer's own line, or the traceback above)
        self.log.error("%s: its reader of %s stopped; exiting with status 1 for a restart", self.name, self.streams)
        return self.watch.exit_code


def check_broker(client: Any, log: logging.Logger) -> None:
    """One PING before the consumer starts (step 2 above)."""
    from redis.exceptions import AuthenticationError

    from services.streams.reader import BROKER_ERRORS

    try:
        client.ping()
    except AuthenticationError:
        raise  # a ConnectionError in redis-py, but waiting will not fix credentials: one line, exit 2
    except BROKER_ERRORS as exc:  # down: the consumer's loop waits for it, as it does mid-run
        log.warning("broker unreachable at start (%s); waiting for it", type(exc).__name__)


def serve(name: str, settings: Settings, log: logging.Logger, *, awaiting: str, streams: Sequence[str],
          build: Callable[[Any], C], metrics: Callable[[C], object], describe: Callable[[C], str],
          stopping: str, prepare: Callable[[C], bool] | None = None,
          close: Callable[[], None] | None = None) -> int:
    """Run a thread consumer as its command does (the module's steps 1-6); its exit status.

    `build(client)` makes the consumer, `metrics(consumer)` the holder of its `.registry`,
    `describe(consumer)` the start line's words, `stopping` what a stop finishes first, `close`
    what is released at the end (its target), whatever happened."""
    from services.broker.connect import sync_client
    from services.metrics.server import serve as serve_metrics
    from services.metrics.server import serve_early
    from services.metrics.startup import stop_on_signals

    s = settings
    early = serve_early(s.metrics_host, s.metrics_port, awaiting, port_file=s.metrics_port_file)
    try:
        client = sync_client(s)
        check_broker(client, log)
        consumer = build(client)
        shell = ThreadShell(name, streams, consumer, log)
        stop_on_signals(log, stopping, shell.stop)
        if prepare is not None and not prepare(consumer):
            log.info("%s: stopped before the broker and its target answered", name)
            return 0
        server = serve_metrics(cast(Any, metrics(consumer)), s.metrics_host, s.metrics_port, shell.readiness,
                               port_file=s.metrics_port_file)
        log.info("%s: %s; metrics on %s:%d", name, describe(consumer), server.host, server.port)
        try:
            return shell.run()
        finally:
            server.close()
    finally:
        early.close()  # once adopted, closed above already (idempotent)
        if close is not None:
            close()
