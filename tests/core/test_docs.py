"""The README keeps its promises: the two opening commands, and every setting documented."""

from __future__ import annotations

import re

from services.settings import Settings
from tests.support.fixtures import REPO

README = (REPO / "README.md").read_text()


def test_readme_opens_with_the_run_and_test_commands_and_ci_runs_the_test_command():
    block = re.search(r"```sh\n(.*?)\n```", README, re.S).group(1).splitlines()
    assert "goose-ingest demo" in block[0]
    assert "pytest" in block[1]
    assert block[1] in (REPO / ".ci" / "run").read_text()


def test_every_setting_is_in_the_readme():
    documented = set(re.findall(r"^\| `([A-Z_]+)`", README, re.M))
    documented |= {n for row in re.findall(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \|", README, re.M)
                   for n in re.findall(r"`([A-Z_]+)`", row)}
    fields = {name.upper() for name in Settings.model_fields}
    assert fields - documented == set()
