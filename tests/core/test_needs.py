"""The rule for missing machine tools: a failure under CI, a skip (with its reason) elsewhere."""

from __future__ import annotations

import pytest

from tests.support.needs import missing


def test_a_missing_tool_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="promtool is required under CI"):
        missing("promtool", "apt-get install -y prometheus")


def test_a_missing_tool_is_a_skip_with_its_reason_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"promtool is not available here \(apt-get"):
        missing("promtool", "apt-get install -y prometheus")
