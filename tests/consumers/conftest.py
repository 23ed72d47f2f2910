"""Runs each contract case for every selected consumer side by side (one thread per consumer and
case, each in a redis-server of its own) the first time a test asks for it, and hands each test its
consumer's outcome. Cases that wait out a long outage share one window: `redis_full` and
`target_down` start together (and `rollback` with them), so the folder's wall time is about one
outage, not five."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from tests.consumers.cases import CASES, Outcome

# Cases started together: the long outages share one wall-clock window, and the rollback (a few
# minutes of its own, mostly waiting) runs inside it rather than after it.
_LONG = ("redis_full", "target_down", "rollback")
WINDOWS: dict[str, tuple[str, ...]] = {case: _LONG for case in _LONG}
_lock = threading.Lock()
_results: dict[tuple[str, str], Outcome | BaseException] = {}


def _wanted(session: pytest.Session, case: str) -> set[str]:
    """The consumers whose test of `case` is selected in this session."""
    names = set()
    for item in session.items:
        cls = getattr(item, "cls", None)
        consumer = getattr(cls, "consumer", None)
        if consumer is not None and getattr(item, "originalname", item.name) == f"test_{case}" and cls.applies(case):
            names.add(consumer.name)
    return names


@pytest.fixture(scope="session")
def contract_outcomes(request):
    """outcome(case, consumer) -> Outcome, running the case's window on first use."""
    from tests.consumers.harness import CONSUMERS, background

    # Not under pytest's basetemp: other pytest sessions on this machine prune old basetemps, and a
    # redis-server or PostgreSQL of a long case must not lose its directory mid-run.
    root = Path(tempfile.mkdtemp(prefix="goose-contract-"))
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))

    def outcome(case: str, consumer: str) -> Outcome:
        with _lock:
            if (case, consumer) not in _results:
                jobs = []
                for each in WINDOWS.get(case, (case,)):
                    for name in sorted(_wanted(request.session, each) | ({consumer} if each == case else set())):
                        if (each, name) in _results:
                            continue
                        tmp = root / each / name.replace(" ", "-")
                        fn = CASES[each]
                        thread, box = background(lambda fn=fn, c=CONSUMERS[name], tmp=tmp: fn(c, tmp))
                        jobs.append(((each, name), thread, box))
                for key, thread, box in jobs:
                    thread.join()
                    _results[key] = box.get("error") or box["value"]
        result = _results[(case, consumer)]
        if isinstance(result, BaseException):
            raise result
        return result

    return outcome
