"""`goose-ingest export <target>`: one subcommand per exporter package that registers itself."""

from __future__ import annotations

import argparse
import importlib

from contracts.consumers import CONSUMERS

# The `export <target>` rows of contracts/consumers.py; each module exposes register(subparsers)
# like the top-level commands.
_EXPORTER_MODULES = [c.module for c in CONSUMERS if c.command.startswith("export ")]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "export",
        help="export the harness topics to another system ("
        + ", ".join(c.command.removeprefix("export ") for c in CONSUMERS if c.command.startswith("export ")) + ")",
        description="Consume harness.events and harness.runs (every partition) with a consumer group of "
        "the exporter's own and write them to another system.",
    )
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name in _EXPORTER_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name or (exc.name and name.startswith(exc.name + ".")):
                continue  # that exporter is not built yet
            raise
        module.register(targets)
