"""`goose-ingest` command line: one subcommand per module that registers itself.

Configuration is checked here, once, before any command runs: every misconfiguration (an
environment variable that does not parse, a broker URL redis-py would reject, a redaction rule
that does not compile, a metrics port already taken...) becomes ONE line on stderr naming the
variable, and exit code 2 -- never a traceback. Commands raise `ConfigError` (or a library error
that means misconfiguration, see `_config_error_types`) and this module prints it.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from services.settings import ENV_PREFIX, ConfigError

PROG = "goose-ingest"
USAGE_ERROR = 2
SUBCOMMAND = "cli_subcommand"  # not "command": `tap` has a positional of that name (the command it wraps)
MISSING = "cli_missing_module"  # set on a command whose module cannot be imported in this install

# The subcommands each module registers: a command line naming one imports only its module (a tap
# must not pay for the worker's FastStream or the exporters' clients). tests/tap/test_tap_conn.py holds
# this map equal to what the modules register. Each module exposes register(subparsers); the parser
# it adds sets `func(args) -> int`.
_MODULE_OF = {
    "normalize": "services.normalizer.command",
    "tap": "services.tap.command",
    "publish": "services.tap.command",
    "spool": "services.tap.command",
    "worker": "services.worker.command",
    "replay": "services.replay.command",
    "tail": "services.tail.command",
    "up": "services.quickstart.command",
    "demo": "services.quickstart.command",
    "import-sessions": "services.backfill.command",
    "export": "services.export.command",
    "acl": "services.broker.acl",
    "runs": "services.runs.command",
    "archive": "services.archive.command",
    "gateway": "services.gateway.command",
    "tokens": "services.gateway.command",
    "reprocess": "services.archive.reprocess_command",
}
# Every command module once, in the order of the map (the order of `--help`): one list, not two.
_COMMAND_MODULES = tuple(dict.fromkeys(_MODULE_OF.values()))

# Values of these settings are never echoed in an error line (credentials, or URLs that may hold them).
_SECRET_HINTS = ("password", "secret", "token", "dsn", "url", "key")
_MAX_SHOWN_VALUE = 60


def _version() -> str:
    from importlib import metadata  # only for --version: it pulls the email and zip packages

    for dist in ("goose-ingest", "goose-ingest-tap"):  # the full install, or the tap-only one
        try:
            return metadata.version(dist) + ("" if dist == "goose-ingest" else " (tap only)")
        except metadata.PackageNotFoundError:
            continue
    return "unknown"  # run from a source tree that was never installed


class _VersionAction(argparse.Action):
    """argparse's "version" action, with the version looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = "show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from services.native import core_kind

        # The core's kind too: "compiled" where the install built it (setup.py), else "pure".
        parser._print_message(f"{PROG} {_version()} (core: {core_kind()})\n", sys.stdout)
        parser.exit()


def _subcommand_in(argv: Sequence[str]) -> str | None:
    """The subcommand a command line names (the top-level options take no values), or None."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
        if arg in ("-h", "--help", "--version"):
            return None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; with `only` (a subcommand name), of that one's module only."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Telemetry pipeline for coding agents (goose, Claude Code, Codex): tap their stream output "
        "into Redis Streams, normalize it into harness events, republish them on typed topics. See README.md.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest=SUBCOMMAND, required=True, metavar="COMMAND")
    for name in (_MODULE_OF[only],) if only in _MODULE_OF else _COMMAND_MODULES:
        try:
            importlib.import_module(name).register(sub)
        except ModuleNotFoundError as exc:
            # The tap-only install (packaging/tap/build.py) has the tap's dependencies only: its other
            # commands are listed, and each says in one line what it needs instead of a traceback.
            for command in (c for c, m in _MODULE_OF.items() if m == name):
                p = sub.add_parser(command, help=f"(needs the full install: {exc.name} is missing)", add_help=False)
                p.add_argument("ignored", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
                p.set_defaults(**{MISSING: exc.name})
    return parser


# --- configuration errors ----------------------------------------------------------------------
def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _shown(field: str, value: Any) -> str:
    if any(h in field for h in _SECRET_HINTS) or not isinstance(value, str | int | float | bool):
        return ""
    text = repr(value)
    return f" = {text[:_MAX_SHOWN_VALUE]}{'…' if len(text) > _MAX_SHOWN_VALUE else ''}"


def describe_validation_error(exc: Any) -> str:
    """One line for a pydantic ValidationError of Settings: every failing variable and why."""
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if not isinstance(x, int)]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if loc:
            field = loc[0]
            parts.append(f"{env_name(field)}{_shown(field, err.get('input'))}: {msg}")
        else:
            parts.append(msg)
    return "; ".join(parts) or str(exc).splitlines()[0]


def describe_settings_error(exc: Exception) -> str:
    """One line for pydantic-settings' SettingsError (a complex value that is not JSON)."""
    from services.settings import Settings

    match = re.search(r'field "([^"]+)"', str(exc))
    if not match:
        return str(exc).splitlines()[0]
    field = match.group(1)
    info = Settings.model_fields.get(field)
    origin = getattr(getattr(info, "annotation", None), "__origin__", None)
    examples: dict[object, str] = {list: 'a JSON list, e.g. ["jwt"]', dict: 'a JSON object, e.g. {"name": "regex"}'}
    expected = examples.get(origin, "JSON")
    return f"{env_name(field)}: not valid JSON (expected {expected})"


# Commands that only write the raw log, which is never redacted: their check skips the redaction rules
# (compiling them costs ~2.5 MiB, a tenth of a tap's memory budget); the workers that redact check them.
_NEVER_REDACT = frozenset({"tap", "publish"})


def _warn_unknown_variables(command: str | None) -> None:
    """One warning line naming every GOOSE_INGEST_* variable no setting reads (a typo keeps the default)."""
    import os

    from services.settings import unknown_env_variables

    unknown = unknown_env_variables(os.environ)
    if not unknown:
        return
    names = ", ".join(f"{name} (did you mean {close}?)" if close else name for name, close in unknown)
    where = f"{PROG} {command}" if command else PROG
    print(f"{where}: warning: ignoring unknown environment variable{'s' if len(unknown) > 1 else ''} {names}",
          file=sys.stderr, flush=True)


def check_settings(command: str | None = None) -> None:
    """Load the settings and check what `command` would only find out later. Raises ConfigError."""
    from pydantic import ValidationError
    from pydantic_settings.exceptions import SettingsError

    from services.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None
    except SettingsError as exc:
        raise ConfigError(describe_settings_error(exc)) from None
    _warn_unknown_variables(command)
    if settings.redis_url:
        from services.broker.url import target

        target(settings)  # a malformed URL or seed list: BrokerConfigError, naming the variable
    if settings.redaction_enabled and command not in _NEVER_REDACT:
        from services.redaction import Redactor

        # Checked one setting at a time so the line names the variable that is wrong.
        checks: tuple[tuple[str, Callable[[], Redactor]], ...] = (
            ("redaction_disable", lambda: Redactor({}, settings.redaction_disable)),
            ("redaction_extra_rules", lambda: Redactor(settings.redaction_extra_rules, [])),
        )
        for field, make in checks:
            try:
                make()
            except ValueError as exc:  # the Redactor's documented error for a bad rule
                raise ConfigError(f"{env_name(field)}: {exc}") from None


def _auth_and_permission_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(refused credentials, missing permission) error types of the broker clients in use.

    redis-py's only when it is loaded: a command that never imported it cannot raise them, and
    importing it just to name them would cost the tap its memory budget."""
    from services.tap.conn import AuthFailed, NoPermission

    auth: tuple[type[BaseException], ...] = (AuthFailed,)
    perm: tuple[type[BaseException], ...] = (NoPermission,)
    if "redis" in sys.modules:
        from redis.exceptions import AuthenticationError, NoPermissionError

        auth += (AuthenticationError,)
        perm += (NoPermissionError,)
    return auth, perm


def _config_error_types() -> tuple[type[BaseException], ...]:
    """Library errors that mean "fix your configuration", reported like ConfigError."""
    from services.broker.url import BrokerConfigError

    auth, perm = _auth_and_permission_errors()
    return (ConfigError, BrokerConfigError, *auth, *perm)


def _broker_problem(exc: BaseException) -> str:
    auth, perm = _auth_and_permission_errors()
    if isinstance(exc, auth):
        return (f"the broker refused the credentials ({exc}); check {env_name('redis_username')} / "
                f"{env_name('redis_password')}")
    if isinstance(exc, perm):
        first = str(exc).splitlines()[0] if str(exc) else "NOPERM"
        return (f"the broker user lacks a permission this command needs (NOPERM: {first}); use the user of the "
                "command's role (deploy/redis/users.acl, docs/architecture.md)")
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _fail(command: str | None, message: str) -> int:
    where = f"{PROG} {command}" if command else PROG
    print(f"{where}: {message}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def _is_unreachable(exc: BaseException) -> bool:
    """redis-py's ConnectionError (only possible when redis-py is loaded)."""
    if "redis" not in sys.modules:
        return False
    from redis.exceptions import ConnectionError as RedisConnectionError

    return isinstance(exc, RedisConnectionError)


def _bad_database(exc: BaseException) -> str | None:
    """redis-py's refusal of the URL's database number (raised on connect, anywhere in a command), as
    one line; None for any other error. The tap's own client raises BrokerConfigError for it itself."""
    if "redis" not in sys.modules:
        return None
    from redis.exceptions import ResponseError

    from services.broker.url import is_db_out_of_range, no_such_database
    from services.settings import Settings

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # FastStream and asyncio may wrap it
        seen.add(id(cause))
        if isinstance(cause, ResponseError) and is_db_out_of_range(cause):
            return str(no_such_database(Settings().redis_url or "", str(cause)))
        cause = cause.__cause__ or cause.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command took charge of it (importing, parsing): no traceback
        return 128 + 2
    finally:
        if argv is None:  # the program itself, not a caller in the same process
            # The command has decided its exit code: a SIGINT that lands while the interpreter shuts
            # down (joining threads, finalizers; a child's stop signalled late) must not turn it into
            # a death by SIGINT (-2), which is what an unhandled KeyboardInterrupt there does.
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: list[str] | None) -> int:
    parser = build_parser(_subcommand_in(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    missing = getattr(args, MISSING, None)
    if missing:
        return _fail(getattr(args, SUBCOMMAND), f"needs the full install (`pip install goose-ingest`): this one is "
                                                f"the tap-only install, without the module {missing!r}")
    try:
        check_settings(getattr(args, SUBCOMMAND))
    except _config_error_types() as exc:
        return _fail(getattr(args, SUBCOMMAND), _broker_problem(exc))
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name and "." not in exc.name and not exc.name.startswith(
                ("services", "contracts")):
            # a command whose module loads its dependencies late (gateway: uvicorn), in the tap-only install
            return _fail(getattr(args, SUBCOMMAND), f"needs the full install (`pip install goose-ingest`): the "
                                                    f"module {exc.name!r} is missing")
        # the error types are looked up now: the command may have loaded redis-py meanwhile
        if isinstance(exc, _config_error_types()):
            return _fail(getattr(args, SUBCOMMAND), _broker_problem(exc))
        bad_db = _bad_database(exc)
        if bad_db is not None:
            return _fail(getattr(args, SUBCOMMAND), bad_db)
        if _is_unreachable(exc):
            from services.broker.url import redact_url
            from services.settings import Settings

            url = redact_url(Settings().redis_url)
            return _fail(getattr(args, SUBCOMMAND), f"broker {url} unreachable ({exc.__class__.__name__})")
        raise


if __name__ == "__main__":
    sys.exit(main())
