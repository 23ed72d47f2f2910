"""The one shell of the async consumers (issue 33 item 1): the worker and `export otlp` start, run
their tasks, stop and are watched by this code, as the thread consumers are by thread_shell.py, and
keep only what they build (subscribers, handler, target, their own background tasks).

The start sequence, the same for each, in FastStream's lifespan:

1. /healthz at once and a /readyz that says what is awaited (`serve_early`), before the broker is
   reached (a second process on the same port fails here: one line, exit 2);
2. SIGTERM/SIGINT: while waiting, exit 0; once the app runs, forwarded to `app.exit`;
3. the broker waited for (`wait_for_broker`: refused credentials are one line and exit 2, a broker
   that is down is waited for with /readyz saying so);
4. the consumer's app built (`build`): its `on_startup` creates the client, the groups and its
   target, and adopts the early server (`serve` of services/metrics);
5. after start-up (`AppRuntime.started`): the subscribers' reads released together, the watch and
   the consumer's background tasks started, one line saying what it consumes;
6. at shutdown (`AppRuntime.stopping`): subscribers still running mean a requested stop (exit 0),
   one that stopped before means it died (exit 1 for the supervisor); the tasks cancelled; then
   the server and the client closed (`AppRuntime.closed`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from services.settings import Settings
from services.streams.watch import ReaderWatch


class App(Protocol):  # the part of a FastStream app the shell uses
    def after_startup(self, func: Any) -> Any: ...

    def exit(self) -> None: ...

    async def run(self) -> None: ...


@dataclass
class AppRuntime:
    """What every async consumer process holds beside its own parts: the client, the metrics server,
    the watch over its subscribers, the background tasks, and the barrier that keeps every read
    until all subscribers have started (services/streams/faststream_adapter.py)."""

    watch: ReaderWatch = field(default_factory=ReaderWatch)
    client: Any = None
    server: Any = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    all_started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def exit_code(self) -> int:
        """0 after a requested shutdown; 1 when a subscriber stopped on its own (a supervisor restarts us)."""
        return self.watch.exit_code

    def started(self, app: App, *background: Coroutine[Any, Any, None]) -> None:
        """Step 5: reads released, the watch and `background` running."""
        self.watch.consuming = True
        self.all_started.set()
        for coro in background:
            self.tasks.append(asyncio.create_task(coro))
        self.tasks.append(asyncio.create_task(self.watch.run(app.exit)))

    async def stopping(self) -> None:
        """Step 6: the watch told it is a shutdown, the tasks cancelled and awaited."""
        self.watch.shutdown()
        for task in self.tasks:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def closed(self) -> None:
        """The metrics server and the client released (after FastStream stopped the subscribers)."""
        if self.server is not None:
            self.server.close()
        if self.client is not None:
            await self.client.aclose()


R = TypeVar("R", bound=AppRuntime)


async def serve_app(settings: Settings, log: logging.Logger, build: Callable[[], tuple[App, R]],
                    describe: Callable[[R], str]) -> int:
    """Run an async consumer as its command does (steps 1-6); its exit status. `describe(runtime)`:
    the start line's words, before "; metrics on port N"."""
    from services.broker.connect import wait_for_broker
    from services.metrics.server import serve_early
    from services.metrics.startup import StopOnSignal

    early = serve_early(settings.metrics_host, settings.metrics_port, "waiting for the broker", settings.metrics_port_file)
    try:
        stop = StopOnSignal().install()
        await stop.wait(wait_for_broker(settings, log, early.not_ready))
        if stop.requested:
            return 0
        app, runtime = build()
        stop.forward(app.exit)

        @app.after_startup
        async def _announce() -> None:
            log.info("%s; metrics on port %s", describe(runtime), runtime.server.port if runtime.server else "-")

        await app.run()
    finally:
        early.close()  # when adopted, the app closed it already (idempotent)
    return runtime.exit_code
