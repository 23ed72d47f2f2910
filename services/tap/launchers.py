"""Which agent CLI a tapped command runs, seen through the launchers in front of it (pure).

`goose`, `claude`, `codex`, `gemini`, `opencode` -- also behind `env`, `npx`, `bunx`, `pnpm dlx`,
`nohup`, `nice`... -- give the run's input `format` and default `agent` label; any other command
only its name, so that its eof is not taken for goose's. Decided from the command line alone: a
command recognised wrongly would label a whole run with the wrong format.
"""

from __future__ import annotations

import os

from contracts.formats import BY_COMMAND, BY_PACKAGE

# Executables (basename) of the agent CLIs and the npm packages they ship in -> the run's format
# (the table of contracts/formats.py: plain data, cheap for a tap to import).
AGENT_COMMANDS = BY_COMMAND
AGENT_PACKAGES = BY_PACKAGE
# Launchers that run their argument as a command: name -> options that take a value.
LAUNCHERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
    "npx": frozenset({"-p", "--package", "-c", "--call"}),
    "bunx": frozenset({"-p", "--package"}),
    "pnpx": frozenset(),
    "nohup": frozenset(),
    "nice": frozenset({"-n", "--adjustment"}),
    "exec": frozenset(),
    "command": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
}
TWO_WORD_LAUNCHERS = {("pnpm", "dlx"), ("yarn", "dlx"), ("npm", "exec"), ("bun", "x")}


def format_of_command(command: list[str]) -> str | None:
    """The input format of the agent CLI `command` runs, or None when it is not one we know.

    Looks through launchers (`env [-i] [VAR=value ...]`, `npx [-y] @anthropic-ai/claude-code`,
    `pnpm dlx`, `nohup`, `nice -n 5`, ...) to the command they start; never guesses from arguments."""
    name, package = _started_command(command)
    if name in AGENT_COMMANDS:
        return AGENT_COMMANDS[name]
    return AGENT_PACKAGES.get(package) if package is not None else None


def command_name(command: list[str]) -> str | None:
    """The name of what `command` starts, through launchers (`env`, `npx`, `nohup`...): the run's
    default `agent` label when it is no agent CLI we know, so its exit is not called goose's."""
    name, package = _started_command(command)
    return (package or name) or None


def prints_one_document(command: list[str]) -> bool:
    """The agent was asked for one JSON document (`goose run`/`claude -p --output-format json`)."""
    for i, arg in enumerate(command):
        if arg == "--output-format=json" or (arg == "--output-format" and command[i + 1:i + 2] == ["json"]):
            return True
    return False


def _started_command(command: list[str]) -> tuple[str, str | None]:
    """(executable basename, npm package name or None) of the command behind the launchers."""
    args = list(command)
    name = ""
    while args:
        name = os.path.basename(args[0])
        if tuple(os.path.basename(a) for a in args[:2]) in TWO_WORD_LAUNCHERS:
            args, name = args[1:], "npx"
        if name in AGENT_COMMANDS:
            return name, None
        package = _package_name(args[0])
        if package in AGENT_PACKAGES:
            return name, package
        if name not in LAUNCHERS:
            return name, None
        takes_value = LAUNCHERS[name]
        rest = args[1:]
        while rest:
            head = rest[0]
            if head == "--":
                rest = rest[1:]
                break
            if head in takes_value:
                rest = rest[2:]
            elif head.startswith("-") or (name == "env" and "=" in head):
                rest = rest[1:]
            else:
                break
        if not rest:
            return "", None  # a launcher with nothing behind it
        args = rest
    return name, None


def _package_name(arg: str) -> str:
    """`@openai/codex@0.46.0` -> `@openai/codex`; `claude@latest` -> `claude`."""
    at = arg.rfind("@")
    return arg[:at] if at > 0 else arg
