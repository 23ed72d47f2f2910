"""`goose-ingest worker`: run one worker process (FastStream app + metrics endpoint).

Logs go to stderr, never stdout (the worker promises nothing on stdout), in one plain format
without ANSI colour: FastStream's own loggers are re-pointed at our handler.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable

from services.settings import ConfigError, Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_FASTSTREAM_LOGGERS = ("faststream", "faststream.access.redis")
# FastStream's Redis subscribers log this (ERROR, with the traceback) on every failed read, each
# subscriber every 5 s: hundreds of traceback lines a minute while the broker is down.
_FETCH_ERROR_LOGGER = "faststream.access.redis"
_FETCH_ERROR_MESSAGE = "Message fetch error"
FETCH_ERROR_REPEAT_S = 60.0  # the same failure is logged again at most this often, with a count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="consume raw goose lines and publish harness events (needs a broker)",
        description="Run one worker process: consume the raw shard streams in a consumer group, normalize and "
        "redact every run, commit events, run records and dead letters atomically, serve /metrics, /healthz "
        "and /readyz. Needs GOOSE_INGEST_REDIS_URL; logs go to stderr. Stop it with SIGTERM or Ctrl-C.",
    )
    p.add_argument("--metrics-port", type=int, help="override GOOSE_INGEST_METRICS_PORT (0: any free port)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")
    p.set_defaults(func=run)


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
        import time

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
        import time

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


def run(args: argparse.Namespace) -> int:
    stdout_to_stderr()
    configure_logging(args.log_level)
    settings = Settings()
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {args.metrics_port}: must be 0..65535")
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if not settings.redis_url:
        raise ConfigError("no broker configured (GOOSE_INGEST_REDIS_URL); `goose-ingest up` starts an embedded "
                          "redis-server with a worker")
    try:
        return asyncio.run(serve_worker(settings))
    except KeyboardInterrupt:
        return 0


async def wait_for_broker(settings: Settings, log: logging.Logger, say: Callable[[str], None] | None = None) -> None:
    """Wait until the broker answers, instead of crashing: a worker usually starts before Redis.

    ``say`` gets each retry's reason (an early /readyz shows it, services/metrics/startup.py)."""
    from redis.exceptions import AuthenticationError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from services.broker.connect import async_client
    from services.broker.helpers import redact_url

    delay = 0.2
    while True:
        client = async_client(settings)
        try:
            await client.ping()
            return
        except AuthenticationError:
            raise  # a ConnectionError in redis-py, but waiting will not fix credentials: one line, exit 2
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            log.warning("broker %s unreachable (%s); retrying in %.1fs", redact_url(settings.redis_url),
                        type(exc).__name__, delay)
            if say is not None:
                say(f"waiting for the broker {redact_url(settings.redis_url)}: unreachable ({type(exc).__name__})")
        finally:
            await client.aclose()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def serve_worker(settings: Settings) -> int:
    from services.metrics import Metrics
    from services.metrics.server import serve_early
    from services.metrics.startup import StopOnSignal
    from services.worker.app import build_app
    from services.worker.collector import tune_collector

    log = logging.getLogger("goose_ingest.worker")
    tune_collector()
    # Served before the broker is reached (a second worker on the same host fails here, exit 2), so
    # /healthz answers and /readyz says what we wait for; build_app's serve() adopts this server.
    # SIGTERM/SIGINT while waiting: exit 0 (services/metrics/startup.py).
    early = serve_early(settings.metrics_host, settings.metrics_port, "waiting for the broker", settings.metrics_port_file)
    try:
        stop = StopOnSignal().install()
        await stop.wait(wait_for_broker(settings, log, early.not_ready))
        if stop.requested:
            return 0
        app, parts = build_app(settings, Metrics())
        stop.forward(app.exit)

        @app.after_startup
        async def _announce() -> None:
            server = parts.get("server") if isinstance(parts, dict) else getattr(parts, "server", None)
            consumer = parts["consumer"] if isinstance(parts, dict) else getattr(parts, "consumer", "?")
            log.info("worker %s consuming %d shards; metrics on port %s", consumer, settings.shards,
                     server.port if server else "-")

        await app.run()
    finally:
        early.close()  # when adopted, the app closed it already (idempotent)
    return parts.exit_code  # 1 when a subscriber stopped on its own (services/worker/app.py)
