"""The parts of the consumer contract test: a private Redis with the shipped ACL users, the
consumers as real processes under their own users, their targets, and the accounting of what
reached a target (lost = expected but absent, doubled = present more than once).

Design: a consumer is described by a `Consumer` (how to start it, where its group lives, what it
must deliver, how to read its target back); a case (tests/consumers/cases.py) is one function of
(consumer, world) that injects a fault and returns an `Outcome`; the contract
(tests/consumers/test_contract.py) asserts on outcomes. Each case of each consumer gets a redis-server
of its own (its faults: a destroyed group, maxmemory, cannot touch another run's data), so the cases
of the consumers can run side by side in one wall-clock window.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
import psycopg
import redis
from obstore.store import S3Store
from psycopg import sql
from psycopg.conninfo import make_conninfo
from pydantic import SecretStr

from contracts.consumers import BY_COMMAND as ROWS
from contracts.consumers import CONSUMERS as REGISTRY
from contracts.consumers import deadletter_streams
from services.archive.reader import RAW, read_raw
from services.archive.segments import (
    EVENTS_PREFIX,
    RAW_PREFIX,
    RUNS_PREFIX,
    SegmentError,
    decode_event_rows,
    decode_raw_segment,
    decode_run_rows,
)
from services.archive.store import ArchiveStore, parse_store_url
from services.archive.window import Window
from services.broker.acl import ROLE_NAMES, render, user_name
from services.broker.embedded import EmbeddedRedis
from services.export.otlp.mapping import GEN_AI_CONVERSATION_ID, GI_EVENT_ID, OP_INVOKE_AGENT
from services.settings import Settings
from services.tap.publisher import Publisher
from tests.broker.test_acl import ROOT_LINE, ROOT_PASSWORD, ROOT_USER, load_acl, start_acl_server
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.otlp_receiver import Receiver, RunningReceiver
from tests.support.pipeline import ended_runs, events_by_run, expected_events
from tests.support.postgres import ADMIN_DSN
from tests.support.redis_server import cli_env
from tests.support.s3_server import ACCESS_KEY as S3_ACCESS_KEY
from tests.support.s3_server import REGION as S3_REGION
from tests.support.s3_server import SECRET_KEY as S3_SECRET_KEY
from tests.support.s3_server import TEST_BUCKET, S3Server, start_s3

DEFAULTS = Settings.model_fields
CLAIM_IDLE_MS: int = DEFAULTS["claim_idle_ms"].default
MAX_DELIVERIES: int = DEFAULTS["max_deliveries"].default
# The redelivery budget at defaults: an entry whose processing fails is re-claimed every
# CLAIM_IDLE_MS and dead-lettered after MAX_DELIVERIES, so an outage longer than this is the one
# that turns "retry later" into "lost" if a consumer counts outage attempts as deliveries.
REDELIVERY_BUDGET_S = CLAIM_IDLE_MS * MAX_DELIVERIES / 1000
# The target outage of case e (issue 20: "the target down for 10 minutes"; issue 23: "the store down
# for 10 minutes"). It is 4x the redelivery budget, so a consumer that counted outage attempts as
# deliveries would have dead-lettered everything long before the end, and longer than every
# backoff cap and store timeout of the consumers (30 s), so each retries many times into it.
TARGET_OUTAGE_S = 600.0
# Redis at maxmemory (case d): longer than the redelivery budget plus two sweeps and a margin, the
# class of outage that turns "retry later" into "lost"; it runs in the same window as case e, so
# its length costs no wall time as long as it is shorter than TARGET_OUTAGE_S.
REDIS_FULL_S = REDELIVERY_BUDGET_S + 2 * 5.0 + 10.0
ROLES = ROLE_NAMES  # every role of deploy/redis/users.acl gets a password (those unused stay idle)


# ------------------------------------------------------------------------------------ the world
@dataclass
class World:
    """One private redis-server with deploy/redis/users.acl rendered for a namespace of its own."""

    server: EmbeddedRedis
    acl_path: Path
    settings: Settings  # no credentials (a consumer gets its role's in its environment)
    passwords: dict[str, str]
    tmp: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    feeder: subprocess.Popen | None = None  # the worker that writes an exporter's input (ExporterConsumer)
    port_files: dict[int, Path] = field(default_factory=dict)  # pid -> its metrics port file
    feeder_env: dict[str, str] = field(default_factory=dict)  # settings of the feeder worker a consumer asks for
    published: dict[str, int] = field(default_factory=dict)  # run -> raw entries publish() wrote (lines + eof)
    # run -> the normalizer's events of its raw entries, taken before a case trimmed them (the worker's
    # reference is computed from the raw entries as stored: a trimmed head would make it wrong)
    reference: dict[str, list[dict]] = field(default_factory=dict)

    def as_role(self, role: str) -> Settings:
        return self.settings.model_copy(update={"redis_username": user_name(role, self.settings.namespace),
                                                "redis_password": SecretStr(self.passwords[role])})

    @property
    def root_settings(self) -> Settings:
        """The test's own superuser (reads everything, injects the faults no role may)."""
        return self.settings.model_copy(update={"redis_username": ROOT_USER, "redis_password": SecretStr(ROOT_PASSWORD)})

    def root(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, username=ROOT_USER, password=ROOT_PASSWORD, socket_timeout=10)

    def env(self, role: str, **extra: str) -> dict[str, str]:
        credentials = {"GOOSE_INGEST_REDIS_USERNAME": user_name(role, self.settings.namespace),
                       "GOOSE_INGEST_REDIS_PASSWORD": self.passwords[role]}
        env = cli_env(self.settings, **{**credentials, **extra})
        return {k: v for k, v in env.items() if not (k.startswith("OTEL_") and k not in extra)}

    def spawn(self, role: str, args: list[str], log: Path, **extra: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=self.env(role, **extra),
                                stdout=log.open("ab"), stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.server.close()


@contextmanager
def world(tmp: Path) -> Iterator[World]:
    tmp.mkdir(parents=True, exist_ok=True)
    server, acl_path = start_acl_server(tmp)
    settings = Settings(redis_url=server.url, namespace=f"c{uuid.uuid4().hex[:6]}", shards=2,
                        spool_dir=str(tmp / "spool"), host_label="contract-host")
    passwords = {role: f"pw-{role}-{uuid.uuid4().hex[:8]}" for role in ROLES}
    w = World(server, acl_path, settings, passwords, tmp)
    try:
        load_acl(server, acl_path, render(settings.layout, passwords) + ROOT_LINE)
        yield w
    finally:
        w.close()


def stop(proc: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM and wait (SIGKILL after `timeout`); the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.25) -> bool:
    """True once predicate() holds; False at the deadline (the caller reports what was missing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# ------------------------------------------------------------------------------------ input
def runs_of(tag: str, copies: int = 1) -> dict[str, list[str]]:
    """`copies` runs of every goose fixture transcript, named `<tag>/<i>/<stem>`."""
    return {f"{tag}/{i}/{p.stem}": p.read_text("utf-8").splitlines() for i in range(copies) for p in TRANSCRIPTS}


def publish(w: World, runs: dict[str, list[str]]) -> None:
    """Each run into the raw log as the tap's user, ended with an eof."""
    tap = w.as_role("tap")
    # known before they are written: a case may count while a feed runs in the background
    w.published.update({run: len(lines) + 1 for run, lines in runs.items()})  # seqs 0..len(lines): lines, then the eof
    for run, lines in runs.items():
        with Publisher(tap, run, {"host": "contract"}) as pub:
            for line in lines:
                pub.add_line(line)
            pub.add_eof(0)


# ------------------------------------------------------------------------------------ accounting
@dataclass
class Account:
    expected: int
    lost: list[str]
    doubled: dict[str, int]
    details: str = ""

    @property
    def complete(self) -> bool:
        return not self.lost


def account(expected: Counter[str] | set[str], observed: Counter[str], details: str = "") -> Account:
    lost = sorted(k for k in expected if observed[k] == 0)
    doubled = {k: n for k, n in observed.items() if n > 1}
    return Account(len(expected), lost, doubled, details)


def topic_entries(w: World) -> tuple[list[dict], list[dict]]:
    """(events, run records) on the topics, as written (data decoded)."""
    r = w.root()
    layout = w.settings.layout
    return _decoded(r, layout.events_partitions()), _decoded(r, layout.runs_partitions())


def _decoded(r: redis.Redis, streams: list[str]) -> list[dict]:
    """The entries' data documents; a poison entry a case wrote (no JSON object) is not one."""
    out = []
    for s in streams:
        for _, f in r.xrange(s):
            try:
                doc = orjson.loads(f.get(b"data", b""))
            except orjson.JSONDecodeError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("runId"), str):
                out.append(doc)
    return out


def metrics_port(port_file: Path, timeout: float = 60) -> int | None:
    found: list[int] = []

    def read() -> bool:
        try:
            parts = port_file.read_text().split()
        except OSError:
            return False
        if len(parts) == 2 and parts[1].isdigit():
            found.append(int(parts[1]))
            return True
        return False

    return found[-1] if wait_until(read, timeout) else None


def scrape(port: int | None, name: str) -> float | None:
    """One sample of a consumer's /metrics (its full name with labels); None when absent."""
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            for line in reply.read().decode(errors="replace").splitlines():
                if line.startswith(name + " "):
                    return float(line.rsplit(" ", 1)[1])
    except OSError:
        return None
    return None


def readyz(port: int | None) -> tuple[int, str]:
    if port is None:
        return 0, "no metrics port"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace").strip()
    except OSError as exc:
        return 0, f"unreachable: {type(exc).__name__}"


# ------------------------------------------------------------------------------------ consumers
@dataclass
class Target:
    """What a consumer writes into, live for one case."""

    receiver: RunningReceiver | None = None
    dsn: str = ""
    drop: Callable[[], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rx(self) -> Receiver:
        assert self.receiver is not None
        return self.receiver.receiver


def topic_units(w: World, runs: set[str]) -> Counter[str]:
    """What a sink of the topics owes for `runs`: each event by eventId, each run record by recordId."""
    events, records = topic_entries(w)
    expected: Counter[str] = Counter()
    expected.update(e["eventId"] for e in events if e["runId"] in runs)
    expected.update(f"record:{r['recordId']}" for r in records if r["runId"] in runs)
    return expected


class Consumer:
    """One consumer under the contract. Subclasses say how it runs, what it owes and where it lands."""

    name: str
    # Why the rollback case may take its snapshot between batches rather than with one read and not
    # acknowledged ("" = it must be mid-batch). Its input is in Redis whole before the consumer starts,
    # so a sink that holds each batch for about a millisecond is met mid-batch only by chance (one
    # run in three missed on a loaded machine). What a mid-batch snapshot tests, a batch written and
    # then delivered again, is held for such a sink by killed_mid_batch (input arriving throughout).
    brief_batches: ClassVar[str] = ""
    role: str
    args: list[str]
    exporter: str = ""  # its name in key names and ACL roles (services/broker/acl.py EXPORTERS)
    # A stable consumer name by default (re-reads its own pending entries after a restart): case b
    # gives its two processes two names, so the second must take the entries over.
    stable_name: ClassVar[bool] = False
    # Cases that cannot apply to this consumer, each with the reason (the contract does not collect
    # their tests: tests/consumers/test_contract.py ConsumerContract.applies).
    not_applicable: ClassVar[dict[str, str]] = {}
    # Case d: Redis's limit is what it uses with the input loaded plus this many bytes.
    full_headroom: int = 64 * 1024
    # Case e: /readyz must say "not ready" from this many seconds into the target's outage (a first
    # attempt has to meet the outage and fail; the backoff may take a few seconds).
    outage_noticed_s: float = 20.0
    # The metric in which this consumer counts raw entries Redis lost after it had them (a rollback):
    # only the archive holds such entries, so only it can count them (docs/consumers.md).
    broker_lost_metric: str = ""

    def group(self, s: Settings) -> str:
        """Its group: the setting its row of contracts/consumers.py names."""
        return str(getattr(s, ROWS[self.name].group_setting))

    def group_streams(self, w: World) -> list[str]:
        """The streams this consumer's group reads."""
        layout = w.settings.layout
        return layout.events_partitions() + layout.runs_partitions()

    def deadletter_streams(self, w: World) -> list[str]:
        return deadletter_streams(ROWS[self.name], w.settings.layout)

    def foreign_deadletter_streams(self, w: World) -> list[str]:
        own = set(self.deadletter_streams(w))
        return [s for row in REGISTRY for s in deadletter_streams(row, w.settings.layout) if s not in own]

    @contextmanager
    def target(self, w: World) -> Iterator[Target]:
        yield Target()

    def env(self, w: World, t: Target, port_file: Path) -> dict[str, str]:
        return {"GOOSE_INGEST_METRICS_PORT": "0", "GOOSE_INGEST_METRICS_PORT_FILE": str(port_file)}

    def start(self, w: World, t: Target, tag: str, *args: str, **extra: str) -> tuple[subprocess.Popen, Path]:
        port_file = w.tmp / f"{tag}.port"
        log = w.tmp / f"{tag}.log"
        env = {**self.env(w, t, port_file), **extra}
        proc = w.spawn(self.role, [*self.args, *args], log, **env)
        w.port_files[proc.pid] = port_file
        return proc, port_file

    def feed(self, w: World, runs: dict[str, list[str]]) -> None:
        """Put runs where this consumer reads them."""
        raise NotImplementedError

    def before_trim(self, w: World, runs: set[str]) -> None:
        """A case is about to trim the head of this consumer's input: keep what the accounting needs."""

    def fed(self, w: World, runs: set[str]) -> bool:
        """Whether what feed() put in place is all readable by this consumer."""
        return True

    def owed_after_rollback(self, runs: set[str], held: set[str]) -> set[str]:
        """The runs this consumer must deliver once after Redis came back from an older snapshot
        (`held`: those whose raw entries Redis still holds). A consumer of what Redis holds cannot
        promise what Redis lost: the entries written after the snapshot are gone, and with them the
        topic entries and state written for them (docs/consumers.md "The broker's own faults")."""
        return held

    def poison(self, w: World, t: Target, tag: str) -> str:
        """Put one poison entry among the input of runs `<tag>/...`; its key in a dead letter (a run
        it names is left out of what the target owes)."""
        raise NotImplementedError

    def account(self, w: World, t: Target, runs: set[str]) -> Account:
        raise NotImplementedError

    def sent_some(self, t: Target) -> bool:
        """A cheap sign that the target got something (when a case kills mid-batch)."""
        return True

    def at_kill(self, w: World, t: Target, runs: set[str]) -> dict[str, Any]:
        """Facts read right after a SIGKILL, while nothing moves (a consumer that needs them)."""
        return {}

    def at_snapshot(self, w: World, t: Target, runs: set[str]) -> dict[str, Any]:
        """Facts read while the consumer is frozen and Redis takes the snapshot a rollback returns to."""
        return {}

    def copies(self, t: Target) -> dict[str, Any]:
        """The units the target holds more than once, with what tells the copies apart (OTLP: the
        spans' ids); empty where the target cannot hold a copy."""
        return {}

    def outage_facts(self, w: World, t: Target, before: set[str], during: set[str]) -> dict[str, Any]:
        """Case e, at the end of the target's outage (still down): what this consumer's contract
        checks then, beside readiness. `before`: runs delivered before the outage; `during`: fed in it."""
        return {}


class WorkerConsumer(Consumer):
    """`worker`: raw log -> topics. Its target is the topics, compared with one normalizer pass over
    the raw entries as stored (the golden test's expectation, tests/core/test_golden.py)."""

    name = "worker"
    role = "worker"
    args = ["worker"]
    # Its only target is Redis, whose outage is case d (redis_full).
    not_applicable: ClassVar[dict[str, str]] = {"target_down": "no external target: the worker writes into Redis (its outage is redis_full)",
                      "slow_target": "no external target: the worker writes into Redis"}

    def group_streams(self, w: World) -> list[str]:
        return w.settings.layout.raw_streams()

    def feed(self, w: World, runs: dict[str, list[str]]) -> None:
        publish(w, runs)

    def before_trim(self, w: World, runs: set[str]) -> None:
        w.reference.update({run: expected_events(w.root_settings, run) for run in runs})

    def poison(self, w: World, t: Target, tag: str) -> str:
        # a raw entry whose seq is no number: the sequencer cannot place it (tests/worker/test_poison_batches.py)
        w.root().xadd(w.settings.layout.raw_stream(0), {"run": "poison/raw", "seq": "--5", "ts": "1", "line": "x"})
        return "poison/raw"

    def account(self, w: World, t: Target, runs: set[str]) -> Account:
        s = w.root_settings
        published = events_by_run(s)
        expected: Counter[str] = Counter()
        observed: Counter[str] = Counter()
        wrong = []
        for run in sorted(runs):
            want = w.reference[run] if run in w.reference else expected_events(s, run)
            got = published.get(run, [])
            expected.update(e["eventId"] for e in want)
            observed.update(e["eventId"] for e in got)
            if got != want and len(got) >= len(want):
                wrong.append(run)
        ended = ended_runs(s)
        for run in runs:  # the run's end record counts as one unit of its output
            expected[f"{run}#ended"] += 1
            if run in ended:
                observed[f"{run}#ended"] += 1
        return account(expected, observed, f"runs differing from the normalizer's events: {wrong}" if wrong else "")


class ExporterConsumer(Consumer):
    """An exporter reads the topics a worker wrote; `feed` runs a feeder worker (under the worker's
    user, default settings) until the runs ended, so the exporter sees the worker's real output."""

    def feed(self, w: World, runs: dict[str, list[str]]) -> None:
        publish(w, runs)
        if w.feeder is None or w.feeder.poll() is not None:
            w.feeder = w.spawn("worker", ["worker"], w.tmp / "feeder-worker.log", GOOSE_INGEST_METRICS_PORT="0",
                               **w.feeder_env)

    def fed(self, w: World, runs: set[str]) -> bool:
        return runs <= ended_runs(w.root_settings)

    def wait_fed(self, w: World, runs: set[str], timeout: float = 120) -> None:
        if not wait_until(lambda: self.fed(w, runs), timeout):
            raise AssertionError(f"the feeder worker did not end {sorted(runs - ended_runs(w.root_settings))[:5]}")

    def expected_units(self, w: World, runs: set[str]) -> Counter[str]:
        raise NotImplementedError


class OtlpConsumer(ExporterConsumer):
    """`export otlp` -> a real OTLP/HTTP receiver (tests/support/otlp_receiver.py). Units: one root
    span per ended run, one tool span per tool event, one span event of the root per other event."""

    name = "export otlp"
    role = "otlp-exporter"
    exporter = "otlp"
    args = ["export", "otlp"]

    @contextmanager
    def target(self, w: World) -> Iterator[Target]:
        rx = RunningReceiver()
        t = Target(receiver=rx)
        try:
            yield t
        finally:
            t.receiver.close()  # type: ignore[union-attr] (a case may have replaced it)

    def env(self, w: World, t: Target, port_file: Path) -> dict[str, str]:
        return {**super().env(w, t, port_file), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": t.rx.endpoint}

    def poison(self, w: World, t: Target, tag: str) -> str:
        # The collector refuses the content of one run (HTTP 400 on a well-formed request, its
        # validation): the only rejection that is permanent. An undecodable event is no poison
        # here: the exporter keeps it as an "unmappable" span event of its root (docs/otel.md).
        run = f"{tag}/0/{TRANSCRIPTS[0].stem}"
        t.rx.reject_runs.add(run)
        return run

    def sent_some(self, t: Target) -> bool:
        return t.rx.requests > 0

    def at_kill(self, w: World, t: Target, runs: set[str]) -> dict[str, Any]:
        """The OTLP delivery window at the kill: what the collector had accepted that the exporter's
        run state did not yet count as sent. Only these may be sent again after a restart
        (docs/otel.md "Ids"): OTLP has no idempotent write, so a span accepted just before the kill
        cannot be known to be out.

        - a tool span: its event not yet seen in the state ("s:<seq>"/"t:<seq>" marks, the "w"
          watermark, or the run done);
        - a root: its run not yet closed ("done"), with the span events it carries (the account
          counts a root's span events by event id, so a repeated root repeats them).

        Read while the process is dead (its state cannot change), after the receiver has answered
        whatever the killed process had already written to its socket: those spans are accepted
        too, after the kill (a snapshot taken before would miss them)."""
        quiet = t.rx.settle(quiet_s=2.0)
        with t.rx.lock:
            spans = list(t.rx.spans)
        tools = {str(s.attributes.get(GI_EVENT_ID)) for s in spans
                 if not s.name.startswith(OP_INVOKE_AGENT) and GI_EVENT_ID in s.attributes}
        roots = {str(s.attributes.get(GEN_AI_CONVERSATION_ID)): [str(a[GI_EVENT_ID]) for _, a in s.events if GI_EVENT_ID in a]
                 for s in spans if s.name.startswith(OP_INVOKE_AGENT)}
        r = w.root()
        window: set[str] = set()
        for run in runs:
            state = r.hgetall(w.settings.layout.export_group_state("otlp", self.group(w.settings), run))
            if b"done" in state:
                continue  # closed: everything of it is counted as sent
            if run in roots:
                window |= {f"root:{run}", *roots[run]}
            mark = int(state.get(b"w") or 0)
            for event_id in tools:
                head, _, seq = event_id.rpartition(":")
                if head == run and seq.isdigit() and not (int(seq) < mark or f"s:{seq}".encode() in state
                                                           or f"t:{seq}".encode() in state):
                    window.add(event_id)
        return {"accepted_not_noted": sorted(window), "accepted_at_kill": len(spans), "receiver_quiet": quiet}

    def account(self, w: World, t: Target, runs: set[str]) -> Account:
        events, records = topic_entries(w)
        expected: Counter[str] = Counter()
        for e in events:
            if e["runId"] in runs:
                expected[e["eventId"]] += 1
        for r in records:
            if r["runId"] in runs and r.get("state") in ("ended", "abandoned"):
                expected[f"root:{r['runId']}"] += 1
        observed = Counter({unit: len(ids) for unit, ids in self.received(t).items()})
        return account(expected, observed)

    def received(self, t: Target) -> dict[str, list[tuple[str, str]]]:
        """unit -> the (trace id, span id) of every span that carried it (a root's span events are
        carried by the root)."""
        out: dict[str, list[tuple[str, str]]] = {}
        with t.rx.lock:
            spans = list(t.rx.spans)
        for span in spans:
            ids = (span.trace_id, span.span_id)
            if span.name.startswith(OP_INVOKE_AGENT):
                units = [f"root:{span.attributes.get(GEN_AI_CONVERSATION_ID)}"]
                units += [str(attrs.get(GI_EVENT_ID)) for _, attrs in span.events if GI_EVENT_ID in attrs]
            else:
                units = [str(span.attributes.get(GI_EVENT_ID))]
            for unit in units:
                out.setdefault(unit, []).append(ids)
        return out

    def at_snapshot(self, w: World, t: Target, runs: set[str]) -> dict[str, Any]:
        """The delivery window when Redis took the snapshot (the exporter frozen): what a rollback
        to it may have sent again (see at_kill), and what the collector had by then."""
        return {**self.at_kill(w, t, runs), "received_at_snapshot": sorted(self.received(t))}

    def copies(self, t: Target) -> dict[str, list[tuple[str, str]]]:
        return {unit: ids for unit, ids in self.received(t).items() if len(ids) > 1}


class PostgresConsumer(ExporterConsumer):
    """`export postgres` -> a real PostgreSQL (a database of its own per case on the server of
    tests/support/postgres.py, or a private cluster a case stops). Units: event rows by eventId,
    run-record rows by recordId."""

    name = "export postgres"
    role = "postgres-exporter"
    exporter = "postgres"
    stable_name = True
    args = ["export", "postgres"]

    @contextmanager
    def target(self, w: World) -> Iterator[Target]:
        name = f"goose_contract_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield Target(dsn=make_conninfo(ADMIN_DSN, dbname=name, connect_timeout="5"))
        finally:
            with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def env(self, w: World, t: Target, port_file: Path) -> dict[str, str]:
        return {**super().env(w, t, port_file), "GOOSE_INGEST_POSTGRES_DSN": t.dsn}

    def poison(self, w: World, t: Target, tag: str) -> str:
        # PostgreSQL refuses a NUL in text (22P05): a data error, the sink's own content rejection
        layout = w.settings.layout
        doc = {"eventId": "poison/pg:0", "runId": "poison/pg", "seq": 0, "type": "agent",
               "timestamp": "2026-11-30T10:00:00.000Z", "lines": [0, 0], "message": "nul \u0000 here"}
        w.root().xadd(layout.events_partition(layout.shard_of("poison/pg")),
                      {"eventId": "poison/pg:0", "runId": "poison/pg", "seq": "0", "type": "agent", "data": orjson.dumps(doc)})
        return "poison/pg:0"

    def account(self, w: World, t: Target, runs: set[str]) -> Account:
        expected = topic_units(w, runs)
        observed: Counter[str] = Counter()
        dsn = t.extra.get("read_dsn", t.dsn)
        try:
            with psycopg.connect(dsn, connect_timeout=5) as conn:
                for (event_id, run) in conn.execute("SELECT event_id, run_key FROM events").fetchall():
                    if run in runs:
                        observed[event_id] += 1
                for (record_id, run) in conn.execute("SELECT record_id, run_key FROM run_records").fetchall():
                    if run in runs:
                        observed[f"record:{record_id}"] += 1
        except psycopg.Error as exc:  # not migrated yet, or the case has the database down
            return account(expected, observed, f"database unreadable: {type(exc).__name__}")
        return account(expected, observed)


class ArchiveConsumer(ExporterConsumer):
    """`archive` -> the S3 API on loopback (moto's server, tests/support/s3_server.py; a private one per
    case, so pausing it stops only this case's store). It reads the raw shards and control streams
    (the log of record) and the topics (the event lake), so `feed` publishes raw entries and runs the
    feeder worker for the topics; that worker has ARCHIVE_URL set, as in a deployment, and a raw
    retention of 0.36 s, so its trim (every RETENTION_EVERY_S = 60 s) runs in every case and may
    remove whatever the archive's position allows: an entry trimmed before it was archived is then
    missing from the archive for good (counted lost).

    Units: every raw entry published (run, seq; lines and eof) read back from the archive with the
    project's reader (services/archive/reader.py read_raw, every segment), plus every event and run
    record the worker published on the topics, read back from the event lake. Doubled: a raw entry
    (shard, stream id) in two segments, an eventId or recordId in two lake rows."""

    name = "archive"
    role = "archive"
    args = ["archive"]
    stable_name = True
    not_applicable: ClassVar[dict[str, str]] = {"poison": (
        "no entry is poison for the archive: a raw or control entry is stored byte-exact whatever its fields "
        "(services/archive/segments.py: every field kept as bytes, the convenience columns null when not "
        "parseable), and a topic entry the PostgreSQL sink would dead-letter is left out of the event lake and "
        "counted (goose_ingest_archive_lake_rejected_total) while its raw source is archived; the archive has "
        "no dead-letter stream, and its ACL user may not XADD")}
    # The store's requests time out after ARCHIVE_STORE_TIMEOUT_S (30 s at defaults) when the store
    # hangs (moto stopped: connections accepted, never answered); only then does the archive know.
    outage_noticed_s = float(DEFAULTS["archive_store_timeout_s"].default) + 15.0
    broker_lost_metric = 'goose_ingest_archive_broker_lost_entries_total{dataset="raw"}'
    # The one setting shortened: a segment is cut ARCHIVE_SEGMENT_MAX_AGE_S after its first entry was
    # read (300 s at defaults, the small-file trade-off of docs/archive.md). At the default every case
    # would wait 5 minutes per segment; 2 s cuts many segments in each case, so the faults meet
    # segments open, written and being acknowledged. Count and byte cuts, store timeout, backoff and
    # the consumer name stay at their defaults.
    SEGMENT_MAX_AGE_S = "2"

    def group_streams(self, w: World) -> list[str]:
        layout = w.settings.layout
        return [*layout.raw_streams(), *layout.control_streams(), *layout.events_partitions(), *layout.runs_partitions()]

    @contextmanager
    def target(self, w: World) -> Iterator[Target]:
        server = start_s3(w.tmp / "moto")
        try:
            server.create_bucket(TEST_BUCKET)
            url = f"s3://{TEST_BUCKET}/contract"
            t = Target(extra={"s3": server, "url": url, "endpoint": server.endpoint})
            # exact trims (one entry per stream node): XTRIM MINID ~ removes whole nodes only, and a
            # node of the default 100 entries would hide whether the trim may remove an entry at all
            w.root().config_set("stream-node-max-entries", 1)
            w.feeder_env = {"GOOSE_INGEST_ARCHIVE_URL": url, "GOOSE_INGEST_RAW_RETENTION_HOURS": "0.0001"}
            yield t
        finally:
            server.close()

    def env(self, w: World, t: Target, port_file: Path) -> dict[str, str]:
        s3: S3Server = t.extra["s3"]
        return {**super().env(w, t, port_file), **s3.env(AWS_ENDPOINT_URL=t.extra["endpoint"]),
                "GOOSE_INGEST_ARCHIVE_URL": t.extra["url"], "GOOSE_INGEST_ARCHIVE_SEGMENT_MAX_AGE_S": self.SEGMENT_MAX_AGE_S}

    def store(self, t: Target) -> ArchiveStore:
        """The test's reader of the store: the project's ArchiveStore, straight to moto (not through
        a case's proxy). Its S3 client is built here with the credentials in its config: open_store
        lets obstore read them from this process's environment, which the test leaves alone (every
        consumer's subprocess inherits it)."""
        s3: S3Server = t.extra["s3"]
        url = parse_store_url(t.extra["url"])
        client = S3Store(url.location, prefix=url.prefix or None, config={
            "endpoint": s3.endpoint, "region": S3_REGION, "access_key_id": S3_ACCESS_KEY,
            "secret_access_key": S3_SECRET_KEY}, client_options={"allow_http": True})
        return ArchiveStore(url, client)

    def sent_some(self, t: Target) -> bool:
        return bool(self.store(t).list(f"{RAW_PREFIX}/"))

    def owed_after_rollback(self, runs: set[str], held: set[str]) -> set[str]:
        return runs  # the log of record: what it archived before Redis lost it stays archived

    def account(self, w: World, t: Target, runs: set[str]) -> Account:
        store = self.store(t)
        expected: Counter[str] = Counter()
        for run in runs:
            expected.update(f"raw:{run}#{seq}" for seq in range(w.published[run]))
        events, records = topic_entries(w)
        expected.update(e["eventId"] for e in events if e["runId"] in runs)
        expected.update(f"record:{r['recordId']}" for r in records if r["runId"] in runs)
        observed: Counter[str] = Counter()
        identities: Counter[str] = Counter()
        archived = read_raw(store, Window())  # the reader's view: each stream entry once (issue 32)
        for e in archived.entries:
            run = e.fields.get(b"run", b"").decode(errors="replace")
            if e.stream == RAW and run in runs:
                observed[f"raw:{run}#{e.fields.get(b'seq', b'').decode(errors='replace')}"] += 1
        # doubled is counted per object, stricter than the reader: an entry the archive wrote into
        # two objects is a double even though every reader keeps one copy
        for key in store.list(f"{RAW_PREFIX}/"):
            try:
                entries = decode_raw_segment(store.get(key))
            except SegmentError:
                continue  # named by read_raw as corrupt
            for a in entries:
                if a.stream == RAW and a.fields.get(b"run", b"").decode(errors="replace") in runs:
                    identities[f"{a.stream}/{a.shard}/{a.id}"] += 1
        for key in store.list(f"{EVENTS_PREFIX}/"):
            observed.update(row["event_id"] for row in decode_event_rows(store.get(key)) if row["run_key"] in runs)
        for key in store.list(f"{RUNS_PREFIX}/"):
            observed.update(f"record:{row['record_id']}" for row in decode_run_rows(store.get(key)) if row["run_key"] in runs)
        acct = account(expected, observed, f"corrupt objects: {archived.corrupt}" if archived.corrupt else "")
        # a raw entry is doubled when one stream entry is in two segments (two entries of one run
        # and seq are the tap's re-send, which the archive must keep both of: the log as written)
        acct.doubled = {k: n for k, n in acct.doubled.items() if not k.startswith("raw:")}
        acct.doubled.update({k: n for k, n in identities.items() if n > 1})
        return acct

    def outage_facts(self, w: World, t: Target, before: set[str], during: set[str]) -> dict[str, Any]:
        """The raw trim never removed what is not archived: every raw entry of the runs fed during
        the outage (the store down: none of them can be archived) is still in Redis after the
        workers' trim ran through it, while the runs archived before it were trimmed (the trim was
        active, so the first check is not vacuous)."""
        r = w.root()
        held: Counter[str] = Counter()
        for stream in w.settings.layout.raw_streams():
            for _, f in r.xrange(stream):
                held[f"{f.get(b'run', b'').decode(errors='replace')}#{f.get(b'seq', b'').decode(errors='replace')}"] += 1
        unarchived = [f"{run}#{seq}" for run in sorted(during) for seq in range(w.published[run])]
        archived_before = [f"{run}#{seq}" for run in sorted(before) for seq in range(w.published[run])]
        return {"unarchived_missing_from_redis": [k for k in unarchived if not held[k]],
                "unarchived_count": len(unarchived),
                "archived_before_still_in_redis": sum(1 for k in archived_before if held[k]),
                "archived_before_count": len(archived_before)}


class JsonlConsumer(ExporterConsumer):
    """`export jsonl` -> a directory of JSON-lines files (docs/consumers.md "Adding a sink"). Units:
    event lines by eventId, run-record lines by recordId. Its target down: the directory gone
    (renamed away, as an unmounted volume) for the outage, then back."""

    name = "export jsonl"
    role = "jsonl-exporter"
    brief_batches = "a batch is appended to a local file and acknowledged within about a millisecond"
    exporter = "jsonl"
    args = ["export", "jsonl"]
    stable_name = True
    not_applicable: ClassVar[dict[str, str]] = {"slow_target": (
        "a local directory answers no requests: there is no request latency to add (a slow disk delays the "
        "fsync of a batch that is held, which case e's outage covers at its extreme)")}
    # Case d: it reads and acknowledges, which Redis allows at maxmemory; its one refusable write
    # besides its dead letters is its group's creation (XGROUP CREATE, denyoom), and one process with
    # one connection stays within 64 KiB: it starts into a Redis already at its limit, so the
    # creation is refused for the whole case and retried, never counted as a delivery.
    full_headroom = 0

    @contextmanager
    def target(self, w: World) -> Iterator[Target]:
        yield Target(extra={"dir": w.tmp / f"jsonl-{uuid.uuid4().hex[:6]}"})

    def env(self, w: World, t: Target, port_file: Path) -> dict[str, str]:
        return {**super().env(w, t, port_file), "GOOSE_INGEST_JSONL_DIR": str(t.extra["dir"])}

    def poison(self, w: World, t: Target, tag: str) -> str:
        layout = w.settings.layout  # an event entry whose data is no JSON: nothing to write a line of
        w.root().xadd(layout.events_partition(layout.shard_of("poison/jsonl")),
                      {"eventId": "poison/jsonl:0", "runId": "poison/jsonl", "seq": "0", "type": "agent", "data": "{nope"})
        return "poison/jsonl:0"

    def lines(self, t: Target) -> list[dict]:
        out = []
        for path in sorted(Path(t.extra["dir"]).glob("*/*.jsonl")):
            out += [orjson.loads(line) for line in path.read_bytes().splitlines() if line.endswith(b"}")]
        return out

    def sent_some(self, t: Target) -> bool:
        return any(p.stat().st_size for p in Path(t.extra["dir"]).glob("*/*.jsonl"))

    def account(self, w: World, t: Target, runs: set[str]) -> Account:
        expected = topic_units(w, runs)
        observed: Counter[str] = Counter()
        for line in self.lines(t):
            doc = line["data"]
            if doc.get("runId") in runs:
                observed[doc["eventId"] if line["topic"] == "events" else f"record:{doc['recordId']}"] += 1
        return account(expected, observed)


CONSUMERS: dict[str, Consumer] = {c.name: c for c in (WorkerConsumer(), OtlpConsumer(), PostgresConsumer(),
                                                      ArchiveConsumer(), JsonlConsumer())}


def log_problems(path: Path) -> list[str]:
    """Lines of a consumer's log that show a crash (a traceback) or a refused permission."""
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    return [line for line in text.splitlines() if "Traceback" in line or "NOPERM" in line][:5]


def background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test that asked
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box

