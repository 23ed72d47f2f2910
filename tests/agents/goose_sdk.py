"""goose's own provider layer against the scripted model server: goose's real error texts per fault.

goose's CLI has no npm or PyPI package, but its provider layer does: `goose-sdk` (Rust through
UniFFI). It gets a virtualenv of its own in the agents cache (`<cache>/goose-sdk@<version>`), and
every probe runs in a child process of that venv: an Azure-style 429 body has aborted the whole
process ("FATAL: exception not rethrown"), which must not take a test run with it.

    python -m tests.agents.goose_sdk --install          # what tests.agents.install does too
    <venv>/bin/python tests/agents/goose_sdk.py --probe anthropic URL TIMEOUT_MS   # one JSON line

The probe mode imports nothing of the project (the venv has only goose-sdk).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

VERSION = "0.1.0a13"

# How goose's CLI words a provider error in its stream (`{"type":"error","error": ...}`): the Display
# of its ProviderError variant inside its "Ran into this error" frame. The SDK gives the variant and
# its details; these prefixes are the CLI's.
CLI_PREFIX = {
    "Authentication": "Authentication error: ",
    "ContextLengthExceeded": "Context length exceeded: ",
    "RateLimited": "Rate limit exceeded: ",
    "ProviderUnavailable": "Server error: ",
    "Timeout": "Request failed: ",
    "Generic": "Request failed: ",
}
# goose's own opinion of each variant, in the contract's classes
GOOSE_CLASS = {"Authentication": "auth", "ContextLengthExceeded": "context_length", "RateLimited": "rate_limit",
               "ProviderUnavailable": "provider_unavailable", "Timeout": "timeout", "Generic": "other"}


def cli_text(variant: str, details: str) -> str:
    return (f"Ran into this error: {CLI_PREFIX.get(variant, '')}{details}.\n\n"
            "Please retry if you think this is a transient or recoverable error.")


async def _probe(provider: str, url: str, timeout_ms: int) -> dict[str, str]:
    import goose  # type: ignore[import-not-found]

    p = goose.anthropic_provider("sk-test", url, []) if provider == "anthropic" else goose.openai_provider("sk-test", url)
    msg = goose.ProviderMessage(role=goose.MessageRole.USER, content=[goose.MessageContent.TEXT("Summarize notes.txt.")])
    try:
        await p.complete(goose.ProviderModelConfig(model_name="test-model", timeout_ms=timeout_ms), "system", [msg], [])
    except Exception as exc:  # noqa: BLE001 - goose's error is the result
        details = getattr(exc, "details", None)
        if not isinstance(details, str):
            details = str(getattr(exc, "retry_after_suffix", "") or exc).strip()
        return {"variant": type(exc).__name__, "details": details}
    return {"variant": "ok", "details": ""}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"] and len(argv) == 4:
        print(json.dumps(asyncio.run(_probe(argv[1], argv[2], int(argv[3])))), flush=True)
        # leave at once: the UniFFI runtime's threads can abort the interpreter's shutdown after a
        # failed request ("FATAL: exception not rethrown"), the answer is already out
        os._exit(0)
    if argv == ["--install"]:
        from tests.agents.install import install_goose_sdk

        print(install_goose_sdk())
        return 0
    print("usage: goose_sdk.py --install | --probe anthropic|openai URL TIMEOUT_MS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
