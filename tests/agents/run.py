"""Run one real agent CLI headless against the scripted model server: command line, environment,
fresh HOME and working directory, `timeout`, SIGINT, and what it printed (a capture).

Every flag and variable below is the one measured on these machines
(/work/shared/notes/measured-on-these-machines.md, "the real agent CLIs"): retries bounded and
short, telemetry, auto-update and every other outbound call off, no prompt for permission.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.agents.install import CLIS, binary, cache_root

RUN_TIMEOUT_S = 150  # the outer bound of one CLI run (`timeout -k 5`); a scenario that needs more is a defect
MODEL = {"claude-code": "claude-sonnet-4-5", "codex": "gpt-5.5", "gemini-cli": "gemini-2.5-pro",
         "opencode": "mock/test-model"}


@dataclass
class Invocation:
    """What to run: argv (without the `timeout` wrapper), its environment and working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    stdin: bytes | None = None  # written to the CLI's stdin, then closed (else stdin is /dev/null)


@dataclass
class Capture:
    cli: str
    version: str
    scenario: str
    stdout: list[str]
    stderr: list[str]
    exit_code: int
    seconds: float
    requests: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"cli": self.cli, "version": self.version, "scenario": self.scenario, "exit": self.exit_code,
                "stdout": self.stdout, "stderr": self.stderr}


def base_env(home: Path) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TERM", "SSL_CERT_FILE") if k in os.environ}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
            "NO_COLOR": "1", "CI": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


# Gemini CLI set-ups that differ from a working headless run (a scenario's `variant`):
# `untrusted` leaves out --skip-trust (the folder is not trusted: exit 55, nothing on stdout),
# `no-auth-type` leaves out security.auth.selectedType (exit 41, nothing on stdout), `relaunch` lets
# the CLI re-launch itself in a child node process, as it does by default (its SIGINT path differs).
VARIANTS = {"gemini-cli": frozenset({"untrusted", "no-auth-type", "relaunch"})}


def invocation(cli: str, version: str, base_url: str, prompt: str, root: Path, max_turns: int | None = None,
               unbounded_retries: bool = False, variant: str | None = None) -> Invocation:
    """`root` gets `home/` (a fresh HOME) and `work/` (the scratch working directory, created by the caller).
    `max_turns`: Claude Code `--max-turns`, Gemini CLI `model.maxSessionTurns`, opencode the build
    agent's `steps`; `variant`: one of VARIANTS[cli]."""
    if variant is not None and variant not in VARIANTS.get(cli, frozenset()):
        raise ValueError(f"{cli} has no variant {variant!r}")
    home, work = root / "home", root / "work"
    home.mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    exe = str(binary(CLIS[cli], version))
    env = base_env(home)
    env["TMPDIR"] = str(root / "tmp")  # Gemini CLI writes an error report per failed request there
    if cli == "claude-code":
        env.update({"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-test-0000",
                    "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
                    "CLAUDE_CODE_MAX_RETRIES": "2", "API_TIMEOUT_MS": "10000",
                    "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": "10000", "IS_SANDBOX": "1"})
        argv = [exe, "-p", "--output-format", "stream-json", "--verbose", "--model", MODEL[cli],
                "--permission-mode", "bypassPermissions"]
        if max_turns is not None:
            argv += ["--max-turns", str(max_turns)]
        argv.append(prompt)
    elif cli == "codex":
        env.update({"MOCK_OPENAI_API_KEY": "sk-test-0000", "CODEX_HOME": str(home / ".codex")})
        (home / ".codex").mkdir(exist_ok=True)
        argv = [exe, "exec", "--json", "--skip-git-repo-check", "-s", "workspace-write", "-m", MODEL[cli],
                *([] if unbounded_retries else ["--disable", "unbounded_connection_retries"]),
                "-c", "model_provider=mock", "-c", "model_providers.mock.name=mock",
                "-c", f"model_providers.mock.base_url={base_url}/v1", "-c", "model_providers.mock.wire_api=responses",
                "-c", "model_providers.mock.env_key=MOCK_OPENAI_API_KEY",
                "-c", "model_providers.mock.request_max_retries=1", "-c", "model_providers.mock.stream_max_retries=1",
                "-c", "model_providers.mock.stream_idle_timeout_ms=5000", prompt]
    elif cli == "gemini-cli":
        settings: dict[str, object] = {
            "general": {"maxAttempts": 2, "disableAutoUpdate": True, "disableUpdateNag": True},
            "telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False}}
        if variant != "no-auth-type":
            settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
        if max_turns is not None:
            settings["model"] = {"maxSessionTurns": max_turns}
        (home / ".gemini").mkdir(exist_ok=True)
        (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
        env.update({"GOOGLE_GEMINI_BASE_URL": base_url, "GEMINI_API_KEY": "test-key-0000"})
        if variant != "relaunch":
            env["GEMINI_CLI_NO_RELAUNCH"] = "true"
        argv = [exe, *([] if variant == "untrusted" else ["--skip-trust"]), "--yolo", "--output-format", "stream-json",
                "-m", MODEL[cli], "-p", prompt]
    elif cli == "opencode":
        config = {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
                  "provider": {"mock": {"npm": "@ai-sdk/openai-compatible", "name": "mock",
                                        "options": {"baseURL": f"{base_url}/v1", "apiKey": "sk-test-0000"},
                                        "models": {"test-model": {"name": "test-model"}}}},
                  "model": MODEL[cli]}
        if max_turns is not None:
            # the step limit of the agent `opencode run` uses (its last step is forced to text)
            config["agent"] = {"build": {"steps": max_turns}}
        (work / "opencode.json").write_text(json.dumps(config))
        # opencode npm-installs its plugin package into a fresh HOME's config on start: a shared
        # npm cache (content-addressed, safe for concurrent runs) spares the downloads
        env["npm_config_cache"] = str(cache_root() / "npm-cache")
        env.update({"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
                    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "PWD": str(work)})
        argv = [exe, "run", "--format", "json", "-m", MODEL[cli], prompt]
    else:
        raise ValueError(f"unknown CLI {cli!r}")
    return Invocation(argv, env, work)


def wrapped(argv: list[str]) -> list[str]:
    """The `timeout` wrapper: TERM at RUN_TIMEOUT_S, KILL 5 s later."""
    return ["timeout", "-k", "5", str(RUN_TIMEOUT_S), *argv]


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except BrokenPipeError:  # it ended without reading all of it: the capture says how
        pass


def _only_child(pid: int) -> int | None:
    """The one child process of `pid` (the command `timeout` runs), or None when it has none."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def run(inv: Invocation, sigint_when: str | None = None, sigint_after_s: float = 0.0,
        outer: list[str] | None = None) -> tuple[list[str], list[str], int, float]:
    """Run it (optionally under `outer`, e.g. `goose-ingest tap --`): stdout lines, stderr lines, exit code, seconds.

    `sigint_when`: a substring of a stdout line; once printed, SIGINT goes to the process group
    (as a terminal's Ctrl-C would) after `sigint_after_s`. Under `outer` it goes to the outer
    command alone, once (the tap forwards it to the CLI's own process group): GNU `timeout` relays
    a signal it gets to its child and again to its whole group, and a tap that gets a second
    signal while the CLI runs ends the CLI with SIGKILL (services/tap/supervise.py).
    """
    started = time.monotonic()
    argv = wrapped([*(outer or []), *inv.argv])
    proc = subprocess.Popen(argv, cwd=inv.cwd, env=inv.env, stdin=subprocess.DEVNULL if inv.stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    if inv.stdin is not None:
        threading.Thread(target=_feed, args=(proc, inv.stdin), daemon=True).start()
    err: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line.decode("utf-8", "replace").rstrip("\n"))

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    out: list[str] = []
    sent = False
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        out.append(line)
        if sigint_when is not None and not sent and sigint_when in line:
            time.sleep(sigint_after_s)
            try:
                outer_pid = _only_child(proc.pid) if outer else None
                if outer_pid is not None:
                    os.kill(outer_pid, signal.SIGINT)
                else:
                    os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # it ended on its own meanwhile: the capture says how
                pass
            sent = True
    code = proc.wait()
    t.join(10)
    return out, err, code, time.monotonic() - started
