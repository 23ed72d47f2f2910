"""The FastStream adapter (services/streams/faststream_adapter.py): every FastStream internal the
consumers touch is there and only there, and `check_faststream` fails the suite, not production,
when an upgrade moves one."""

from __future__ import annotations

import re

from services.streams import faststream_adapter
from services.streams.faststream_adapter import check_faststream
from tests.support.pipeline import REPO


def test_the_installed_faststream_has_every_internal_the_adapter_wraps():
    assert check_faststream() == []


def test_the_check_sees_an_upgrade_that_moved_the_read_call(monkeypatch):
    """Not blind: a FastStream whose read call is renamed, or whose start limit changed, is reported."""
    from faststream.redis.subscriber.usecases.stream_subscriber import StreamBatchSubscriber

    monkeypatch.setattr(faststream_adapter, "READ_CALL", "_xreadgroup_renamed")
    monkeypatch.setattr(faststream_adapter, "FASTSTREAM_START_S", 5.0)
    problems = check_faststream()
    assert any("_xreadgroup_renamed: gone" in p for p in problems), problems
    assert any("no longer reads through self._xreadgroup_renamed" in p for p in problems), problems
    assert any("anyio.fail_after(5.0)" in p for p in problems), problems
    assert hasattr(StreamBatchSubscriber, "_xreadgroup")  # the real class is untouched


def test_the_check_sees_a_read_call_whose_arguments_changed(monkeypatch):
    from faststream.redis.subscriber.usecases.stream_subscriber import StreamBatchSubscriber

    async def positional(self, count, block, noack=False):  # an upgrade that made them positional
        return ()

    monkeypatch.setattr(StreamBatchSubscriber, "_xreadgroup", positional)
    assert any("keyword-only" in p for p in check_faststream())


def test_no_faststream_internal_is_touched_outside_the_adapter():
    """A private FastStream name (`_xreadgroup`, `.usecases.`, FAKE_CONSUMER) in a service module
    other than the adapter would be a second place an upgrade can break unnoticed."""
    internal = re.compile(r"_xreadgroup|faststream\.redis\.subscriber\.usecases|FAKE_CONSUMER|faststream\._internal")
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "services").rglob("*.py"))
                 if p.name != "faststream_adapter.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if internal.search(line)]
    assert offenders == []
