"""Every test of this folder starts real worker/tap processes against a real Redis: marked `e2e`
here, once, so `pytest -m "not e2e"` (or `pytest tests/core`) is the fast loop."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
