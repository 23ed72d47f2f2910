"""The suite's file order under pytest-xdist (tests/support/file_order.py): longest recorded files
first, each file's tests together and in their order, unknown files after, and a missing or broken
table changes nothing."""

from __future__ import annotations

import json

from tests.support.file_order import load_times, longest_first


def test_recorded_files_go_longest_first_and_keep_their_tests_together_in_order():
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/b.py::t2", "tests/new.py::t"]
    times = {"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/c.py": 1.0}
    order = [ids[i] for i in longest_first(ids, times)]
    assert order == ["tests/b.py::t1", "tests/b.py::t2", "tests/a.py::t1", "tests/a.py::t2", "tests/c.py::t1",
                     "tests/new.py::t"]


def test_without_a_table_the_collection_order_stands():
    ids = ["tests/z.py::a", "tests/a.py::b", "tests/z.py::c"]
    assert longest_first(ids, {}) == [0, 2, 1]  # files together, first-seen order


def test_a_missing_or_broken_table_reads_as_empty(tmp_path):
    assert load_times(tmp_path / "absent.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert load_times(bad) == {}
    bad.write_text(json.dumps(["a list"]))
    assert load_times(bad) == {}
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"tests/a.py": 3, "tests/b.py": "slow"}))
    assert load_times(mixed) == {"tests/a.py": 3.0}


def test_the_committed_table_names_only_files_that_exist():
    from tests.support.file_order import TIMES

    root = TIMES.parent.parent
    times = load_times()
    assert times, f"{TIMES} is missing or empty: the suite would run its longest file whenever xdist reaches it"
    gone = [f for f in times if not (root / f).is_file()]
    assert not gone, f"{TIMES} names files that no longer exist (re-record: docs/performance.md): {gone}"
