"""One backoff for every retry loop (issue 33 item 1): a start, a cap, doubling between the two,
optional full jitter, and a reset when a try succeeds.

A leaf module (it imports nothing of the project), like services/readiness.py, so that the consumers
(services/streams/ and up), the broker's `wait_for_broker` (services/broker/, which services/streams
imports) and the tap's publisher (a light client that loads no consumer code) use the same rule
without those packages importing each other.

Before, about fifteen loops each kept a `delay` variable and doubled it by hand, each with its own
start and cap (and `START_RETRY_MAX_S` was defined twice); a loop that forgot the reset after a
success waited the cap after the next failure. The numbers stay each loop's own (they are tuned to
what it waits for: a broker restart, a database failover, a commit conflict); the rule is shared.

Pure (no clock, no sleep): the caller waits `next()` seconds however it waits (asyncio.sleep, an
Event's wait that a stop cuts short).
"""

from __future__ import annotations

import random


class Backoff:
    """`next()` gives the wait before the next try: `start`, then doubling up to `cap` (a cap below
    the start: `start` once, then `cap`).

    `jitter`: the wait is drawn uniformly from [0, that] ("full jitter": contending writers, e.g.
    two workers whose commits conflict, do not retry in lock step). `immediate`: the first retry
    waits 0 (a blip is retried at once), the doubling starts with the second."""

    __slots__ = ("start", "cap", "jitter", "immediate", "_delay", "_tries")

    def __init__(self, start: float, cap: float, *, jitter: bool = False, immediate: bool = False) -> None:
        if start <= 0 or cap <= 0:
            raise ValueError(f"backoff needs a positive start and cap (got start={start}, cap={cap})")
        self.start = start
        self.cap = cap
        self.jitter = jitter
        self.immediate = immediate
        self._delay = start
        self._tries = 0

    @property
    def delay(self) -> float:
        """What `next()` answers next (its upper bound with jitter): for a log line or a deadline."""
        return 0.0 if self.immediate and self._tries == 0 else self._delay

    @property
    def first(self) -> bool:
        """No wait was taken since the start or the last reset (one log line per outage, not per try)."""
        return self._tries == 0

    def next(self) -> float:
        """The wait before the next try; the one after it is longer (up to `cap`)."""
        wait = self.delay
        if not (self.immediate and self._tries == 0):
            self._delay = min(self._delay * 2, self.cap)
        self._tries += 1
        return random.uniform(0, wait) if self.jitter else wait

    def reset(self) -> None:
        """A try succeeded: the next failure starts from `start` again."""
        self._delay = self.start
        self._tries = 0
