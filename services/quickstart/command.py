"""`goose-ingest up` (a broker unless one is configured, plus a worker) and `goose-ingest demo`.

"Embedded" means one thing in goose-ingest: the `redis-server` child process these commands start
when no broker is configured (services/broker/embedded.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.formats import AGENT_FORMATS, DEFAULT_FORMAT
from services.broker.connect import sync_client
from services.broker.url import DEFAULT_PORT as EMBEDDED_DEFAULT_PORT  # Redis's own: the URL users expect
from services.broker.url import redact_url
from services.settings import ConfigError, Settings

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
WORKER_STOP_TIMEOUT_S = 15.0
ARCHIVE_FINISH_TIMEOUT_S = 30.0  # demo: the archive reads what the worker wrote, then writes it on stop


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
    from services.broker.embedded import RedisServerNotFound, start_redis

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
    broker = _broker(settings, args.port, EMBEDDED_DEFAULT_PORT)
    url = broker.settings.redis_url
    if broker.embedded is not None:
        print(f"goose-ingest: embedded redis-server at {url}\n"
              f"  in another shell: export GOOSE_INGEST_REDIS_URL={url}\n"
              f"  then: goose-ingest tap -- goose run --output-format stream-json ...   and   goose-ingest tail",
              file=sys.stderr, flush=True)
    else:
        # An URL exported in this shell (perhaps long ago) wins over the embedded server: say so, once.
        print(f"goose-ingest: using the broker GOOSE_INGEST_REDIS_URL={redact_url(url or '')} from the environment, "
              "no embedded redis-server (unset the variable to start one)", file=sys.stderr, flush=True)
    from services.archive.local import archives_here, start_local_archive  # the log of record (docs/archive.md)

    archive = None
    worker_settings = broker.settings
    try:
        if archives_here(broker.settings, broker.embedded is not None):
            worker_settings, archive = start_local_archive(broker.settings)
        else:
            print("goose-ingest: not archiving (a configured broker may have its own `goose-ingest archive`; "
                  "set GOOSE_INGEST_ARCHIVE_URL to archive from here)", file=sys.stderr, flush=True)
    except BaseException:
        broker.stop()
        raise
    try:
        return asyncio.run(serve_worker(worker_settings))
    except KeyboardInterrupt:
        return 0
    finally:
        if archive is not None:
            archive.stop()
        broker.stop()


def _wait_for_runs(settings: Settings, runs: set[str], timeout: float) -> bool:
    client = sync_client(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = {
            f[b"runId"].decode()
            for stream in settings.layout.runs_partitions()
            for _, f in client.xrange(stream)
            if f[b"state"] in (b"ended", b"abandoned")
        }
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


def run_demo(args: argparse.Namespace) -> int:
    from services.tap.publisher import Publisher

    transcripts = [Transcript(Path(f), None, Path(f).stem) for f in args.files] or default_transcripts()
    if not transcripts:
        raise ConfigError(f"no transcripts given and none in {DEFAULT_FIXTURES}")
    _check_transcripts(transcripts)
    if args.timeout <= 0:
        raise ConfigError("--timeout must be > 0")
    if args.otlp:
        from services.export.otlp import demo as otlp_demo

        otlp_demo.check_endpoint(args.otlp)
    from services.archive.local import archives_here, start_local_archive

    broker = _broker(Settings())
    settings = broker.settings
    archive = None
    if archives_here(settings, broker.embedded is not None):
        try:
            settings, archive = start_local_archive(settings)
        except BaseException:
            broker.stop()
            raise
    env = dict(os.environ, GOOSE_INGEST_REDIS_URL=settings.redis_url or "", GOOSE_INGEST_METRICS_PORT="0",
               GOOSE_INGEST_SHARDS=str(settings.shards), GOOSE_INGEST_ARCHIVE_URL=settings.archive_url or "")
    # The worker's output is log, never the demo's result: its stdout goes to our stderr.
    worker = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "--log-level", "WARNING"], env=env,
                              stdout=sys.stderr.fileno())
    exporter = otlp_demo.start_exporter(settings, args.otlp) if args.otlp else None
    try:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        runs = []
        for transcript in transcripts:
            run = f"demo/{stamp}/{transcript.run_name}"[:200]
            runs.append(run)
            with Publisher(settings, run, {"host": "demo"}, format=transcript.format) as pub:
                for raw in transcript.path.read_bytes().splitlines():
                    pub.add_line(raw, "stdout")
                pub.add_eof(0)
        if not _wait_for_runs(settings, set(runs), args.timeout):
            if worker.poll() is not None:
                print(f"goose-ingest demo: the worker exited with code {worker.returncode}", file=sys.stderr)
            else:
                print("goose-ingest demo: timed out waiting for the worker", file=sys.stderr)
            return 1
        client = sync_client(settings)
        for run in sorted(runs):
            _print_run(client, settings, run)
        where = "an embedded" if broker.embedded is not None else "the configured"
        print(f"goose-ingest demo: {len(runs)} runs normalized by a live worker on {where} broker")
        if exporter is not None:
            if not otlp_demo.wait_for_traces(settings, runs, args.timeout):
                print(f"goose-ingest demo: timed out waiting for the traces to reach {args.otlp}", file=sys.stderr)
                return 1
            for run in sorted(runs):
                print(otlp_demo.trace_line(run))
        if archive is not None:
            left = archive.finish(ARCHIVE_FINISH_TIMEOUT_S)
            where = archive.archiver.store.describe()
            print(f"goose-ingest demo: archived the runs' raw log, events and run records to {where}" if left == 0 else
                  f"goose-ingest demo: {'some' if left < 0 else left} entries not archived to {where} within "
                  f"{ARCHIVE_FINISH_TIMEOUT_S:.0f}s (the embedded broker stops with them)", file=sys.stderr)
        return 0
    finally:
        if archive is not None:
            archive.stop()
        if exporter is not None:
            otlp_demo.stop(exporter)
        worker.terminate()
        try:
            worker.wait(timeout=WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        broker.stop()
