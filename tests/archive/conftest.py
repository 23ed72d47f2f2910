"""The archive tests' S3 endpoint: moto's server on loopback with the test bucket made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3_server import TEST_BUCKET, S3Server, start_s3


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    server = start_s3(tmp_path / "moto")
    try:
        server.create_bucket(TEST_BUCKET)
        yield server
    finally:
        server.close()
