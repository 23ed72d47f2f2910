"""One rule for tests that need a tool of the machine (promtool, Phoenix, PostgreSQL, a cluster...).

`.ci/run` installs or starts every such tool, so under CI its absence is a failure; on a
developer's machine without it the test is skipped, saying what is missing and how to get it.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str, how: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required under CI ({how})")
    pytest.skip(f"{what} is not available here ({how})")
