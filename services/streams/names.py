"""Consumer names: unique per process for consumers that hand their pending entries to the group's
reclaim (the worker, `export otlp`: a restarted process must never inherit a dead one's identity
by accident), stable per host for one that re-reads its own pending entries on restart
(`export postgres`: its predecessor's unacknowledged batch is its first work)."""

from __future__ import annotations

import os
import socket
import uuid


def unique_consumer(prefix: str = "") -> str:
    """`[<prefix>-]<hostname>-<pid>-<6 hex>`."""
    name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return f"{prefix}-{name}" if prefix else name


def stable_consumer(prefix: str) -> str:
    """`<prefix>-<hostname>`: the same after a restart on the same host (or pod name)."""
    return f"{prefix}-{socket.gethostname()}"
