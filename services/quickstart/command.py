"""`goose-ingest up` (a broker unless one is configured, plus a worker) and `goose-ingest demo`.

"Embedded" means one thing in goose-ingest: the `redis-server` child process these commands start
when no broker is configured (services/broker/embedded.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from contracts.formats import AGENT_FORMATS, DEFAULT_FORMAT
from services.broker.connect import sync_client
from services.broker.url import DEFAULT_PORT as EMBEDDED_DEFAULT_PORT  # Redis's own: the URL users expect
from services.broker.url import redact_url
from services.settings import ConfigError, Settings

if TYPE_CHECKING:
    from services.archive.local import LocalArchive

SHARED_FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
DEFAULT_FIXTURES = SHARED_FIXTURES / DEFAULT_FORMAT
# Beside every goose fixture, the demo shows one run of each other format of contracts/formats.py
# (its fixtures' directory is its format's name; one without this transcript is left out).
OTHER_FORMAT_FIXTURES = tuple((f.name, f.demo_transcript) for f in AGENT_FORMATS if f.name != DEFAULT_FORMAT)


@dataclass(frozen=True)
class Transcript:
    path: Path
    format: str | None  # the `format` label to publish with; None: the workers detect it
    run_name: str  # the run key's last part


def default_transcripts() -> list[Transcript]:
    out = [Transcript(p, DEFAULT_FORMAT, p.stem) for p in sorted(DEFAULT_FIXTURES.glob("*.jsonl"))]
    for fmt, name in OTHER_FORMAT_FIXTURES:
        path = SHARED_FIXTURES / fmt / name
        if path.is_file():
            out.append(Transcript(path, fmt, f"{fmt}-{path.stem}"))
    return out
WORKER_STOP_TIMEOUT_S = 5.0  # demo: its worker has nothing to finish but what it holds in hand
ARCHIVE_FINISH_TIMEOUT_S = 30.0  # demo: the archive reads what the worker wrote, then writes it on stop
# up: after its worker stopped (Ctrl-C, SIGTERM), how long the archive may take to read and write the
# rest before the broker stops; a second Ctrl-C cuts it short (ARCHIVE_ABANDON_TIMEOUT_S, then the count).
UP_ARCHIVE_FINISH_TIMEOUT_S = 20.0
ARCHIVE_ABANDON_TIMEOUT_S = 3.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up",
        help="start a broker (embedded redis-server unless one is configured) and a worker",
        description="Run the pipeline on this machine: a worker on GOOSE_INGEST_REDIS_URL, or, when none is "
        "configured, on an embedded redis-server started here (its URL is printed on stderr, to export in "
        "other shells for `tap` and `tail`). Runs until Ctrl-C or SIGTERM; the embedded server stops with it.",
    )
    up.add_argument("--port", type=int, metavar="PORT",
                    help=f"port of the embedded redis-server (default: {EMBEDDED_DEFAULT_PORT} when free, else any free "
                    "port; the URL is printed either way)")
    up.set_defaults(func=run_up)
    demo = sub.add_parser(
        "demo",
        help="push goose transcripts through a live pipeline and show the events",
        description="Publish transcripts (default: the shared goose fixtures and one transcript of each other "
        "format: Claude Code, Codex, Gemini CLI, opencode) as runs through a real worker process -- on an embedded redis-server unless a broker is "
        "configured -- and print the harness events and run records they became, one run after another. With its "
        "embedded broker (or GOOSE_INGEST_ARCHIVE_URL set) it also archives the runs (docs/archive.md \"Locally\").",
    )
    demo.add_argument("files", nargs="*", help="stream-json / exec --json transcripts (default: the shared fixtures); "
                      "their format is detected by the workers")
    demo.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the worker (default 60)")
    demo.add_argument("--otlp", metavar="URL", help="also export the runs as OpenTelemetry traces to this OTLP/HTTP "
                      "endpoint (e.g. http://127.0.0.1:6006, a local Phoenix) and print their trace ids (docs/otel.md)")
    demo.set_defaults(func=run_demo)


@dataclass(frozen=True)
class Broker:
    settings: Settings  # with the URL the worker and publishers use
    embedded: object | None  # the EmbeddedRedis started here, or None for a configured broker

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.close()  # type: ignore[attr-defined]


def _broker(settings: Settings, port: int | None = None, preferred: int | None = None) -> Broker:
    """The configured broker, or an embedded redis-server: on `port` exactly when given, else on
    `preferred` when it is free, else on any free port."""
    if settings.redis_url:
        return Broker(settings, None)
    from services.broker.embedded import RedisServerNotFound
    from services.broker.embedded import start_redis as start_any

    def start_redis(port: int | None = None) -> Any:  # gone with this process, however it ends
        return start_any(port, die_with_parent=True)

    try:
        if port is not None:
            try:
                server = start_redis(port)
            except RuntimeError as exc:  # taken, or redis-server refused it: the user asked for this one
                raise ConfigError(f"--port {port}: cannot start the embedded redis-server there ({exc})") from None
        else:
            server = _on_preferred_port(start_redis, preferred) or start_redis()
    except RedisServerNotFound as exc:
        raise ConfigError(str(exc)) from None
    return Broker(settings.model_copy(update={"redis_url": server.url}), server)


def _on_preferred_port(start: Any, port: int | None) -> Any:
    """An embedded server on `port`, or None when another server has it (a system Redis, another `up`)."""
    if port is None:
        return None
    try:
        return start(port)
    except RuntimeError:
        return None


class _Interrupts:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) raise KeyboardInterrupt, so every way of being
    asked to stop runs the same ordered stop (worker, archive, then the broker); and they are
    remembered: one that lands in a finalizer (a client's ``__del__`` run by the collector) would be
    swallowed there by Python, so it is not raised there and the next ``check`` (each phase makes
    one) raises it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferred = 0

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside, a signal is only remembered: code that holds locks and threads (the publisher)
        is not cut at an arbitrary line; it calls ``check`` where stopping is safe."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
        self.check()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        if self._deferred:
            return
        while frame is not None:  # in a finalizer it would only print "Exception ignored in ...": later
            if frame.f_code.co_name == "__del__":
                return
            frame = frame.f_back
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _stops_as_interrupts() -> Iterator[_Interrupts]:
    interrupts = _Interrupts()
    previous = {s: signal.signal(s, interrupts) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield interrupts
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """The last, bounded steps of a stop (the worker, the archive thread, the broker) are not cut
    short by another Ctrl-C: that would leave them running with nobody to stop them."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_up(args: argparse.Namespace) -> int:
    from services.logs import configure_logging, stdout_to_stderr
    from services.metrics.server import check_bindable
    from services.worker.serve import serve_worker

    stdout_to_stderr()  # `up` promises nothing on stdout; FastStream must not write there either
    configure_logging("INFO")
    settings = Settings()
    if args.port is not None:
        if settings.redis_url:
            raise ConfigError(f"--port is the embedded redis-server's, but GOOSE_INGEST_REDIS_URL is set "
                              f"({redact_url(settings.redis_url)}): unset it to start an embedded one")
        if not 1 <= args.port <= 65535:
            raise ConfigError(f"--port {args.port}: must be 1..65535")
    check_bindable(settings.metrics_host, settings.metrics_port)  # before starting a server we would orphan
    from services.archive.local import archives_here, start_local_archive  # the log of record (docs/archive.md)

    broker: Broker | None = None
    archive: LocalArchive | None = None
    try:
        with _stops_as_interrupts() as interrupts:
            broker = _broker(settings, args.port, EMBEDDED_DEFAULT_PORT)
            interrupts.check()
            _announce_broker(broker, args.port)
            worker_settings = broker.settings
            if archives_here(broker.settings, broker.embedded is not None):
                worker_settings, archive = start_local_archive(broker.settings)
            else:
                print("goose-ingest: not archiving (a configured broker may have its own `goose-ingest archive`; "
                      "set GOOSE_INGEST_ARCHIVE_URL to archive from here)", file=sys.stderr, flush=True)
            interrupts.check()
        # The worker's loop handles SIGINT/SIGTERM itself (services/metrics/startup.py): it stops.
        code = asyncio.run(serve_worker(worker_settings))
    except KeyboardInterrupt:
        code = 0 if broker is not None else 130
    finally:
        _stop_up(broker, archive)
    return code


def _announce_broker(broker: Broker, port: int | None) -> None:
    url = broker.settings.redis_url
    if broker.embedded is not None:
        embedded_port = getattr(broker.embedded, "port", None)
        if port is None and embedded_port != EMBEDDED_DEFAULT_PORT:
            print(f"goose-ingest: port {EMBEDDED_DEFAULT_PORT} is taken (another Redis, or another `up`?): "
                  f"the embedded redis-server listens on {embedded_port} instead", file=sys.stderr, flush=True)
        print(f"goose-ingest: embedded redis-server at {url}\n"
              f"  in another shell: export GOOSE_INGEST_REDIS_URL={url}\n"
              f"  then: goose-ingest tap -- goose run --output-format stream-json ...   and   goose-ingest tail",
              file=sys.stderr, flush=True)
    else:
        # An URL exported in this shell (perhaps long ago) wins over the embedded server: say so, once.
        print(f"goose-ingest: using the broker GOOSE_INGEST_REDIS_URL={redact_url(url or '')} from the environment, "
              "no embedded redis-server (unset the variable to start one)", file=sys.stderr, flush=True)


def _stop_up(broker: Broker | None, archive: LocalArchive | None) -> None:
    """After the worker stopped: the archive reads and writes what is left (UP_ARCHIVE_FINISH_TIMEOUT_S
    at most; another Ctrl-C cuts that short), says what stays unarchived and where it will be picked
    up, then the broker stops, last."""
    try:
        if archive is not None:
            left = -1
            try:
                with _stops_as_interrupts():
                    left = archive.finish(UP_ARCHIVE_FINISH_TIMEOUT_S)
            except KeyboardInterrupt:
                with _uninterrupted():
                    archive.stop(timeout=ARCHIVE_ABANDON_TIMEOUT_S)
                    left = _unarchived(archive)
            if broker is not None:
                _say_unarchived(left, archive.archiver.store.describe(), broker)
    finally:
        with _uninterrupted():
            if broker is not None:
                broker.stop()


def _unarchived(archive: LocalArchive) -> int:
    try:
        backlog = archive.backlog()
    except Exception:  # noqa: BLE001 - the broker did not answer: not known
        return -1
    return -1 if backlog is None else sum(backlog)


def _say_unarchived(left: int, where: str, broker: Broker) -> None:
    if left == 0:
        print(f"goose-ingest: stopped; everything the broker held is archived to {where}", file=sys.stderr, flush=True)
        return
    what = "some entries" if left < 0 else f"{left} entries"
    if broker.embedded is not None:
        # Without persistence the embedded server takes them with it: no later `up` can read them.
        fate = ("the embedded redis-server keeps no data, so they are lost "
                f"(one Ctrl-C lets the archive finish, up to {UP_ARCHIVE_FINISH_TIMEOUT_S:.0f}s)")
    else:
        fate = (f"they stay in the broker {redact_url(broker.settings.redis_url or '')} and are archived by the "
                "next `up` (or `goose-ingest archive`) on it")
    print(f"goose-ingest: stopping with {what} not archived to {where}: {fate}", file=sys.stderr, flush=True)


def _wait_for_runs(settings: Settings, runs: set[str], timeout: float, check: Any = None) -> bool:
    from contracts.topics import RECORD, TopicEntry

    client = sync_client(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check is not None:
            check()
        records = [TopicEntry.from_fields(f, RECORD) for stream in settings.layout.runs_partitions()
                   for _, f in client.xrange(stream)]
        ended = {r.run for r in records if r.label in ("ended", "abandoned")}
        if runs <= ended:
            return True
        time.sleep(0.2)
    return False


def _check_transcripts(transcripts: list[Transcript]) -> None:
    for path in (t.path for t in transcripts):
        if not path.is_file():
            raise ConfigError(f"{path}: no such transcript file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{path}: not readable")


def _print_run(client: Any, settings: Settings, run: str) -> None:
    # client: sync_client's Redis or RedisCluster (bytes replies); redis-py types replies for both decode modes
    """The run's events and records in commit order (STARTED first), as `tail` prints them."""
    from contracts.topics import EVENT, RECORD, TopicEntry
    from services.tail.format import event_line, record_line
    from services.tail.order import Followed, commit_order

    layout = settings.layout
    shard = layout.shard_of(run)
    decoded = [
        (stream, sid.decode(), is_record, TopicEntry.from_fields(f, RECORD if is_record else EVENT))
        for stream, is_record in ((layout.events_partition(shard), False), (layout.runs_partition(shard), True))
        for sid, f in client.xrange(stream)
    ]
    entries = [Followed(stream, sid, is_record, entry.document())
               for stream, sid, is_record, entry in decoded if entry.run == run]
    for entry in commit_order(entries):
        print(record_line(entry.data) if entry.is_record else event_line(entry.data))
    print()


@dataclass
class _DemoParts:
    """What a demo started, stopped in this order: the exporter and the worker (they write), the
    archive (it reads what they wrote), the broker last."""

    broker: Broker | None = None
    worker: subprocess.Popen[bytes] | None = None
    archive: LocalArchive | None = None
    exporter: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.exporter is not None:
            from services.export.otlp import demo as otlp_demo

            otlp_demo.stop(self.exporter)
        if self.worker is not None:
            self.worker.terminate()
            try:
                self.worker.wait(timeout=WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        if self.archive is not None:
            self.archive.stop(timeout=ARCHIVE_ABANDON_TIMEOUT_S)
        if self.broker is not None:
            self.broker.stop()


def run_demo(args: argparse.Namespace) -> int:
    transcripts = [Transcript(Path(f), None, Path(f).stem) for f in args.files] or default_transcripts()
    if not transcripts:
        raise ConfigError(f"no transcripts given and none in {DEFAULT_FIXTURES}")
    _check_transcripts(transcripts)
    if args.timeout <= 0:
        raise ConfigError("--timeout must be > 0")
    if args.otlp:
        from services.export.otlp import demo as otlp_demo

        otlp_demo.check_endpoint(args.otlp)
    # A spool of its own: runs the demo could not deliver must not wait in the user's spool, where a
    # later `spool --drain` would deliver them to whatever broker is configured then.
    spool = tempfile.mkdtemp(prefix="goose-ingest-demo-spool-")
    parts = _DemoParts()
    try:
        with _stops_as_interrupts() as interrupts:
            return _demo(args, transcripts, spool, parts, interrupts)
    except KeyboardInterrupt:
        print("goose-ingest demo: interrupted; stopping", file=sys.stderr, flush=True)
        return 130
    finally:
        with _uninterrupted():
            parts.stop()
            shutil.rmtree(spool, ignore_errors=True)


def _demo(args: argparse.Namespace, transcripts: list[Transcript], spool: str, parts: _DemoParts,
          interrupts: _Interrupts) -> int:
    from services.archive.local import archives_here, local_archive_url, start_local_archive
    from services.broker.embedded import die_with_parent_hook
    from services.tap.publisher import Publisher

    user = Settings()
    broker = parts.broker = _broker(user)
    interrupts.check()
    settings = broker.settings
    archiving = archives_here(settings, broker.embedded is not None)
    archive_url = local_archive_url(settings) if archiving else settings.archive_url  # beside the user's spool
    env = dict(os.environ, GOOSE_INGEST_REDIS_URL=settings.redis_url or "", GOOSE_INGEST_METRICS_PORT="0",
               GOOSE_INGEST_SHARDS=str(settings.shards), GOOSE_INGEST_ARCHIVE_URL=archive_url or "",
               GOOSE_INGEST_SPOOL_DIR=spool)
    # The worker's output is log, never the demo's result: its stdout goes to our stderr. Its own
    # session: Ctrl-C reaches the demo only, which stops the worker before the archive and the broker.
    parts.worker = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "--log-level", "WARNING"],
                                    env=env, stdout=sys.stderr.fileno(), start_new_session=True,
                                    preexec_fn=die_with_parent_hook())
    interrupts.check()
    if archiving:
        settings, parts.archive = start_local_archive(settings.model_copy(update={"archive_url": archive_url}))
        interrupts.check()
    settings = settings.model_copy(update={"spool_dir": spool})
    if args.otlp:
        from services.export.otlp import demo as otlp_demo

        parts.exporter = otlp_demo.start_exporter(settings, args.otlp)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    runs = []
    for transcript in transcripts:
        run = f"demo/{stamp}/{transcript.run_name}"[:200]
        runs.append(run)
        with interrupts.deferred(), Publisher(settings, run, {"host": "demo"}, format=transcript.format) as pub:
            for i, raw in enumerate(transcript.path.read_bytes().splitlines()):
                pub.add_line(raw, "stdout")
                if i % 1000 == 999:
                    interrupts.check()  # here, between two lines: the publisher closes cleanly
            pub.add_eof(0)
    if not _wait_for_runs(settings, set(runs), args.timeout, interrupts.check):
        if parts.worker.poll() is not None:
            print(f"goose-ingest demo: the worker exited with code {parts.worker.returncode}", file=sys.stderr)
        else:
            print("goose-ingest demo: timed out waiting for the worker", file=sys.stderr)
        return 1
    client = sync_client(settings)
    for run in sorted(runs):
        interrupts.check()
        _print_run(client, settings, run)
    where = "an embedded" if broker.embedded is not None else "the configured"
    print(f"goose-ingest demo: {len(runs)} {_plural(len(runs), 'run')} normalized by a live worker on {where} broker")
    if parts.exporter is not None:
        if not otlp_demo.wait_for_traces(settings, runs, args.timeout):
            print(f"goose-ingest demo: timed out waiting for the traces to reach {args.otlp}", file=sys.stderr)
            return 1
        for run in sorted(runs):
            print(otlp_demo.trace_line(run))
    interrupts.check()
    if parts.archive is not None:
        left = parts.archive.finish(ARCHIVE_FINISH_TIMEOUT_S)
        interrupts.check()
        where = parts.archive.archiver.store.describe()
        print(f"goose-ingest demo: archived the runs' raw log, events and run records to {where}" if left == 0 else
              f"goose-ingest demo: {'some' if left < 0 else left} entries not archived to {where} within "
              f"{ARCHIVE_FINISH_TIMEOUT_S:.0f}s (the embedded broker stops with them)", file=sys.stderr)
    return 0


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"
