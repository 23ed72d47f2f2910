"""Arize Phoenix, a real trace backend, as a local process on loopback for the OTLP tests.

Phoenix has many dependencies of its own, so it lives in its own venv (``.venv-phoenix`` beside
``.venv``) where they cannot clash with ours. `.ci/run` installs it with
``python -m tests.support.phoenix_server --install``; a test that finds it missing installs it the
same way (one pip command).

Phoenix ingests OTLP over HTTP at ``/v1/traces`` and answers span queries at
``/v1/projects/<project>/spans``; the project is the resource attribute
``openinference.project.name``, so each test gets a project of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("GOOSE_INGEST_PHOENIX_VENV", REPO / ".venv-phoenix"))
PHOENIX_REQUIREMENT = "arize-phoenix==20.26.1"  # the version the tests were written against
PROJECT_ATTRIBUTE = "openinference.project.name"
START_TIMEOUT_S = 180.0


class PhoenixUnavailable(RuntimeError):
    pass


def phoenix_bin() -> Path:
    return VENV / "bin" / "phoenix"


def install() -> Path:
    """Create the Phoenix venv if it is missing (one pip command); returns the `phoenix` script."""
    if phoenix_bin().exists():
        return phoenix_bin()
    python = shutil.which("python3") or sys.executable
    try:
        subprocess.run([python, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", PHOENIX_REQUIREMENT], check=True, capture_output=True,
                       timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        out = getattr(exc, "stderr", b"") or b""
        raise PhoenixUnavailable(f"cannot install {PHOENIX_REQUIREMENT} into {VENV}: {out.decode(errors='replace')[-500:]}") from exc
    return phoenix_bin()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Phoenix:
    """A running Phoenix; `endpoint` takes OTLP/HTTP, `spans(project)` reads them back."""

    def __init__(self, workdir: Path) -> None:
        script = install()
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoint = f"{self.url}/v1/traces"
        self.grpc_port = free_port()
        self.grpc_endpoint = f"http://127.0.0.1:{self.grpc_port}"  # OTLP/gRPC
        self.log_path = workdir / "phoenix.log"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))},
            "PHOENIX_WORKING_DIR": str(workdir),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",  # no network here, and none wanted
        }
        self.proc = subprocess.Popen([str(script), "serve"], env=env, stdout=self.log_path.open("wb"),
                                     stderr=subprocess.STDOUT, cwd=workdir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PhoenixUnavailable(f"phoenix exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.close()
        raise PhoenixUnavailable(f"phoenix did not answer within {START_TIMEOUT_S}s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as resp:
            return json.load(resp)

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of the project (REST API, paginated); [] while the project does not exist."""
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = "limit=1000" + (f"&cursor={cursor}" if cursor else "")
            try:
                page = self.get(f"/v1/projects/{project}/spans?{query}")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return []
                raise
            out.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    if "--install" in sys.argv[1:]:
        started = time.monotonic()
        print(f"phoenix: {install()} ({time.monotonic() - started:.0f}s)")
    else:
        print("usage: python -m tests.support.phoenix_server --install", file=sys.stderr)
        sys.exit(2)
