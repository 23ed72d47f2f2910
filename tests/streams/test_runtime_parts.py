"""The consumer runtime's shared parts (issue 33 item 1): one `Backoff` for every retry loop, one
`Readiness` type with one method name on every consumer, and no retry loop left doubling its own
delay by hand."""

from __future__ import annotations

import ast
import random
import re

import pytest

from services.backoff import Backoff
from services.streams.readiness import Readiness
from tests.support.pipeline import REPO


def test_backoff_doubles_from_start_to_cap_and_resets() -> None:
    b = Backoff(0.5, 5.0)
    assert b.first and b.delay == 0.5
    assert [b.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert not b.first
    b.reset()
    assert b.first and b.next() == 0.5


def test_a_cap_below_the_start_waits_the_start_once_then_the_cap() -> None:
    # the OTLP exporter's group creation with OTLP_RETRY_MAX_S below its first wait, as before
    b = Backoff(0.5, 0.2)
    assert [b.next() for _ in range(3)] == [0.5, 0.2, 0.2]


def test_immediate_retries_the_first_time_at_once_then_doubles() -> None:
    b = Backoff(0.05, 1.0, immediate=True)
    assert b.delay == 0.0
    assert [b.next() for _ in range(7)] == [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_jitter_draws_below_the_doubling_bound() -> None:
    random.seed(7)
    b = Backoff(0.008, 0.2, jitter=True)
    bounds = [0.008, 0.016, 0.032, 0.064, 0.128, 0.2, 0.2]
    waits = [b.next() for _ in bounds]
    assert all(0 <= w <= bound for w, bound in zip(waits, bounds, strict=True))
    assert len(set(waits)) == len(waits)  # drawn, not the bound itself


@pytest.mark.parametrize("start, cap", [(0, 1.0), (-1, 1.0), (0.5, 0)])
def test_a_backoff_without_a_positive_start_and_cap_is_refused(start: float, cap: float) -> None:
    with pytest.raises(ValueError, match="positive start and cap"):
        Backoff(start, cap)


# the consumers, and the two loops outside them that retry a broker (the tap's publisher, the broker's
# wait_for_broker): services/backoff.py is a leaf all of them import
CONSUMER_PACKAGES = ("services/worker", "services/export", "services/archive", "services/streams", "services/tap",
                     "services/broker")


def test_no_consumer_retry_loop_doubles_its_own_delay() -> None:
    """Each loop of the consumers takes its waits from a Backoff: a `x = min(x * 2, cap)` written
    again would be a sixteenth rule (and the place a reset gets forgotten)."""
    doubling = re.compile(r"=\s*min\(\s*(max\()?\s*\w+\s*\*\s*2\b")
    offenders = [f"{p.relative_to(REPO)}:{n}" for pkg in CONSUMER_PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if doubling.search(line)]
    assert offenders == []


def test_start_retry_max_is_defined_once() -> None:
    defined = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "services").rglob("*.py"))
               if re.search(r"^START_RETRY_MAX_S\s*=", p.read_text(), re.M)]
    assert defined == ["services/streams/groups.py"]


READINESS_OWNERS = {  # the object each consumer's /readyz asks, by its one method name
    "services/worker/housekeeping.py": "Housekeeper",
    "services/broker/cluster.py": "BrokerGate",
    "services/export/otlp/app.py": "ExporterHealth",
    "services/export/postgres/sink.py": "Sink",
    "services/archive/consumer.py": "Archiver",
}


@pytest.mark.parametrize("path, cls", sorted(READINESS_OWNERS.items()))
def test_every_consumer_answers_readiness_by_one_method_returning_readiness(path: str, cls: str) -> None:
    tree = ast.parse((REPO / path).read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    assert found, f"{cls} not in {path}"
    methods = {f.name: f for f in found[0].body if isinstance(f, ast.FunctionDef)}
    assert "readiness" in methods
    assert ast.unparse(methods["readiness"].returns) == "Readiness"
    assert not {"is_ready", "__call__"} & set(methods)  # no second name for the same question


def test_readiness_is_falsy_with_its_reason() -> None:
    r = Readiness(False, "broker away")
    assert not r and r.reason == "broker away"
    assert Readiness(True, "")


# The start sequence (early /healthz, signals, the broker wait) is written in the two shells only:
# services/streams/app_shell.py (worker, `export otlp`) and thread_shell.py (`export postgres`,
# archive, `export jsonl`). The gateway is not a consumer: it checks the broker its own way.
START_PARTS = ("serve_early", "StopOnSignal", "wait_for_broker", "stop_on_signals")
START_SHELLS = {"services/streams/app_shell.py", "services/streams/thread_shell.py", "services/gateway/command.py"}


def test_the_start_sequence_is_written_in_the_shells_only() -> None:
    callers: dict[str, set[str]] = {}
    for path in sorted((REPO / "services").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in START_PARTS:
                    callers.setdefault(rel, set()).add(name)
    assert set(callers) <= START_SHELLS, callers
    assert callers["services/streams/app_shell.py"] == {"serve_early", "StopOnSignal", "wait_for_broker"}


def test_the_app_runtime_runs_and_stops_the_background_with_the_watch() -> None:
    """`started` releases the reads, starts the watch and the consumer's tasks; `stopping` says it
    was asked (exit 0) and cancels them; a subscriber that stopped before is exit 1."""
    import asyncio

    from services.streams.app_shell import AppRuntime

    class Subscriber:
        running = True

    class App:
        exited = 0

        def exit(self) -> None:
            self.exited += 1

    async def scenario(dies: bool) -> tuple[int, bool, bool]:
        runtime, app, sub = AppRuntime(), App(), Subscriber()
        runtime.watch.add("s", sub)
        ran = asyncio.Event()

        async def background() -> None:
            ran.set()
            await asyncio.sleep(3600)

        runtime.started(app, background())
        await asyncio.wait_for(ran.wait(), 5)
        if dies:
            sub.running = False
            for _ in range(100):
                if app.exited:
                    break
                await asyncio.sleep(0.1)
        await runtime.stopping()
        return runtime.exit_code, runtime.all_started.is_set(), all(t.done() for t in runtime.tasks)

    assert asyncio.run(scenario(dies=False)) == (0, True, True)
    assert asyncio.run(scenario(dies=True)) == (1, True, True)
