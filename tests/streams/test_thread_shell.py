"""The thread consumers' shell (services/streams/thread_shell.py): one watch over the reader thread
of `export postgres`, the archive and `export jsonl`. Real threads and a real consumer loop shape
(an Event it waits on); what the loop does is the consumer's, so a small one stands in here."""

from __future__ import annotations

import logging
import threading

import pytest

from services.streams.readiness import READY, Readiness, not_ready
from services.streams.thread_shell import ThreadShell

log = logging.getLogger("test.thread_shell")
STREAMS = ["harness.events", "harness.runs"]


class Loop:
    """A consumer: waits until stopped, or ends as told (`raises`, `fault_line`, `returns`)."""

    def __init__(self, raises: Exception | None = None, fault_line: str | None = None, returns: bool = False):
        self.stopping = threading.Event()
        self.started = threading.Event()
        self.raises, self.fault_line, self.returns = raises, fault_line, returns

    def readiness(self) -> Readiness:
        return not_ready("stopping") if self.stopping.is_set() else READY

    def stop(self) -> None:
        self.stopping.set()

    def fault(self) -> str | None:
        return self.fault_line

    def run(self) -> None:
        self.started.set()
        if self.raises is not None:
            raise self.raises
        if self.fault_line is not None or self.returns:
            return
        self.stopping.wait()


def _run(shell: ThreadShell) -> tuple[list[int], threading.Thread]:
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(shell.run()))
    t.start()
    return out, t


def test_a_requested_stop_is_exit_0_and_readiness_stays_the_consumers():
    loop = Loop()
    shell = ThreadShell("export jsonl", STREAMS, loop, log)
    out, t = _run(shell)
    assert loop.started.wait(10)
    assert shell.readiness() == READY
    shell.stop()
    t.join(10)
    assert out == [0]
    assert shell.readiness() == not_ready("stopping")


@pytest.mark.parametrize("loop, why", [
    (Loop(raises=KeyError("partition 2026-13")), "KeyError: 'partition 2026-13'"),
    (Loop(fault_line="the writer thread failed: InvalidResponse"), "the writer thread failed: InvalidResponse"),
    (Loop(fault_line="fenced: another archive took over its lease"), "fenced: another archive took over its lease"),
    (Loop(returns=True), "ended unasked"),
], ids=["raised", "thread-failed", "fenced", "returned"])
def test_a_reader_that_died_is_readiness_false_naming_its_streams_and_exit_1(loop, why, caplog):
    shell = ThreadShell("export postgres", STREAMS, loop, log)
    with caplog.at_level(logging.ERROR, logger=log.name):
        out, t = _run(shell)
        t.join(10)
    assert out == [1]
    ready = shell.readiness()
    assert not ready
    assert ready.reason == (f"reader thread stopped on harness.events, harness.runs ({why}): exiting with status 1 "
                            "for a restart")
    assert any("its reader of harness.events, harness.runs stopped; exiting with status 1" in r.getMessage()
               for r in caplog.records)


def test_the_async_consumers_watch_still_says_subscriber_and_no_reason_it_does_not_have():
    from services.streams.watch import ReaderWatch

    class Sub:
        running = False

    watch = ReaderWatch([("goose.raw.0", Sub())])
    watch.consuming = True
    assert watch.readiness().reason == "subscriber stopped on goose.raw.0: exiting with status 1 for a restart"
