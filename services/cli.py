"""`goose-ingest` command line: one subcommand per module that registers itself."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes register(subparsers); the parser it adds sets `func(args) -> int`.
_COMMAND_MODULES = [
    "services.normalizer.command",
    "services.tap.commands",
    "services.worker.command",
    "services.replay.command",
    "services.tail.command",
    "services.embedded.command",
    "services.backfill.command",
    "services.export.command",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goose-ingest",
        description="Telemetry pipeline for goose agents: tap their stream-json output into Redis Streams, "
        "normalize it into harness events, republish them on typed topics. See README.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name or (exc.name and name.startswith(exc.name + ".")):
                continue  # that part of the service is not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from redis.exceptions import ConnectionError as RedisConnectionError

    try:
        return int(args.func(args) or 0)
    except RedisConnectionError as exc:
        from services.broker.helpers import redact_url
        from services.settings import Settings

        url = redact_url(Settings().redis_url)
        print(f"goose-ingest {args.command}: broker {url} unreachable ({exc.__class__.__name__})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
