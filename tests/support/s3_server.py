"""An S3 endpoint on loopback for the archive's tests: moto's server mode (`moto_server`), the most
real S3 HTTP API that runs here (../shared/notes), driven through the same client code as production.

`S3Server.pause()` / `resume()` (SIGSTOP / SIGCONT) make the store hang without losing what it holds
(moto keeps objects in memory: a restart would lose them), which is what "the store is down" means
to a client: connections that never answer, then time out.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from services.broker.embedded import free_port

ACCESS_KEY = "goose-test-key"  # moto accepts any credentials unless told to check them
SECRET_KEY = "goose-test-secret"
REGION = "us-east-1"


def _moto_server() -> str:
    found = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(found).exists():
        raise RuntimeError("moto_server not found: pip install 'moto[server]' (the test extra)")
    return found


TEST_BUCKET = "goose-archive-test"  # the bucket tests/archive/conftest.py makes


@dataclass
class S3Server:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    paused: bool = field(default=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The standard AWS variables a production deployment would set (endpoint, region, credentials)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, **extra}

    def client(self):  # boto3: the tests' independent view of the bucket (not the code under test)
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def close(self) -> None:
        if self.paused:
            self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_s3(workdir: Path, timeout: float = 60.0) -> S3Server:
    """Start moto_server on a free loopback port and wait until it answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "moto.log"
    port = free_port()
    env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([_moto_server(), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
    server = S3Server(port, proc, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=2):
                return server
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                server.close()
                raise RuntimeError(f"moto_server did not start: {log.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.2)
