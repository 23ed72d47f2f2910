"""One readiness type for every consumer: ok, or one line saying why not (what /readyz shows).

The type is services/readiness.py's (a leaf: the broker's cluster gate and the metrics server use
it too), re-exported here; every consumer answers it from one method, `readiness()`. `fresh` is
the one rule for "housekeeping has reached the broker recently" that every consumer's readiness
includes.
"""

from __future__ import annotations

from services.readiness import READY, Readiness, not_ready

# Housekeeping that has not reached the broker for this many sweeps (at least FRESH_FLOOR_S) makes
# a consumer not ready: one missed sweep is load, three are an outage.
FRESH_SWEEPS = 3
FRESH_FLOOR_S = 15.0


def fresh(last_ok: float, now: float, sweep_interval_s: float) -> bool:
    """Housekeeping reached the broker recently enough (monotonic seconds)."""
    return now - last_ok < max(FRESH_SWEEPS * sweep_interval_s, FRESH_FLOOR_S)


__all__ = ["FRESH_FLOOR_S", "FRESH_SWEEPS", "READY", "Readiness", "fresh", "not_ready"]
