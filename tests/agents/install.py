"""Install the agent CLIs at their pinned versions from npm into a cache outside the repo
(and goose's provider layer, `goose-sdk` from PyPI, into a venv beside them: tests/agents/goose_sdk.py).

`python -m tests.agents.install [--cli NAME[@VERSION]]...` (what `.ci/run` calls): each CLI goes to
`$GOOSE_INGEST_AGENTS_CACHE/<cli>@<version>` (default `~/.cache/goose-ingest/agents`), skipped when
that folder already holds the binary. A failed `npm install` is retried a bounded number of times
and leaves no half folder behind (it installs into `<dir>.tmp`, then renames).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

NPM_ATTEMPTS = 3
NPM_TIMEOUT_S = 600


@dataclass(frozen=True)
class Cli:
    name: str  # our label (the normalizer's format name)
    package: str  # the npm package
    pinned: str  # the version CI runs (docs/contract.md "When an agent CLI releases")
    binary: str  # the executable under node_modules/.bin


# The versions CI pins. Moving one: docs/contract.md, section "When an agent CLI releases".
CLIS: dict[str, Cli] = {c.name: c for c in (
    Cli("claude-code", "@anthropic-ai/claude-code", "2.1.197", "claude"),
    Cli("codex", "@openai/codex", "0.171.0", "codex"),
    Cli("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini"),
    Cli("opencode", "opencode-ai", "1.18.33", "opencode"),
)}


def cache_root() -> Path:
    env = os.environ.get("GOOSE_INGEST_AGENTS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "goose-ingest" / "agents"


def install_dir(cli: Cli, version: str | None = None) -> Path:
    return cache_root() / f"{cli.name}@{version or cli.pinned}"


def binary(cli: Cli, version: str | None = None) -> Path:
    return install_dir(cli, version) / "node_modules" / ".bin" / cli.binary


def npm_missing() -> str | None:
    """Why the CLIs cannot be installed here, or None."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    return None


# Host tools a CLI's built-in tools run (besides node): opencode's `grep` and `glob` run ripgrep, and
# without one on PATH it tries to download it into the run's fresh HOME, which fails offline and costs
# every run a download online (.ci/run installs it).
HOST_TOOLS: dict[str, tuple[str, ...]] = {"opencode": ("rg",)}


def host_missing(cli: str) -> str | None:
    """Why `cli`'s tools cannot run here (a host tool it needs is not on PATH), or None."""
    for tool in HOST_TOOLS.get(cli, ()):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (the {cli} CLI's search tools run it)"
    return None


def resolve(cli: Cli, version: str) -> str:
    """`latest` (or any dist-tag/range) to the exact version npm serves."""
    if version == cli.pinned:
        return version
    out = subprocess.run(["npm", "view", f"{cli.package}@{version}", "version"], capture_output=True,
                         text=True, timeout=120, check=True)
    lines = out.stdout.split()
    if not lines:
        raise RuntimeError(f"npm serves no {cli.package}@{version}")
    return lines[-1].strip("'")


def install(cli: Cli, version: str | None = None) -> Path:
    """The binary of cli@version, installed first when absent (bounded retries)."""
    version = version or cli.pinned
    exe = binary(cli, version)
    if exe.exists():
        return exe
    target = install_dir(cli, version)
    tmp = target.with_name(target.name + ".tmp")
    error = ""
    for attempt in range(NPM_ATTEMPTS):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        out = subprocess.run(["npm", "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--loglevel=error",
                              f"{cli.package}@{version}"], capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
        if out.returncode == 0 and (tmp / "node_modules" / ".bin" / cli.binary).exists():
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            return exe
        error = (out.stderr or out.stdout).strip()[-2000:]
        time.sleep(2 * (attempt + 1))
    shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"npm install {cli.package}@{version} failed {NPM_ATTEMPTS} times: {error}")


def goose_sdk_python() -> Path:
    from tests.agents.goose_sdk import VERSION

    return cache_root() / f"goose-sdk@{VERSION}" / "bin" / "python"


def install_goose_sdk() -> Path:
    """goose's provider layer (`goose-sdk` from PyPI) in a venv of its own: its python."""
    from tests.agents.goose_sdk import VERSION

    python = goose_sdk_python()
    if python.exists() and subprocess.run([str(python), "-c", "import goose"], capture_output=True,
                                          timeout=120).returncode == 0:
        return python
    venv = python.parent.parent
    error = ""
    for attempt in range(NPM_ATTEMPTS):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        out = subprocess.run([str(python), "-m", "pip", "install", "-q", f"goose-sdk=={VERSION}"], capture_output=True,
                             text=True, timeout=NPM_TIMEOUT_S)
        if out.returncode == 0:
            return python
        error = (out.stderr or out.stdout).strip()[-2000:]
        time.sleep(2 * (attempt + 1))
    shutil.rmtree(venv, ignore_errors=True)
    raise RuntimeError(f"pip install goose-sdk=={VERSION} failed {NPM_ATTEMPTS} times: {error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.agents.install", description=__doc__.splitlines()[0])
    parser.add_argument("--cli", action="append", default=[], help="NAME or NAME@VERSION (default: every CLI at its pin)")
    args = parser.parse_args(argv)
    why = npm_missing()
    if why:
        print(f"cannot install the agent CLIs: {why}", file=sys.stderr)
        return 2
    wanted = args.cli or list(CLIS)
    jobs: list[tuple[Cli, str | None]] = []
    for spec in wanted:
        name, _, version = spec.partition("@")
        if name not in CLIS:
            print(f"unknown CLI {name!r} (known: {', '.join(CLIS)})", file=sys.stderr)
            return 2
        jobs.append((CLIS[name], version or None))

    def one(job: tuple[Cli, str | None]) -> str:
        cli, version = job
        started = time.monotonic()
        exe = install(cli, resolve(cli, version) if version else None)
        return f"{cli.package}@{version or cli.pinned}: {exe} ({time.monotonic() - started:.0f} s)"

    # in parallel: npm spends most of an install waiting on the registry
    with ThreadPoolExecutor(max_workers=len(jobs) + 1) as pool:
        sdk = pool.submit(install_goose_sdk) if not args.cli else None
        for line in pool.map(one, jobs):
            print(line)
        if sdk is not None:
            print(f"goose-sdk: {sdk.result()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
