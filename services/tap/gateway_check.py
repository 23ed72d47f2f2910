"""A tap's start through an ingest gateway: its token checked and its run key placed in the token's prefix.

As a wrong Redis password is one line and exit 2 at a direct tap's start, a token the gateway refuses
(401), a run key outside its prefix (the 403 every batch would get) or a URL where no gateway answers
(404) are said at once (``ConfigError``), instead of entries waiting in the spool for a retry that
cannot succeed. A gateway that does not answer is no reason to stop (that is what the spool is for).

Without ``--run`` the run key is ``<prefix><host>/<ULID>``: the prefix is the gateway's answer
(``TOKEN_PATH``), or, while it is unreachable, a ``prefix: P`` line of the token file (``tokens
create --token-file`` writes it).
"""

from __future__ import annotations

from pathlib import Path

from services.broker.url import redact_url
from services.settings import ConfigError, Settings
from services.tap.runkey import RUN_KEY_RULE, is_valid_run, new_run_key

PREFIX_LINE = "prefix:"
CHECK_TIMEOUT_S = 2.0  # as a direct tap's credential check (services/tap/credentials.py)


def token_file_prefix(settings: Settings) -> str | None:
    """The ``prefix: P`` line of the token file, if any (the token is its first line)."""
    if not settings.token_file:
        return None
    try:
        lines = Path(settings.token_file).read_text("utf-8").splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        if line.strip().lower().startswith(PREFIX_LINE):
            return line.strip()[len(PREFIX_LINE):].strip() or None
    return None


def gateway_run(settings: Settings, run: str | None) -> str:
    """The run key to use through the gateway (``run``, or the default in the token's prefix)."""
    from services.tap.http_transport import GatewayError, GatewayRefused, HttpTransport

    transport = HttpTransport(settings)  # a malformed endpoint or token: ConfigError
    transport.timeout = CHECK_TIMEOUT_S  # a gateway out of reach only delays the start this long
    prefix: str | None = None
    try:
        info = transport.token_info()
        prefix = str(info["prefix"])
    except GatewayRefused as exc:
        raise ConfigError(str(exc)) from None
    except GatewayError:
        prefix = token_file_prefix(settings)
        if run is None and prefix is None:
            raise ConfigError(
                f"the gateway {redact_url(transport.url)} is unreachable and the token's run prefix is unknown: "
                f"pass --run <prefix>..., or add a line `prefix: <prefix>` to GOOSE_INGEST_TOKEN_FILE") from None
    finally:
        transport.close()
    if run is None:
        assert prefix is not None
        run = prefix + new_run_key(settings.host_label)
        if not is_valid_run(run):
            raise ConfigError(f"the token's prefix {prefix!r} leaves no room for a run key ({RUN_KEY_RULE}): pass --run")
        return run
    if prefix is not None and not run.startswith(prefix):
        raise ConfigError(f"the gateway refused the run key: {run!r} is outside the token's prefix {prefix!r} "
                          f"(every batch would get 403); use --run {prefix}...")
    return run
