"""One readiness type for every consumer: ok, or one line saying why not (what /readyz shows).

A NamedTuple that is falsy when not ready, so `if readiness:` reads naturally and the metrics
server (services/metrics/server.py) shows its `reason`. `fresh` is the one rule for "housekeeping
has reached the broker recently" that every consumer's readiness includes.
"""

from __future__ import annotations

from typing import NamedTuple

# Housekeeping that has not reached the broker for this many sweeps (at least FRESH_FLOOR_S) makes
# a consumer not ready: one missed sweep is load, three are an outage.
FRESH_SWEEPS = 3
FRESH_FLOOR_S = 15.0


class Readiness(NamedTuple):
    """/readyz's answer: ok, or one line saying why not."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


READY = Readiness(True, "")


def not_ready(reason: str) -> Readiness:
    return Readiness(False, reason)


def fresh(last_ok: float, now: float, sweep_interval_s: float) -> bool:
    """Housekeeping reached the broker recently enough (monotonic seconds)."""
    return now - last_ok < max(FRESH_SWEEPS * sweep_interval_s, FRESH_FLOOR_S)
