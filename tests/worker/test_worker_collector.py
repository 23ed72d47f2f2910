"""The worker's garbage-collector policy (services/worker/collector.py): applied by every worker
process, before it touches the broker, and only there (the tap, exporters and tools keep CPython's
defaults)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

from services.metrics.server import MetricsPortUnavailable
from services.settings import Settings
from services.worker import collector
from services.worker.collector import GC_THRESHOLDS
from services.worker.serve import serve_worker

REPO_ROOT = collector.__file__.rsplit("/services/", 1)[0]


def _thresholds_after(code: str) -> tuple[int, ...]:
    out = subprocess.run([sys.executable, "-c", f"import gc\n{code}\nprint(*gc.get_threshold())"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60)
    return tuple(int(x) for x in out.stdout.split())


def test_tune_collector_sets_the_documented_thresholds_in_a_fresh_process() -> None:
    default = _thresholds_after("")
    assert default != GC_THRESHOLDS  # otherwise this test could not tell the policy was applied
    assert _thresholds_after("from services.worker.collector import tune_collector\ntune_collector()") == GC_THRESHOLDS


def test_importing_the_worker_does_not_change_the_collector() -> None:
    # Only a running worker applies it: a tool that imports the processor keeps the defaults.
    assert _thresholds_after("import services.worker.app, services.worker.processor") == _thresholds_after("")


def test_serve_worker_applies_the_policy_before_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(collector, "tune_collector", lambda: calls.append("tuned"))
    with socket.socket() as busy:  # the metrics port is taken: serve_worker stops at its first check
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings = Settings(redis_url="redis://127.0.0.1:1/0", metrics_host="127.0.0.1",
                            metrics_port=busy.getsockname()[1])
        with pytest.raises(MetricsPortUnavailable):
            asyncio.run(serve_worker(settings))
    assert calls == ["tuned"]
