"""A real local Redis Cluster for the tests: 3 primaries + 3 replicas on loopback ports.

Started once per test session (fixture `redis_cluster` in tests/conftest.py) with the Debian
`redis-server` and `redis-cli --cluster create`, torn down afterwards. Nodes run without
persistence, like the embedded broker; a failover test kills a primary with SIGKILL and waits for
its replica's promotion (cluster-node-timeout 2000 ms).
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from services.broker.embedded import EmbeddedRedis, find_redis_server
from tests.support.needs import missing

CLUSTER_BUS_OFFSET = 10000  # a node also listens on port + 10000 (the cluster bus)

NODE_TIMEOUT_MS = 2000
PRIMARIES = 3
START_TIMEOUT_S = 60.0


class ClusterUnavailable(RuntimeError):
    """The local cluster could not be built (no redis-cli, a node did not start...)."""


@dataclass
class LocalCluster:
    nodes: list[EmbeddedRedis]
    dir: str
    _own_dir: bool = field(default=True, repr=False)

    @property
    def seeds(self) -> list[str]:
        return [f"127.0.0.1:{n.port}" for n in self.nodes[:PRIMARIES]]

    @property
    def url(self) -> str:
        """Seed-list URL as GOOSE_INGEST_REDIS_URL takes it in cluster mode."""
        return "redis://" + ",".join(self.seeds)

    def node(self, port: int) -> EmbeddedRedis:
        return next(n for n in self.nodes if n.port == port)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def live_nodes(self) -> list[EmbeddedRedis]:
        return [n for n in self.nodes if n.running]

    def primary_ports(self) -> list[int]:
        """Ports of the nodes that currently are primaries owning slots (per a live node's view)."""
        for n in self.live_nodes():
            try:
                slots = self.client(n.port).execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            return sorted({int(entry[2][1]) for entry in slots})
        return []

    def primary_of_slot(self, slot: int) -> int:
        for n in self.live_nodes():
            try:
                for start, end, primary, *_ in self.client(n.port).execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(primary[1])
            except redis.RedisError:
                continue
        raise ClusterUnavailable(f"no live node knows slot {slot}")

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok and three primaries serve all 16384 slots."""
        for n in self.live_nodes():
            try:
                info = self.client(n.port).execute_command("CLUSTER", "INFO")
            except redis.RedisError:
                return False
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text or "cluster_slots_ok:16384" not in text:
                return False
        return len(self.primary_ports()) == PRIMARIES

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"cluster not healthy within {timeout}s")
            time.sleep(0.1)

    def restart_dead(self) -> None:
        """Bring killed nodes back (empty; they rejoin as replicas) and wait for a healthy cluster."""
        for n in self.nodes:
            if not n.running:
                n.start()
        self.wait_healthy()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self._all_nodes_agree() and self.replicas_synced()):
            if time.monotonic() > deadline:
                raise ClusterUnavailable("restarted nodes did not rejoin in time")
            time.sleep(0.1)

    def replicas_synced(self) -> bool:
        """Every live replica has a working link to its primary (a replica that never synced cannot
        take over: 'Disconnected from master for longer than allowed')."""
        for n in self.live_nodes():
            try:
                info = self.client(n.port).info("replication")
            except redis.RedisError:
                return False
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def _all_nodes_agree(self) -> bool:
        for n in self.nodes:
            try:
                text = self.client(n.port).execute_command("CLUSTER", "INFO").decode()
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(self.nodes)}" not in text:
                return False
        return True

    def stop(self) -> None:
        for n in self.nodes:
            n.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(taken: set[int]) -> int:
    """A free port whose cluster-bus port (+10000) is free too (so at most 55535)."""
    for _ in range(1000):
        port = random.randint(20000, 45000)
        if port not in taken and _port_free(port) and _port_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise ClusterUnavailable("no free port pair for a cluster node")


def start_cluster(dir: str | None = None, replicas: int = 1) -> LocalCluster:
    """3 primaries (+ `replicas` each) on free loopback ports, joined by `redis-cli --cluster create`."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise ClusterUnavailable("redis-cli not found (Debian: apt-get install redis-tools)")
    binary = find_redis_server()
    base = dir or tempfile.mkdtemp(prefix="goose-ingest-cluster-")
    nodes: list[EmbeddedRedis] = []
    cluster = LocalCluster(nodes, base, _own_dir=dir is None)
    try:
        for i in range((1 + replicas) * PRIMARIES):
            port = cluster_port({n.port for n in nodes})
            node_dir = str(Path(base) / f"node-{i}")
            node = EmbeddedRedis(binary, port, node_dir, extra_args=[
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # replicas sync at once (default: wait 5 s for more replicas to share one RDB)
                "--repl-diskless-sync-delay", "0",
            ])
            nodes.append(node.start())
        res = subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=START_TIMEOUT_S,
        )
        if res.returncode != 0:
            raise ClusterUnavailable(f"redis-cli --cluster create failed: {res.stdout[-500:]} {res.stderr[-500:]}")
        cluster.wait_healthy()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (cluster._all_nodes_agree() and cluster.replicas_synced()):
            if time.monotonic() > deadline:
                raise ClusterUnavailable("nodes did not agree on the cluster, or replicas did not sync, in time")
            time.sleep(0.1)
        return cluster
    except BaseException:
        cluster.stop()
        raise


def wipe_cluster_namespace(cluster: LocalCluster, namespace: str) -> None:
    """Delete one namespace's keys on every primary (SCAN + single-key UNLINK: never cross-slot)."""
    for port in cluster.primary_ports():
        r = cluster.client(port)
        try:
            for key in r.scan_iter(match=f"{namespace}:*", count=1000):
                r.unlink(key)
        except redis.RedisError:
            continue


# ---------------------------------------------------------------------------------- pytest fixtures
# Imported by tests/conftest.py so one cluster serves the whole session.
@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A local 3+3 Redis Cluster for the session (skips locally, fails under CI, if it cannot start)."""
    try:
        cluster = start_cluster(str(tmp_path_factory.mktemp("redis-cluster")))
    except (ClusterUnavailable, OSError) as exc:
        missing("a local Redis Cluster", f"redis-server and redis-cli on the PATH; {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_settings(redis_cluster, tmp_path):
    """Settings in cluster mode (default shard count) with a namespace of its own, wiped afterwards."""
    from uuid import uuid4

    from services.settings import Settings

    redis_cluster.restart_dead()  # a failover test may have left a killed node behind
    s = Settings(
        redis_url=redis_cluster.url,
        redis_cluster=True,
        namespace=f"c{uuid4().hex[:10]}",
        spool_dir=str(tmp_path / "spool"),
        host_label="test-host",
    )
    yield s
    wipe_cluster_namespace(redis_cluster, s.namespace)


# ---------------------------------------------------------------------------------- command recording
@dataclass(frozen=True)
class RecordedCommand:
    port: int  # the node that executed it
    source: str  # "client" or "lua" (issued inside a script)
    args: tuple[bytes, ...]


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b", ord("a"): b"\a",
            ord('"'): b'"', ord("\\"): b"\\"}


def parse_monitor_line(line: bytes) -> tuple[str, tuple[bytes, ...]] | None:
    """`<ts> [<db> <client>|lua] "ARG" "ARG"...` (MONITOR's sdscatrepr quoting) -> (source, args)."""
    close = line.find(b"]")
    if close < 0:
        return None
    source = "lua" if line[:close].endswith(b"lua") else "client"
    args: list[bytes] = []
    i, n = close + 1, len(line)
    while i < n:
        if line[i] != ord('"'):
            i += 1
            continue
        i += 1
        buf = bytearray()
        while i < n and line[i] != ord('"'):
            c = line[i]
            if c == ord("\\") and i + 1 < n:
                nxt = line[i + 1]
                if nxt == ord("x") and i + 3 < n:
                    buf.append(int(line[i + 2:i + 4], 16))
                    i += 4
                    continue
                buf += _ESCAPES.get(nxt, bytes([nxt]))
                i += 2
                continue
            buf.append(c)
            i += 1
        args.append(bytes(buf))
        i += 1
    return source, tuple(args)


class MonitorRecorder:
    """MONITOR on every node of a cluster (raw sockets, one thread each): every command they execute."""

    def __init__(self, cluster: LocalCluster) -> None:
        import threading

        self.cluster = cluster
        self.commands: list[RecordedCommand] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        for node in cluster.live_nodes():
            sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
            sock.sendall(b"MONITOR\r\n")
            self._socks.append(sock)
            t = threading.Thread(target=self._read, args=(sock, node.port), daemon=True)
            t.start()
            self._threads.append(t)

    def _read(self, sock: socket.socket, port: int) -> None:
        sock.settimeout(0.2)
        pending = b""
        while not self._stop.is_set():
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return  # the node was killed (failover tests)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\r\n")
            parsed = []
            for line in lines:
                if not line.startswith(b"+") or line == b"+OK":
                    continue
                got = parse_monitor_line(line[1:])
                if got is not None:
                    parsed.append(RecordedCommand(port, got[0], got[1]))
            with self._lock:
                self.commands.extend(parsed)

    def stop(self) -> list[RecordedCommand]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        for s in self._socks:
            s.close()
        with self._lock:
            return list(self.commands)


def command_keys(client: redis.Redis, args: tuple[bytes, ...]) -> list[bytes]:
    """The key arguments of a command, as the server itself determines them (COMMAND GETKEYS)."""
    try:
        return [k.encode() if isinstance(k, str) else k for k in client.command_getkeys(*args)]
    except redis.ResponseError:
        return []  # a command without key arguments


def cross_slot_violations(cluster: LocalCluster, commands: list[RecordedCommand]) -> list[str]:
    """Every command (and every script with what it ran inside) whose keys span several slots."""
    from redis.crc import key_slot

    probe = cluster.client(cluster.primary_ports()[0])
    bad: list[str] = []
    script_slot: dict[int, int | None] = {}  # node port -> slot of the script running there
    for cmd in commands:
        if not cmd.args:
            continue
        keys = command_keys(probe, cmd.args)
        slots = {key_slot(k) for k in keys}
        name = cmd.args[0].upper()
        if cmd.source == "client":
            script_slot[cmd.port] = next(iter(slots)) if name in (b"EVALSHA", b"EVAL") and len(slots) == 1 else None
        elif script_slot.get(cmd.port) is not None:
            slots.add(script_slot[cmd.port])  # keys touched inside a script join its declared slot
        if len(slots) > 1:
            bad.append(f"{cmd.source}@{cmd.port}: {b' '.join(a[:60] for a in cmd.args[:6]).decode(errors='replace')}")
    return bad
