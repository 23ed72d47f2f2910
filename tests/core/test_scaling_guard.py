"""The linear-time guard (tests/support/scaling.py) tells quadratic work from linear work."""

from __future__ import annotations

import pytest

from tests.support.scaling import assert_scales_linearly


def _quadratic(text: str) -> int:
    # every prefix scanned again: the shape of the backtracking the guarded tests exclude
    return sum(text.count("a", 0, i) for i in range(0, len(text), 50))


def test_quadratic_work_fails_the_guard():
    with pytest.raises(AssertionError, match="linear is about 4"):
        assert_scales_linearly(_quadratic, lambda n: "a" * n, 200_000)


def test_linear_work_passes_the_guard():
    assert_scales_linearly(lambda text: text.count("a"), lambda n: "ab" * n, 2_000_000)
