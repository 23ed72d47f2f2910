"""The one dead-letter writer of the consumers that acknowledge on their own (`export otlp`,
`export postgres` and every later sink; issue 33 item 1).

A dead letter and the acknowledgement of the entry it stands for are one step
(deadletter_ack.lua): a dead letter exists iff its entry is acknowledged, even when the XADD fails
(a MULTI would run the XACKs anyway). The same step applies the one retention rule: each XADD trims
the dead-letter stream by MINID to DEADLETTER_RETENTION_HOURS (default TOPIC_RETENTION_HOURS), so
no dead-letter stream grows until an operator trims it. The record is contracts/deadletters.py's,
with the entry's own fields in `raw.*`, so an entry can be resent after a fix.

The worker's dead letters are the exception, on purpose: they are written by its commit script
(services/worker/commit.lua), atomically with the batch's outputs, and trimmed by its housekeeping
with the same retention setting.

One object for both client kinds: with an asyncio client the call returns an awaitable (redis-py's
registered script), with a synchronous one the reply.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from contracts.deadletters import DeadLetter

DEADLETTER_ACK_LUA = resources.files("services.streams").joinpath("deadletter_ack.lua").read_text()


def retention_minid(now_s: float, retention_hours: float | None) -> str:
    """The MINID below which dead letters are trimmed ("" with no retention: keep them all)."""
    if retention_hours is None:
        return ""
    return f"{max(0, int((now_s - retention_hours * 3600) * 1000))}-0"


def script_args(group: str, minid: str, letters: Sequence[DeadLetter], acks: Mapping[str, Sequence[str]]) -> list[Any]:
    """ARGV of deadletter_ack.lua (its header says the layout); KEYS are the dead-letter stream, then `acks`'s streams."""
    args: list[Any] = [group, minid, len(letters)]
    for letter in letters:
        fields = [part for pair in letter.to_fields().items() for part in pair]
        args += [len(fields), *fields]
    for ids in acks.values():
        args += [len(ids), *ids]
    return args


class DeadLetterWriter:
    """`write(dead_stream, letters, acks)`: XADD `letters` (trimming by age) and XACK `acks`
    ({stream: ids}, all in `dead_stream`'s hash slot) in one script."""

    def __init__(self, client: Any, group: str, retention_hours: float | None) -> None:
        self.client = client
        self.group = group
        self.retention_hours = retention_hours
        self._script: Any = None  # registered on first use

    def write(self, dead_stream: str, letters: Sequence[DeadLetter], acks: Mapping[str, Sequence[str]] | None = None,
              now_s: float | None = None) -> Any:
        acks = {stream: ids for stream, ids in (acks or {}).items() if ids}
        if self._script is None:
            self._script = self.client.register_script(DEADLETTER_ACK_LUA)
        minid = retention_minid(time.time() if now_s is None else now_s, self.retention_hours)
        return self._script(keys=[dead_stream, *acks], args=script_args(self.group, minid, letters, acks))
