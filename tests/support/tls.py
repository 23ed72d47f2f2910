"""TLS for the tests: a throw-away CA with a server and a client certificate (openssl CLI), a second CA
that signed nothing the server uses (the "wrong CA"), and a redis-server with a TLS port.

The server also keeps its plain port: tests read what a command wrote through it, and point a
``rediss://`` URL at it to play a server that does not speak TLS.
"""

from __future__ import annotations

import shutil
import subprocess
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
    (dir / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (dir / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        _openssl("req", *key_args, "-keyout", dir / f"{who}-key.pem", "-out", dir / f"{who}.csr",
                 "-subj", f"/CN={'localhost' if who == 'server' else 'goose-ingest test client'}")
        _openssl("x509", "-req", "-in", dir / f"{who}.csr", "-CA", dir / "ca.pem", "-CAkey", dir / "ca-key.pem",
                 "-CAcreateserial", "-out", dir / f"{who}.pem", "-days", "2", "-extfile", dir / f"{who}.ext")
    return TlsFiles(ca=dir / "ca.pem", server_cert=dir / "server.pem", server_key=dir / "server-key.pem",
                    client_cert=dir / "client.pem", client_key=dir / "client-key.pem", other_ca=dir / "other-ca.pem")


def tls_server_args(files: TlsFiles, tls_port: int, auth_clients: str = "no") -> list[str]:
    """redis-server options for a TLS port; `auth_clients` is --tls-auth-clients (no, optional, yes)."""
    return ["--tls-port", str(tls_port), "--tls-cert-file", str(files.server_cert),
            "--tls-key-file", str(files.server_key), "--tls-ca-cert-file", str(files.ca),
            "--tls-auth-clients", auth_clients]


def start_tls_redis(dir: Path, files: TlsFiles, auth_clients: str = "no") -> tuple[EmbeddedRedis, int]:
    """A redis-server with a TLS port (returned) beside its plain one (``server.port``)."""
    tls_port = free_port()
    return start_redis(dir=str(dir), extra_args=tls_server_args(files, tls_port, auth_clients)), tls_port
