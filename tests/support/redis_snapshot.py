"""Restart a test's redis-server from its own RDB snapshot (issue 32: the broker comes back older
than its consumers): SIGKILL, then the same binary, port, directory and arguments again, so it loads
the `dump.rdb` a `SAVE` left there (and its ACL file). Probed with the caller's client: the shipped
ACL turns the `default` user off, which EmbeddedRedis.start probes with."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import redis

from services.broker.embedded import EmbeddedRedis


def restart_from_its_snapshot(server: EmbeddedRedis, client: Callable[[], redis.Redis], timeout: float = 30.0) -> None:
    server.kill()
    args = [server.binary, "--port", str(server.port), "--bind", server.host, "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--dir", server.dir, *server.extra_args]
    with open(server.log_path, "ab") as out:
        server.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client().ping():
                return
        except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError):
            pass
        if time.monotonic() > deadline or server.process.poll() is not None:
            raise RuntimeError(f"redis-server on port {server.port} did not come back from its snapshot")
        time.sleep(0.05)
