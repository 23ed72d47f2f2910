"""The contract's cases: each injects one fault into one consumer's world and reports an `Outcome`
(what reached the target, what was dead-lettered where, what /readyz said, how processes ended).
They assert nothing themselves: tests/consumers/test_contract.py does, per consumer, so the cases of
the consumers can share one wall-clock window (tests/consumers/conftest.py runs them side by
side)."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.consumers.harness import (
    MAX_DELIVERIES,
    REDIS_FULL_S,
    TARGET_OUTAGE_S,
    Account,
    Consumer,
    ExporterConsumer,
    Target,
    World,
    background,
    kill,
    log_problems,
    metrics_port,
    readyz,
    runs_of,
    scrape,
    stop,
    wait_until,
    world,
)

# The outages' lengths are harness.TARGET_OUTAGE_S (the target down: 10 minutes, issues 20 and 23)
# and harness.REDIS_FULL_S (Redis at maxmemory: the redelivery budget CLAIM_IDLE_MS x MAX_DELIVERIES
# = 150 s at defaults, plus two sweeps and a margin). Both run in one wall-clock window
# (tests/consumers/conftest.py WINDOWS), so the folder's wall time is about the 10 minutes once.
# For working on a case only (the contract's assertions then fail on `outage_s`): both shorter.
_DEV_OUTAGE_S = os.environ.get("GOOSE_CONTRACT_OUTAGE_S")
TARGET_DOWN_S = float(_DEV_OUTAGE_S) if _DEV_OUTAGE_S else TARGET_OUTAGE_S
FULL_S = float(_DEV_OUTAGE_S) if _DEV_OUTAGE_S else REDIS_FULL_S
DELIVER_TIMEOUT_S = 150.0  # after a fault is over, the time to deliver what is left (a reclaim is 30 s)
SETTLE_S = 3.0  # after everything arrived: a late duplicate would arrive now
# pytest-timeout for a test that waits for the outages' window (the project's default, 300 s, is
# shorter than the target's outage): the first delivery, the outage, readiness back, the rest
# delivered (each wait bounded by DELIVER_TIMEOUT_S), the processes stopped, and a margin.
WINDOW_TIMEOUT_S = TARGET_DOWN_S + 3 * DELIVER_TIMEOUT_S + 300.0


@dataclass
class Outcome:
    account: Account
    own_deadletters: list[dict[str, str]] = field(default_factory=list)
    foreign_deadletters: list[dict[str, str]] = field(default_factory=list)
    exited: list[int | None] = field(default_factory=list)  # returncodes of processes that stopped on their own
    stopped: list[int] = field(default_factory=list)  # returncodes after our SIGTERM at the end
    problems: list[str] = field(default_factory=list)  # tracebacks / NOPERM lines in the logs
    facts: dict[str, Any] = field(default_factory=dict)


def _dead(w: World, streams: list[str]) -> list[dict[str, str]]:
    r = w.root()
    out = []
    for s in streams:
        for _, f in r.xrange(s):
            out.append({k.decode(): v.decode(errors="replace") for k, v in f.items()})
    return out


def _finish(c: Consumer, w: World, t: Target, runs: set[str], procs: list, logs: list[Path], **facts: Any) -> Outcome:
    """Wait for everything to arrive, let duplicates show, stop the processes, report."""
    wait_until(lambda: c.account(w, t, runs).complete and _pending(w, c) == 0, DELIVER_TIMEOUT_S, interval=0.5)
    # every live process through its start-up (ready) before it is stopped: a case whose input was
    # all delivered by a killed predecessor must not stop its successor while it still imports
    for p in procs:
        port_file = w.port_files.get(p.pid)
        if port_file is not None and p.poll() is None:
            port = metrics_port(port_file, timeout=60)
            wait_until(lambda port=port, p=p: readyz(port)[0] == 200 or p.poll() is not None, 60)
    time.sleep(SETTLE_S)
    acct = c.account(w, t, runs)
    facts["pending_at_end"] = _pending(w, c)
    exited = [p.returncode for p in procs if p.poll() is not None]
    stopped = [stop(p) for p in procs if p.poll() is None]
    problems = [line for log in logs for line in log_problems(log)]
    return Outcome(acct, _dead(w, c.deadletter_streams(w)), _dead(w, c.foreign_deadletter_streams(w)), exited,
                   stopped, problems, facts)


def _log(w: World, tag: str) -> Path:
    return w.tmp / f"{tag}.log"


def _pending(w: World, c: Consumer) -> int:
    r = w.root()
    total = 0
    for s in c.group_streams(w):
        try:
            total += int(r.xpending(s, c.group(w.settings))["pending"])
        except Exception:  # noqa: BLE001 - no group yet
            pass
    return total


def _feed(c: Consumer, w: World, runs: dict[str, list[str]]) -> set[str]:
    c.feed(w, runs)
    if isinstance(c, ExporterConsumer):
        c.wait_fed(w, set(runs))
    return set(runs)


# ------------------------------------------------------------------------------------ a
def lost_group(c: Consumer, tmp: Path) -> Outcome:
    """The consumer's group destroyed on every stream it reads while it runs (an operator's
    XGROUP DESTROY, a FLUSH): recreated at 0, and what came before and after all delivered once."""
    with world(tmp) as w, c.target(w) as t:
        runs = _feed(c, w, runs_of("lost-a"))
        proc, _ = c.start(w, t, "a")
        first = wait_until(lambda: c.account(w, t, runs).complete, DELIVER_TIMEOUT_S)
        r = w.root()
        destroyed = sum(r.xgroup_destroy(s, c.group(w.settings)) for s in c.group_streams(w))
        runs |= _feed(c, w, runs_of("lost-b"))
        recreated = wait_until(lambda: all(
            any(g["name"].decode() == c.group(w.settings) for g in r.xinfo_groups(s)) for s in c.group_streams(w)), 60)
        return _finish(c, w, t, runs, [proc], [_log(w, "a")], first_delivered=first, destroyed=destroyed,
                       recreated=recreated)


# ------------------------------------------------------------------------------------ b, g
def _kill_and_restart(c: Consumer, tmp: Path, tag: str, when: Callable[[Consumer, World, Target, set[str]], bool],
                      second_args: tuple[str, ...], first_args: tuple[str, ...] = ()) -> Outcome:
    with world(tmp) as w, c.target(w) as t:
        # The input arrives while the consumer runs (one batch after another), so a batch is read
        # and not yet acknowledged many times over, whatever the machine's speed.
        first, _ = c.start(w, t, f"{tag}-1", *first_args)
        metrics_port(w.port_files[first.pid])
        batch = runs_of(f"{tag}-x", copies=4)
        runs = set(batch)
        feeding, fed = background(lambda: _feed(c, w, batch))
        caught, pending = _freeze_when(first, lambda: when(c, w, t, runs), lambda: _pending(w, c))
        kill(first)
        at_kill = c.at_kill(w, t, runs)  # the target and the consumer's state, frozen by the kill
        delivered_before = c.account(w, t, runs).expected - len(c.account(w, t, runs).lost)
        feeding.join()
        if "error" in fed:
            raise fed["error"]
        second, _ = c.start(w, t, f"{tag}-2", *second_args)
        out = _finish(c, w, t, runs, [second], [_log(w, f"{tag}-1"), _log(w, f"{tag}-2")],
                      caught=caught, pending_at_kill=pending, delivered_before_kill=delivered_before, **at_kill)
        return out


def _freeze_when(proc: Any, when: Callable[[], bool], pending: Callable[[], int],
                 timeout: float = 90) -> tuple[bool, int]:
    """Stop `proc` (SIGSTOP) at short random intervals and look while it is stopped: kept stopped
    the first time entries are pending and `when` holds, else let go on (SIGCONT). A stopped process
    acks nothing, so what is pending at the kill that follows is what was seen here. Looking while
    it is stopped, not before stopping it, catches a sink whose batch is held for a millisecond (the
    JSON-lines sink: appending a batch to a file): the older way, a look and then a stop that had to
    find the same state, missed it for 90 s on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        os.kill(proc.pid, signal.SIGSTOP)
        _wait_stopped(proc.pid)
        seen = pending()
        if seen > 0 and when():
            return True, seen
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(random.uniform(0.0, 0.003))  # a batch held for a millisecond is met about every other time
    return False, pending()


def _wait_stopped(pid: int, timeout: float = 1.0) -> None:
    """Until the kernel has stopped `pid` (state T): SIGSTOP is delivered asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return  # gone, or no /proc: the caller sees what it sees
        if state in ("T", "t"):
            return
        time.sleep(0.0005)


def _has_pending(c: Consumer, w: World, t: Target, runs: set[str]) -> bool:
    return _pending(w, c) > 0


def _mid_batch(c: Consumer, w: World, t: Target, runs: set[str]) -> bool:
    return c.sent_some(t) and _pending(w, c) > 0


def dead_consumer(c: Consumer, tmp: Path) -> Outcome:
    """A consumer SIGKILLed with entries pending; another consumer (another name) reclaims them
    after CLAIM_IDLE_MS (30 s at defaults). The PostgreSQL sink and the archive keep a stable name
    by default (a restart re-reads its own entries at once): they are given two names here, so the
    successor must take the entries over (the worker and the OTLP exporter are unique per process)."""
    names = ((("--consumer", "contract-first"), ("--consumer", "contract-second"))
             if c.stable_name else ((), ()))
    return _kill_and_restart(c, tmp, "b", _has_pending, names[1], names[0])


def killed_mid_batch(c: Consumer, tmp: Path) -> Outcome:
    """SIGKILL with a batch read and not acknowledged (the OTLP exporter: after its first request
    reached the collector, so a batch is between the collector's acceptance and the ack), then
    the same command again (the PostgreSQL sink keeps its default consumer name, so it re-reads
    its own pending entries at once; the worker and the OTLP exporter reclaim them after
    CLAIM_IDLE_MS, 30 s at defaults)."""
    return _kill_and_restart(c, tmp, "g", _mid_batch, ())


# ------------------------------------------------------------------------------------ c
def poison(c: Consumer, tmp: Path) -> Outcome:
    """One poison entry among good runs: dead-lettered with a reason in the consumer's own
    dead-letter stream (after at most MAX_DELIVERIES attempts), everything else delivered."""
    with world(tmp) as w, c.target(w) as t:
        key = c.poison(w, t, "poison-c")
        runs = _feed(c, w, runs_of("poison-c")) - {key}
        proc, _ = c.start(w, t, "c")
        own = c.deadletter_streams(w)
        dead = wait_until(lambda: any(key in str(d) for d in _dead(w, own)), DELIVER_TIMEOUT_S)
        return _finish(c, w, t, runs, [proc], [_log(w, "c")], poison_key=key, dead_lettered=dead,
                       max_deliveries=MAX_DELIVERIES)


# ------------------------------------------------------------------------------------ d
def redis_full(c: Consumer, tmp: Path) -> Outcome:
    """Redis at maxmemory (noeviction; the limit just above what it uses with the input loaded)
    for FULL_S (> CLAIM_IDLE_MS x MAX_DELIVERIES at defaults), the consumer started into it and
    running through it; then memory freed: 0 lost, 0 doubled, no traceback exit."""
    with world(tmp) as w, c.target(w) as t:
        runs = _feed(c, w, runs_of("full-d", copies=2))
        r = w.root()
        if w.feeder is not None:
            stop(w.feeder)  # its work is done; it is not under test
        r.config_set("maxmemory-policy", "noeviction")
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", str(used + c.full_headroom))
        started = time.monotonic()
        proc, port_file = c.start(w, t, "d")
        ready = []
        while time.monotonic() - started < FULL_S:
            if proc.poll() is not None:
                break
            ready.append(readyz(metrics_port(port_file, timeout=1))[0])
            time.sleep(5)
        oom = int(r.info("errorstats").get("errorstat_OOM", {}).get("count", 0))
        delivered_during = c.account(w, t, runs).expected - len(c.account(w, t, runs).lost)
        r.config_set("maxmemory", "0")
        return _finish(c, w, t, runs, [proc], [_log(w, "d")], oom_refusals=oom, readyz_during=ready,
                       delivered_during_outage=delivered_during, outage_s=FULL_S)


# ------------------------------------------------------------------------------------ e
def target_down(c: Consumer, tmp: Path) -> Outcome:
    """The target unreachable for TARGET_DOWN_S (10 minutes at defaults: 4x CLAIM_IDLE_MS x
    MAX_DELIVERIES) while input keeps arriving, then back: 0 lost, 0 doubled, nothing dead-lettered,
    /readyz 503 with a reason meanwhile. PostgreSQL: a private cluster stopped and started.
    Collector: first stopped (connection refused), then answering 401, 403, 404, 429 and 503 in turn
    (an expired token, a wrong path, a rate limit, an overloaded backend: outages, not rejections of
    the content). Object store: moto's S3 server stopped (SIGSTOP: connections accepted, never
    answered) and continued; the feeder worker's raw trim runs through the outage (see
    ArchiveConsumer.outage_facts)."""
    from tests.consumers.targets import outage

    with world(tmp) as w, outage(c, w) as (t, down, up):
        before = _feed(c, w, runs_of("down-e1"))
        runs = set(before)
        proc, port_file = c.start(w, t, "e")
        first = wait_until(lambda: c.account(w, t, runs).complete, DELIVER_TIMEOUT_S)
        port = metrics_port(port_file)
        ready_before = readyz(port)
        started = time.monotonic()
        samples: list[tuple[float, int, str]] = []
        phases = down(TARGET_DOWN_S)
        during = _feed(c, w, runs_of("down-e2"))
        runs |= during
        for at, apply in phases:
            while time.monotonic() - started < at:
                samples.append((round(time.monotonic() - started, 1), *readyz(port)))
                time.sleep(3)
            apply()
        while time.monotonic() - started < TARGET_DOWN_S:
            samples.append((round(time.monotonic() - started, 1), *readyz(port)))
            time.sleep(3)
        at_end = c.outage_facts(w, t, before, during)
        up()
        back = wait_until(lambda: readyz(port)[0] == 200, DELIVER_TIMEOUT_S)
        return _finish(c, w, t, runs, [proc], [_log(w, "e")], first_delivered=first, ready_before=ready_before,
                       readyz_during=samples, ready_after=back, outage_s=TARGET_DOWN_S,
                       noticed_within_s=c.outage_noticed_s, **at_end)


# ------------------------------------------------------------------------------------ f
def slow_target(c: Consumer, tmp: Path) -> Outcome:
    """Every request to the target takes 500 ms (a slow collector; PostgreSQL behind a proxy that
    holds each client message 500 ms), with enough runs that exporting them takes longer than
    CLAIM_IDLE_MS: 0 doubled (and 0 lost)."""
    from tests.consumers.targets import slowed

    with world(tmp) as w, slowed(c, w, 0.5) as t:
        runs = _feed(c, w, runs_of("slow-f", copies=12))
        proc, _ = c.start(w, t, "f")
        return _finish(c, w, t, runs, [proc], [_log(w, "f")])


# ------------------------------------------------------------------------------------ the broker's own faults (issue 32)
def rollback(c: Consumer, tmp: Path) -> Outcome:
    """Redis SIGKILLed mid-stream and restarted from an older RDB snapshot: runs A, the snapshot
    while the consumer has a batch of A pending, A delivered, runs B delivered, the restart (B is
    gone from Redis: its raw entries, and the topic entries and state written for it), runs C. What each consumer owes afterwards is
    `Consumer.owed_after_rollback`: the archive every run (it wrote B before Redis lost it), the
    others the runs Redis still holds (A and C), each delivered once; and nothing doubled in the
    target over every run, B included."""
    from tests.support.redis_snapshot import restart_from_its_snapshot

    with world(tmp) as w, c.target(w) as t:
        # A is in Redis whole before the consumer starts, and the snapshot is taken with a batch of
        # it read and not acknowledged (the consumer frozen meanwhile): after the rollback those
        # entries are pending (or unread) again although their output went out, as when Redis
        # crashes and restarts from its last snapshot.
        runs = _feed(c, w, runs_of("rollback-a", copies=4))
        proc, _ = c.start(w, t, "rb")
        r = w.root()
        caught, pending_at_save = _freeze_when(proc, lambda: c.sent_some(t) and _pending(w, c) > 0,
                                               lambda: _pending(w, c))
        at_snapshot = c.at_snapshot(w, t, runs)
        r.save()  # when not caught mid-batch (the test says so), the snapshot is taken all the same
        os.kill(proc.pid, signal.SIGCONT)
        first = wait_until(lambda: c.account(w, t, runs).complete, DELIVER_TIMEOUT_S)
        runs |= _feed(c, w, runs_of("rollback-b"))
        second = wait_until(lambda: c.account(w, t, runs).complete and _pending(w, c) == 0, DELIVER_TIMEOUT_S)
        raw = w.settings.layout.raw_streams()
        before = sum(r.xlen(s) for s in raw)
        delivered_before = c.account(w, t, runs)
        restart_from_its_snapshot(w.server, w.root)
        held = _held_runs(w)
        lost_from_redis = before - sum(w.root().xlen(s) for s in raw)
        runs |= _feed(c, w, runs_of("rollback-c"))
        held |= {run for run in runs if run.startswith("rollback-c/")}
        counted = None
        if c.broker_lost_metric:  # the loss counted: every raw entry of B (archived, then lost by Redis)
            wait_until(lambda: "went back in time" in _log(w, "rb").read_text(errors="replace"), 60)
            counted = scrape(metrics_port(w.port_files[proc.pid]), c.broker_lost_metric)
        owed = c.owed_after_rollback(runs, held)
        out = _finish(c, w, t, owed, [proc], [_log(w, "rb")], first_delivered=first, second_delivered=second,
                      lost_from_redis=lost_from_redis, caught_at_save=caught,
                      pending_at_save=pending_at_save, runs_fed=len(runs), runs_held=len(held), runs_owed=len(owed),
                      units_before_restart=delivered_before.expected - len(delivered_before.lost),
                      broker_lost_counted=counted,
                      raw_entries_of_b=sum(n for run, n in w.published.items() if run.startswith("rollback-b/")),
                      **at_snapshot)
        # doubled over every run the target got, also those Redis lost (the accounting above is over `owed`)
        out.facts["doubled_over_all_runs"] = c.account(w, t, runs).doubled
        out.facts["copies"] = c.copies(t)
        out.facts["rollback_lines"] = [line for line in _log(w, "rb").read_text(errors="replace").splitlines()
                                       if "went back in time" in line]
        return out


def _held_runs(w: World) -> set[str]:
    """The runs with raw entries in Redis now (after a rollback: those the snapshot held)."""
    r = w.root()
    return {f[b"run"].decode() for s in w.settings.layout.raw_streams() for _, f in r.xrange(s) if b"run" in f}


def second_instance(c: Consumer, tmp: Path) -> Outcome:
    """A second instance of the same consumer started beside the first (same group, its own
    process) while input arrives; how it ended within 60 s (None: still running) is a fact."""
    with world(tmp) as w, c.target(w) as t:
        runs = _feed(c, w, runs_of("two-a"))
        first, port_file = c.start(w, t, "two-1")
        wait_until(lambda: readyz(metrics_port(port_file))[0] == 200, DELIVER_TIMEOUT_S)
        second, _ = c.start(w, t, "two-2")
        feeding, fed = background(lambda: _feed(c, w, runs_of("two-b")))
        wait_until(lambda: second.poll() is not None, 60)
        second_exit = second.poll()
        feeding.join()
        if "error" in fed:
            raise fed["error"]
        runs |= fed["value"]
        procs = [first] + ([second] if second_exit is None else [])
        out = _finish(c, w, t, runs, procs, [_log(w, "two-1"), _log(w, "two-2")], second_exit=second_exit)
        out.facts["second_log"] = _log(w, "two-2").read_text(errors="replace")
        return out


def lost_group_trimmed(c: Consumer, tmp: Path) -> Outcome:
    """Case a) with the head already trimmed: everything delivered, then the older half of every
    stream the consumer reads trimmed (XTRIM MINID), then its group destroyed, then more input. What
    was delivered stays delivered once; nothing is delivered twice."""
    with world(tmp) as w, c.target(w) as t:
        runs = _feed(c, w, runs_of("trimmed-a"))
        proc, _ = c.start(w, t, "lgt")
        first = wait_until(lambda: c.account(w, t, runs).complete and _pending(w, c) == 0, DELIVER_TIMEOUT_S)
        r = w.root()
        c.before_trim(w, runs)
        trimmed = 0
        for s in c.group_streams(w):
            ids = [i for i, _ in r.xrange(s)]
            if ids:
                trimmed += r.xtrim(s, minid=ids[len(ids) // 2], approximate=False)
        destroyed = sum(r.xgroup_destroy(s, c.group(w.settings)) for s in c.group_streams(w))
        runs |= _feed(c, w, runs_of("trimmed-b"))
        return _finish(c, w, t, runs, [proc], [_log(w, "lgt")], first_delivered=first, trimmed=trimmed,
                       destroyed=destroyed)


CASES: dict[str, Callable[[Consumer, Path], Outcome]] = {
    "lost_group": lost_group,
    "dead_consumer": dead_consumer,
    "poison": poison,
    "redis_full": redis_full,
    "target_down": target_down,
    "slow_target": slow_target,
    "killed_mid_batch": killed_mid_batch,
    "rollback": rollback,
    "second_instance": second_instance,
    "lost_group_trimmed": lost_group_trimmed,
}
