"""A guard against super-linear work that does not depend on the machine's speed.

A wall-clock bound ("finishes in 5 s") fails on a loaded 2-core machine and passes a quadratic
algorithm on a fast one. The ratio of two sizes measured in the same process does neither: work
that grows linearly takes about `factor` times as long on the larger input, quadratic work about
`factor`² times, whatever the machine is doing (the best of a few tries filters out the pauses of
a shared CPU). Time is the process's CPU time, which other processes' load does not add to."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Below this, a timing is mostly the clock and the interpreter's noise: a small case is charged at least this.
_NOISE_FLOOR_S = 0.002


def _best_of(fn: Callable[[Any], object], arg: Any, tries: int) -> float:
    best = float("inf")
    for _ in range(tries):
        t0 = time.process_time()
        fn(arg)
        best = min(best, time.process_time() - t0)
    return best


def assert_scales_linearly(fn: Callable[[Any], object], make: Callable[[int], Any], n: int, *,
                           factor: int = 4, tries: int = 5) -> None:
    """`fn(make(n))` takes at most twice the linear share of `fn(make(n // factor))`.

    Linear work gives a ratio near `factor`; quadratic work near `factor`²; the bound, 2 × `factor`,
    sits between them with room for noise."""
    small, large = make(n // factor), make(n)
    fn(small)  # warm caches and lazy compiles before anything is timed
    t_small = max(_best_of(fn, small, tries), _NOISE_FLOOR_S)
    t_large = _best_of(fn, large, tries)
    assert t_large <= 2 * factor * t_small, (
        f"{t_large:.4f} s at n={n} vs {t_small:.4f} s at n={n // factor}: "
        f"ratio {t_large / t_small:.1f}, linear is about {factor}")
