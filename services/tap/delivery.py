"""A run's publisher, opened after the checks and closed once delivered (or given up on, said in one line).

Shared by `tap`, `publish` and `spool --drain`: the exit codes of a publisher that cannot be opened
(1: the spool; 2: the configuration) and the last line that says where undelivered entries wait
and how to deliver them are the same whichever command opened it.
"""

from __future__ import annotations

import socket
import threading
import time

from services.broker.url import redact_url
from services.settings import Settings
from services.tap.console import PROG, err, log
from services.tap.credentials import NO_BROKER, broker_configured, check_before_start
from services.tap.publisher import Publisher
from services.tap.spool import SpoolCorrupt, SpoolLocked


def run_labels(settings: Settings, agent: str | None) -> dict[str, str]:
    found = {"host": settings.host_label or socket.gethostname()}
    if agent:
        found["agent"] = agent
    return found


def open_publisher(settings: Settings, run: str, labels: dict[str, str], input_format: str | None) -> Publisher | int:
    """The run's publisher, or the exit code after the line that says why there is none."""
    if not broker_configured(settings):
        err(NO_BROKER)
        return 2
    check_before_start(settings, run)
    try:
        pub = Publisher(settings, run, labels, format=input_format)
    except (SpoolLocked, SpoolCorrupt) as exc:
        err(str(exc))
        return 1
    except OSError as exc:
        err(f"cannot use the spool directory {settings.spool_dir}: {exc}")
        return 1
    except ValueError as exc:  # e.g. a malformed broker URL (redis-py's message does not echo it)
        err(f"invalid broker URL {redact_url(settings.redis_url)}: {exc}")
        return 2
    if pub.resumed:
        log.info("resuming run %s from its spool %s: next seq %d, %d entries not yet confirmed",
                 run, pub.spool_dir, pub.next_seq, pub.pending)
    return pub


def drain(pub: Publisher, timeout: float | None, abort: threading.Event) -> bool:
    """Wait until everything is delivered (or timeout / abort), then close. True when delivered."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ok = False
    while not abort.is_set():
        step = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        if pub.flush(step):
            ok = True
            break
        if not pub.sender_alive:  # it failed (logged): waiting longer would spin forever
            break
        if pub.refusal is not None:
            # the gateway refused the token, the run key or the endpoint (401/403/404): no outage, so no
            # wait for one (a CI job would hang until its own timeout); the entries stay spooled
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
    ok = pub.close(timeout=None if ok else 0)
    if not ok:
        url = redact_url(pub.settings.endpoint or pub.settings.redis_url)
        noun, down = pub.target
        why = pub.refusal or (f"{noun} {url} answered {pub.last_answer}" if pub.last_answer else f"{noun} {url} {down}")
        then = (f" or, if it will never be accepted, delete them with `{PROG} spool --discard {pub.run}`"
                if pub.refusal else "")
        err(f"{pub.pending} entries of run {pub.run} are not delivered yet ({why}); they are kept in "
            f"{pub.spool_dir}: deliver them with `{PROG} publish --run {pub.run} --drain`{then}")
    return ok
