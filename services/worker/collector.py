"""The worker's policy for CPython's cyclic garbage collector.

A worker keeps up to `RUN_CACHE_SIZE` run sequencers alive between batches, each a few dozen
container objects, and every batch allocates thousands of short-lived ones (parsed lines, events,
outputs). With CPython's default thresholds (700, 10, 10) a young-generation collection runs every
700 allocations, so the survivors of every batch are promoted quickly and the oldest generation,
which holds the whole run cache, is traversed again and again: with 10,000 active runs that cost
about a quarter of the worker's time (`bench/scale.py --sweep runs`: 0.38 of the 100-run
throughput with the defaults, 0.48-0.56 with the thresholds below; `--gc-thresholds` compares
others).

Nearly everything a batch allocates is freed by reference counting before a collection would
look at it; the collector is only for cycles (asyncio's futures and tracebacks), which are rare.
So: collect the young generation every 20,000 allocations, and the older ones less often. The
cost is the cyclic garbage that waits longer for a collection: ~5 MiB of peak RSS at 100 active
runs (bench/scale.py, 70 -> 75 MiB), and none at 10,000 (the run cache dominates).
"""

from __future__ import annotations

import gc

# (young generation, middle, oldest): allocations before a young collection, then young
# collections per middle one, middle collections per full one. CPython also skips a full
# collection until a quarter of the oldest generation is new since the last one.
GC_THRESHOLDS = (20_000, 20, 100)


def tune_collector() -> None:
    """Apply the worker's thresholds to this process (the worker command and `up` call it)."""
    gc.set_threshold(*GC_THRESHOLDS)
