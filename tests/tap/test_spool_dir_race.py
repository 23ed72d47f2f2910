"""A tap finishing its run removes the namespace directory of the spool when it became empty; another
tap starting a run at that moment made the directory, lost it, and failed with "cannot use the spool
directory" (a four-worker CI run met it). The spool's directory is made again when that happens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.tap import spool as spool_mod
from services.tap.spool import Spool


def test_a_namespace_directory_removed_between_mkdir_and_open_is_made_again(tmp_path, monkeypatch):
    run_dir = tmp_path / "spool" / "ns" / "run-1"
    real_mkdir = Path.mkdir
    removed = []

    def mkdir_then_lose_it(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self == run_dir and not removed:  # the other tap's close() at the worst moment
            shutil.rmtree(run_dir.parent)
            removed.append(True)

    monkeypatch.setattr(Path, "mkdir", mkdir_then_lose_it)
    s = Spool(run_dir)
    try:
        assert removed and (run_dir / spool_mod.LOCK).exists()
    finally:
        s.close(remove=True)
    assert not run_dir.exists() and not run_dir.parent.exists()  # the namespace dir went with its last run


def test_a_directory_that_cannot_be_made_still_fails(tmp_path, monkeypatch):
    def always_lost(self, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(Path, "mkdir", always_lost)
    with pytest.raises(FileNotFoundError):
        Spool(tmp_path / "spool" / "ns" / "run-1")
