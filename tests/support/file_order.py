"""Longest files first (a pytest plugin, registered by tests/conftest.py).

The suite runs file by file on pytest-xdist workers (`--dist loadfile`); xdist hands files out in
collection order (with `--no-loadscope-reorder`; its default order is by number of tests, which
puts a 40-test file holding a 10-minute window after hundreds of fast parametrized cases). The
wall time of such a run is at least its longest file and at most the longest file started last:
handing out the longest files first (LPT scheduling) keeps the end of the run short.

The order comes from `tests/file_times.json`: seconds per file, as measured by the suite itself with
`--record-file-times tests/file_times.json` (setup + call + teardown of every test, summed per file).
A file not in it (new since the last recording) keeps its place after the recorded ones. The table
only orders; a stale one costs time, never a test.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

TIMES = Path(__file__).resolve().parent.parent / "file_times.json"


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_times(path: Path = TIMES) -> dict[str, float]:
    """The recorded table, or {} when it is missing or unreadable (the order is an optimisation)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def longest_first(nodeids: list[str], times: dict[str, float]) -> list[int]:
    """Indices of `nodeids` reordered: recorded files by descending time, then the others, each file's
    tests kept together and in their own order. Deterministic: every xdist worker must collect the
    same order."""
    first_seen: dict[str, int] = {}
    for i, nodeid in enumerate(nodeids):
        first_seen.setdefault(_file_of(nodeid), i)

    def key(i: int) -> tuple[int, float, int, int]:
        f = _file_of(nodeids[i])
        known = f in times
        return (0 if known else 1, -times.get(f, 0.0), first_seen[f], i)

    return sorted(range(len(nodeids)), key=key)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-file-times", metavar="PATH", default=None,
                     help="write seconds per test file (setup+call+teardown) to PATH as JSON (tests/file_times.json)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    times = load_times()
    if not times:
        return
    order = longest_first([item.nodeid for item in items], times)
    items[:] = [items[i] for i in order]


class FileTimes:
    """Sums report durations per file in the process that sees every report (the xdist controller,
    or the only process without xdist) and writes them at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        table = {f: round(s, 1) for f, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        self.path.write_text(json.dumps(table, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-file-times")
    if path and not hasattr(config, "workerinput"):  # a worker sees only its own files
        config.pluginmanager.register(FileTimes(Path(path)), "goose-file-times")
