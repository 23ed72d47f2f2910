"""The consumer contract on the 3+3 Redis Cluster (issue 32 item 6): every consumer of the raw log
and the topics (the worker, `export otlp`, `export postgres`, `archive`) as a real process under its
own ACL user of deploy/redis/users.acl (loaded on every node: ACL SETUSER is not replicated, and a
replica that becomes primary must know the users), default settings (the archive's segment age as
in the single-node contract), one pipeline in one namespace: the tap publishes raw runs, the worker
writes the topics, the exporters and the archive read them.

The fault: a primary SIGKILLed mid-batch. Input arrives continuously; the consumers are frozen
(SIGSTOP) at a moment when each of them has entries read and not acknowledged on one primary's
streams, that primary's replica is let catch up (the promise is the consumers', not Redis's
asynchronous replication: see "Limits" in docs/consumers.md), the primary is SIGKILLed, the
consumers continued: they meet the failover in the middle of their batches (refused writes,
MOVED, a dead connection). Then more runs after the replica took over. Each consumer's target is
read back as in tests/consumers/test_contract.py: 0 lost, 0 doubled, its group drained, no exit
on its own, exit 0 after SIGTERM.

The killed node stays down NODE_DOWN_S after its replica's promotion, then is restarted with its
aclfile, as a supervisor would: while it is down the FastStream consumers (worker, export otlp)
may read nothing (a known issue, docs/consumers.md "Limits on the cluster"); what each delivered
meanwhile is the fact `complete_while_node_down`, not a promise.

Wall time: one cluster and one pipeline for the four consumers (the failover is one event they
all meet): about 2 minutes on its own (101-117 s measured); it is a file of its own so
pytest-xdist (--dist loadfile) runs it beside the single-node contract's 10-minute window.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from services.broker.acl import render
from services.settings import Settings
from tests.broker.test_acl import ROOT_PASSWORD, ROOT_USER
from tests.consumers.cases import DELIVER_TIMEOUT_S, Outcome, _finish
from tests.consumers.harness import (
    ROLES,
    ArchiveConsumer,
    Consumer,
    OtlpConsumer,
    PostgresConsumer,
    Target,
    WorkerConsumer,
    World,
    metrics_port,
    publish,
    readyz,
    runs_of,
    stop,
    wait_until,
)
from tests.consumers.test_contract import _lost_doubled, _ran_through
from tests.support.needs import missing
from tests.support.redis_cluster import ClusterUnavailable, LocalCluster, start_cluster

pytestmark = pytest.mark.e2e

CONSUMERS: tuple[Consumer, ...] = (WorkerConsumer(), OtlpConsumer(), PostgresConsumer(), ArchiveConsumer())
SHARDS = 4  # the layout's shard count (as tests/archive's cluster failover): partitions on every primary
FREEZE_TIMEOUT_S = 90.0  # to catch every consumer with entries pending on one primary at once
# The killed node stays down this long after its replica was promoted, then is restarted (as a
# supervisor would; tests/broker/test_cluster_failover.py restarts it after 2 s). Known limit
# (docs/consumers.md): the FastStream consumers (worker, export otlp) may not read again until the
# dead address answers; what each delivered meanwhile is a fact of the outcome, not a promise.
NODE_DOWN_S = 30.0
SCENARIO_TIMEOUT_S = 600  # pytest-timeout for the test that runs the scenario (the others read its result)


@dataclass
class ClusterWorld(World):
    """A World on the cluster: `server` is unused (the cluster outlives the world), `root()` is the
    test's superuser through a cluster client."""

    cluster: LocalCluster | None = None
    killed: list[int] = field(default_factory=list)

    def root(self) -> RedisCluster:  # type: ignore[override]
        assert self.cluster is not None
        nodes = [ClusterNode("127.0.0.1", n.port) for n in self.cluster.live_nodes()]
        return RedisCluster(startup_nodes=nodes, username=ROOT_USER, password=ROOT_PASSWORD, socket_timeout=10,
                            require_full_coverage=False)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)


def load_acl_everywhere(cluster: LocalCluster, settings: Settings, passwords: dict[str, str], path: Path) -> None:
    """The shipped users (render of the layout, as deploy/redis/users.acl) and the test's superuser
    on every node, and in `path`, the aclfile a restarted node loads (as every node of a deployment
    does at start). The `default` user stays as the cluster was built (replication and `redis-cli
    --cluster` use it); the consumers never connect as it."""
    lines = [line.split() for line in render(settings.layout, passwords).splitlines()]
    lines = [parts for parts in lines if parts and parts[0] == "user" and parts[1] != "default"]
    root = [ROOT_USER, "reset", "on", f">{ROOT_PASSWORD}", "~*", "&*", "+@all"]
    path.write_text("".join(f"user {' '.join(parts)}\n" for parts in
                            [["default", "on", "nopass", "~*", "&*", "+@all"], *[p[1:] for p in lines], root]))
    for node in cluster.live_nodes():
        c = cluster.client(node.port)
        for parts in lines:
            c.execute_command("ACL", "SETUSER", *parts[1:])
        c.execute_command("ACL", "SETUSER", *root)
        if "--aclfile" not in node.extra_args:
            node.extra_args += ["--aclfile", str(path)]  # read at its next start only


@dataclass
class Scenario:
    outcomes: dict[str, Outcome]
    facts: dict[str, Any]


class Feeder:
    """Publishes runs one after another (as the tap's user) until told to stop. `pause` waits for
    the run being published and holds the next one until `resume`, so the test can freeze the
    world with no write in flight."""

    def __init__(self, w: World, tag: str, copies: int) -> None:
        self.w, self.tag, self.copies = w, tag, copies
        self.runs: set[str] = set()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for i in range(self.copies):
                for run, lines in runs_of(f"{self.tag}/{i}").items():
                    with self.lock:
                        if self.done.is_set():
                            return
                        self.runs.add(run)
                        publish(self.w, {run: lines})
                    time.sleep(0.001)  # a paused test gets the lock
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def pause(self) -> None:
        self.lock.acquire()

    def resume(self) -> None:
        self.lock.release()

    def finish(self) -> set[str]:
        self.done.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error
        return self.runs


def pending_by_primary(w: ClusterWorld, r: RedisCluster, owner: dict[str, int]) -> dict[int, dict[str, int]]:
    """primary port -> consumer -> entries pending in its group on that primary's streams."""
    out: dict[int, dict[str, int]] = {}
    for c in CONSUMERS:
        for s in c.group_streams(w):
            try:
                n = int(r.xpending(s, c.group(w.settings))["pending"])
            except redis.RedisError:
                continue  # no group on that stream yet
            by = out.setdefault(owner[s], {})
            by[c.name] = by.get(c.name, 0) + n
    return out


def replica_caught_up(cluster: LocalCluster, port: int) -> bool:
    info = cluster.client(port).info("replication")
    replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return bool(replicas) and all(int(rep["offset"]) >= int(info["master_repl_offset"]) for rep in replicas)


def kill_a_primary_mid_batch(w: ClusterWorld, procs: dict[str, Any], feeder: Feeder) -> dict[str, Any]:
    """Freeze every consumer (and the feeder, at a run boundary) until the victim holds entries
    pending for all four; let its replica catch up; SIGKILL it; continue them. The victim is the
    primary at the first seed of GOOSE_INGEST_REDIS_URL (the address the consumers' clients were
    given first: the worst case, see NODE_DOWN_S)."""
    assert w.cluster is not None
    r = w.root()
    streams = {s for c in CONSUMERS for s in c.group_streams(w)}
    owner = {s: w.cluster.primary_of_slot(key_slot(s.encode())) for s in streams}
    victim = w.cluster.nodes[0].port
    assert victim in set(owner.values()), f"no stream of the layout on the first seed {victim}: {owner}"
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    attempts = 0
    best: dict[str, int] = {}
    while time.monotonic() < deadline:
        attempts += 1
        for p in procs.values():
            os.kill(p.pid, signal.SIGSTOP)
        feeder.pause()  # after the freeze: its current run adds input, never acknowledges any
        try:
            pending = pending_by_primary(w, r, owner)
            if all(pending.get(victim, {}).get(c.name, 0) > 0 for c in CONSUMERS):
                caught_up = wait_until(lambda: replica_caught_up(w.cluster, victim), 30, interval=0.05)
                w.cluster.node(victim).kill()
                w.killed.append(victim)
                return {"caught": True, "victim": victim, "pending_at_kill": pending[victim],
                        "replica_caught_up": caught_up, "attempts": attempts}
            best = max(best, pending.get(victim, {}), key=lambda by: sum(1 for n in by.values() if n > 0))
        finally:
            for p in procs.values():
                os.kill(p.pid, signal.SIGCONT)
            feeder.resume()
        time.sleep(0.05)
    return {"caught": False, "pending_at_kill": best, "attempts": attempts}


def scenario(cluster: LocalCluster, tmp: Path) -> Scenario:
    settings = Settings(redis_url=cluster.url, redis_cluster=True, namespace=f"c{uuid.uuid4().hex[:6]}", shards=SHARDS,
                        spool_dir=str(tmp / "spool"), host_label="contract-host")
    passwords = {role: f"pw-{role}-{uuid.uuid4().hex[:8]}" for role in ROLES}
    tmp.mkdir(parents=True, exist_ok=True)
    load_acl_everywhere(cluster, settings, passwords, tmp / "users.acl")
    w = ClusterWorld(server=None, acl_path=tmp / "users.acl", settings=settings, passwords=passwords,  # type: ignore[arg-type]
                     tmp=tmp, cluster=cluster)
    with ExitStack() as stack:
        stack.callback(w.close)
        targets: dict[str, Target] = {c.name: stack.enter_context(c.target(w)) for c in CONSUMERS}
        procs, logs = {}, {}
        for c in CONSUMERS:
            tag = c.name.replace(" ", "-")
            procs[c.name], port_file = c.start(w, targets[c.name], tag)
            logs[c.name] = w.tmp / f"{tag}.log"
        for c in CONSUMERS:
            port = metrics_port(w.port_files[procs[c.name].pid], timeout=90)
            assert wait_until(lambda port=port: readyz(port)[0] == 200, 90), f"{c.name} never ready: {readyz(port)}"
        runs = set(runs_of("cluster-a"))
        publish(w, runs_of("cluster-a"))
        first = {c.name: wait_until(lambda c=c: c.account(w, targets[c.name], runs).complete, DELIVER_TIMEOUT_S)
                 for c in CONSUMERS}
        feeder = Feeder(w, "cluster-b", copies=1000)  # until the kill
        kill = kill_a_primary_mid_batch(w, procs, feeder)
        runs |= feeder.finish()
        victim = kill.get("victim")
        promoted = wait_until(lambda: victim not in cluster.primary_ports() and len(cluster.primary_ports()) == 3,
                              30, interval=0.2)
        after = runs_of("cluster-c")  # after the failover, while the killed node is still down
        runs |= set(after)
        publish(w, after)
        down_started = time.monotonic()
        while_down = {c.name: False for c in CONSUMERS}
        while time.monotonic() - down_started < NODE_DOWN_S and not all(while_down.values()):
            for c in CONSUMERS:
                while_down[c.name] = while_down[c.name] or c.account(w, targets[c.name], runs).complete
            time.sleep(1.0)
        # its supervisor restarts it (with its aclfile): empty, it rejoins as the new primary's replica
        cluster.restart_dead()
        outcomes = {c.name: _finish(c, w, targets[c.name], runs, [procs[c.name]], [logs[c.name]])
                    for c in CONSUMERS}
        return Scenario(outcomes, {"first_delivered": first, "runs": len(runs), "promoted": promoted,
                                   "complete_while_node_down": while_down, **kill})


@pytest.fixture(scope="module")
def primary_killed() -> Any:
    """The scenario, run once for the four consumers on a cluster of this file's own (a failover
    must not disturb the session's shared cluster), its outcome shared by the tests below."""
    root = Path(tempfile.mkdtemp(prefix="goose-contract-cluster-"))
    try:
        cluster = start_cluster(str(root / "cluster"))
    except (ClusterUnavailable, OSError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        missing("a local Redis Cluster", f"redis-server and redis-cli on the PATH; {exc}")
    box: dict[str, Any] = {}

    def get() -> Scenario:
        if "value" not in box:
            try:
                box["value"] = scenario(cluster, root / "world")
            except BaseException as exc:  # noqa: BLE001 - every test reports it
                box["value"] = exc
        if isinstance(box["value"], BaseException):
            raise box["value"]
        return box["value"]

    try:
        yield get
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(SCENARIO_TIMEOUT_S)
@pytest.mark.parametrize("name", [c.name for c in CONSUMERS])
def test_a_primary_sigkilled_mid_batch_loses_and_doubles_nothing(primary_killed, name: str):
    """The primary of one shard's streams SIGKILLed while every consumer had entries read there and
    not acknowledged (its replica had every write: see the module docstring), its replica promoted,
    more runs after, the node restarted NODE_DOWN_S later: 0 lost, 0 doubled over every run, the
    group drained, no exit on its own, exit 0 after SIGTERM."""
    s = primary_killed()
    print({k: v for k, v in s.facts.items() if k != "first_delivered"})
    assert s.facts["caught"], f"no primary held pending entries of every consumer at once: {s.facts}"
    assert s.facts["pending_at_kill"][name] > 0, s.facts
    assert s.facts["replica_caught_up"] and s.facts["promoted"], f"not a clean failover: {s.facts}"
    assert s.facts["first_delivered"][name], s.facts
    out = s.outcomes[name]
    _lost_doubled(out)
    _ran_through(out)
