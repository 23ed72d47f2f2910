"""One readiness type for every process that serves /readyz: ok, or one line saying why not.

A leaf module (it imports nothing of the project) so that the broker's cluster gate
(services/broker/cluster.py) and the metrics server (services/metrics/server.py) use the same type
as the consumers (services/streams/readiness.py re-exports it with the consumers' freshness rule)
without services/broker and services/streams importing each other.
"""

from __future__ import annotations

from typing import NamedTuple


class Readiness(NamedTuple):
    """/readyz's answer: ok, or one line saying why not. Falsy when not ready, so `if readiness:`
    reads naturally and the metrics server shows its `reason`."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


READY = Readiness(True, "")


def not_ready(reason: str) -> Readiness:
    return Readiness(False, reason)
