"""The agent output formats (extension section 1) as one table of plain data: one row per format.

Everything outside the mapping itself that names a format reads this table: the tap (which
command or npm package is which format), the workers' format decision (F2 agent products, F3 the
first JSON object's record type), the exit error's product name, the demo's transcripts, and the
checks that hold ``contracts.events.InputFormat``, ``services/native.py``'s compiled modules and
the Grafana dashboard's `format` variable equal to it (tests/core/test_formats_registry.py). Adding a
format is a row here plus its module ``services/normalizer/formats/<module>.py`` (docs/architecture.md,
"How to add a format").

Plain tuples and strings, no imports beyond ``typing``: the tap reads this module and must not pay
for the contract's pydantic models (``contracts.events``).
"""

from __future__ import annotations

from typing import NamedTuple


class AgentFormat(NamedTuple):
    """One input format: what names it and how it is recognised."""

    # The `format` label of raw entries and run records (a value of contracts.events.InputFormat).
    name: str
    # The CLI's name in "<product> exited with code N".
    product: str
    # Its mapping module: services/normalizer/formats/<module>.py (its ``RULES``).
    module: str
    # F2: product parts of an `agent` label (before any `/`, lower-cased) that name this format.
    agent_products: tuple[str, ...]
    # Executables (basename) of the CLI, recognised by the tap through launchers.
    commands: tuple[str, ...]
    # npm packages the CLI ships in (`npx @openai/codex ...`), recognised by the tap.
    packages: tuple[str, ...]
    # F3: `type`s of a run's first JSON object that name this format.
    record_types: tuple[str, ...] = ()
    # F3: `type`s that name it only when the object also has a string `subtype`.
    subtyped_record_types: tuple[str, ...] = ()
    # F3: `type` prefixes that name it.
    type_prefixes: tuple[str, ...] = ()
    # F3: `type`s that name it only when the object also has a string under ``record_key`` (a key no
    # other row's records have: gemini-cli's `init` with `session_id`, opencode's records with
    # `sessionID`), so record types it shares with another CLI (`error`, `message`) never decide alone.
    keyed_record_types: tuple[str, ...] = ()
    record_key: str = ""
    # The OpenTelemetry `gen_ai.provider.name` of the model service the CLI talks to, when it talks to
    # one only (GenAI semantic conventions' well-known values); "" when it can use any provider.
    provider: str = ""
    # The shared fixture (../shared/fixtures/<name>/) the demo shows for this format.
    demo_transcript: str = "a-read-edit-test.jsonl"


GOOSE = "goose"
CLAUDE_CODE = "claude-code"
CODEX = "codex"
GEMINI_CLI = "gemini-cli"
OPENCODE = "opencode"

AGENT_FORMATS: tuple[AgentFormat, ...] = (
    AgentFormat(
        name=GOOSE,
        product="goose",
        module="goose",
        agent_products=("goose",),
        commands=("goose",),
        packages=(),
    ),
    AgentFormat(
        name=CLAUDE_CODE,
        product="claude",
        module="claude_code",
        agent_products=("claude", "claude-code"),
        commands=("claude",),
        packages=("@anthropic-ai/claude-code",),
        provider="anthropic",
        record_types=("assistant", "user", "result", "stream_event", "rate_limit_event"),
        subtyped_record_types=("system",),
    ),
    AgentFormat(
        name=CODEX,
        product="codex",
        module="codex",
        agent_products=("codex", "codex-cli", "codex-exec"),
        commands=("codex",),
        packages=("@openai/codex",),
        type_prefixes=("thread.", "turn.", "item."),
        provider="openai",
    ),
    AgentFormat(
        name=GEMINI_CLI,
        product="gemini",
        module="gemini_cli",
        agent_products=("gemini", "gemini-cli"),
        commands=("gemini",),
        packages=("@google/gemini-cli",),
        # G-F2: only `init` (always its first line); `message` is goose's type too, `result` Claude's.
        keyed_record_types=("init",),
        record_key="session_id",
        provider="gcp.gemini",
        demo_transcript="tools.jsonl",
    ),
    AgentFormat(
        name=OPENCODE,
        product="opencode",
        module="opencode",
        agent_products=("opencode",),
        commands=("opencode",),
        packages=("opencode-ai",),
        # O-F2: the camelCase `sessionID` tells its `error` from goose's, its `tool_use` from Claude's.
        keyed_record_types=("step_start", "step_finish", "text", "reasoning", "tool_use", "error"),
        record_key="sessionID",
        demo_transcript="tools.jsonl",
    ),
)

# F3's fallback (a first JSON object no row names), and the format of states written before
# formats existed: goose was the only input then.
DEFAULT_FORMAT = GOOSE

FORMAT_NAMES: tuple[str, ...] = tuple(f.name for f in AGENT_FORMATS)
BY_NAME: dict[str, AgentFormat] = {f.name: f for f in AGENT_FORMATS}
# F2: product part of an `agent` label -> format.
BY_AGENT_PRODUCT: dict[str, str] = {p: f.name for f in AGENT_FORMATS for p in f.agent_products}
# The tap: executable basename / npm package -> format.
BY_COMMAND: dict[str, str] = {c: f.name for f in AGENT_FORMATS for c in f.commands}
BY_PACKAGE: dict[str, str] = {p: f.name for f in AGENT_FORMATS for p in f.packages}
