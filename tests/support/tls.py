"""TLS for the tests: a throw-away CA with a server and a client certificate (openssl CLI), a second CA
that signed nothing the server uses (the "wrong CA"), and a redis-server with a TLS port.

The server also keeps its plain port: tests read what a command wrote through it, and point a
``rediss://`` URL at it to play a server that does not speak TLS.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from services.broker.embedded import EmbeddedRedis, free_port, start_redis
from tests.support.needs import missing


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: trusting only it must fail


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_tls_files(dir: Path) -> TlsFiles:
    """The CA, a server certificate for localhost / 127.0.0.1, a client certificate, another CA (EC keys: fast)."""
    if shutil.which("openssl") is None:
        missing("openssl", "apt-get install -y openssl")
    dir.mkdir(parents=True, exist_ok=True)
    key_args = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *key_args, "-keyout", dir / f"{ca}-key.pem", "-out", dir / f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=goose-ingest test {ca}")
    (dir / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    (dir / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        _openssl("req", *key_args, "-keyout", dir / f"{who}-key.pem", "-out", dir / f"{who}.csr",
                 "-subj", f"/CN={'localhost' if who == 'server' else 'goose-ingest test client'}")
        _openssl("x509", "-req", "-in", dir / f"{who}.csr", "-CA", dir / "ca.pem", "-CAkey", dir / "ca-key.pem",
                 "-CAcreateserial", "-out", dir / f"{who}.pem", "-days", "2", "-extfile", dir / f"{who}.ext")
    return TlsFiles(ca=dir / "ca.pem", server_cert=dir / "server.pem", server_key=dir / "server-key.pem",
                    client_cert=dir / "client.pem", client_key=dir / "client-key.pem", other_ca=dir / "other-ca.pem")


def untrusted_server_cert(files: TlsFiles, dir: Path) -> tuple[Path, Path]:
    """A server certificate for localhost / 127.0.0.1 signed by `files.other_ca` (a rotation to a CA the
    clients do not trust): (cert, key), for ``CONFIG SET tls-cert-file ... tls-key-file ...``."""
    dir.mkdir(parents=True, exist_ok=True)
    other_key = files.other_ca.parent / "other-ca-key.pem"  # make_tls_files writes it beside other-ca.pem
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", dir / "untrusted-key.pem", "-out", dir / "untrusted.csr", "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", dir / "untrusted.csr", "-CA", files.other_ca, "-CAkey", other_key,
             "-CAcreateserial", "-out", dir / "untrusted.pem", "-days", "2",
             "-extfile", files.other_ca.parent / "server.ext")
    return dir / "untrusted.pem", dir / "untrusted-key.pem"


def tls_server_args(files: TlsFiles, tls_port: int, auth_clients: str = "no") -> list[str]:
    """redis-server options for a TLS port; `auth_clients` is --tls-auth-clients (no, optional, yes)."""
    return ["--tls-port", str(tls_port), "--tls-cert-file", str(files.server_cert),
            "--tls-key-file", str(files.server_key), "--tls-ca-cert-file", str(files.ca),
            "--tls-auth-clients", auth_clients]


def start_tls_redis(dir: Path, files: TlsFiles, auth_clients: str = "no") -> tuple[EmbeddedRedis, int]:
    """A redis-server with a TLS port (returned) beside its plain one (``server.port``)."""
    tls_port = free_port()
    return start_redis(dir=str(dir), extra_args=tls_server_args(files, tls_port, auth_clients)), tls_port


def start_tls_cluster(dir: Path, files: TlsFiles, primaries: int = 3,
                      auth_clients: str = "no") -> list[tuple[subprocess.Popen, int]]:
    """A Redis Cluster of `primaries` nodes (no replicas) that speaks only TLS: clients, the cluster
    bus and replication (``--port 0 --tls-cluster yes --tls-replication yes``); `auth_clients` is
    --tls-auth-clients (with "yes" the nodes present their server certificate to each other, which
    carries clientAuth). Returns (process, TLS port) per node; the caller terminates them."""
    from tests.support.redis_cluster import ClusterUnavailable, cluster_port

    cli = shutil.which("redis-cli")
    if cli is None:
        missing("redis-cli", "apt-get install -y redis-tools")
    tls_cli = [cli, "--tls", "--cacert", str(files.ca), "--cert", str(files.client_cert), "--key", str(files.client_key)]
    nodes: list[tuple[subprocess.Popen, int]] = []
    try:
        for i in range(primaries):
            port = cluster_port({p for _, p in nodes})
            node_dir = dir / f"node-{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(
                ["redis-server", "--port", "0", *tls_server_args(files, port, auth_clients), "--tls-cluster", "yes",
                 "--tls-replication", "yes", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
                cwd=node_dir, stdout=(node_dir / "log").open("ab"), stderr=subprocess.STDOUT)
            nodes.append((proc, port))
        deadline = time.monotonic() + 30
        for _, port in nodes:
            while subprocess.run([*tls_cli, "-p", str(port), "PING"], capture_output=True, text=True,
                                 timeout=10).stdout.strip() != "PONG":
                if time.monotonic() > deadline:
                    raise ClusterUnavailable(f"TLS node {port} did not answer")
                time.sleep(0.1)
        res = subprocess.run([*tls_cli, "--cluster", "create", *[f"127.0.0.1:{p}" for _, p in nodes], "--cluster-yes"],
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise ClusterUnavailable(f"TLS cluster create failed: {res.stdout[-500:]} {res.stderr[-500:]}")
        while True:
            infos = [subprocess.run([*tls_cli, "-p", str(p), "CLUSTER", "INFO"], capture_output=True, text=True,
                                    timeout=10).stdout for _, p in nodes]
            if all("cluster_state:ok" in i and f"cluster_known_nodes:{primaries}" in i for i in infos):
                return nodes
            if time.monotonic() > deadline + 30:
                raise ClusterUnavailable("TLS cluster not ok in time")
            time.sleep(0.2)
    except BaseException:
        stop_nodes(nodes)
        raise


def stop_nodes(nodes: list[tuple[subprocess.Popen, int]]) -> None:
    for proc, _ in nodes:
        proc.terminate()
    for proc, _ in nodes:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
