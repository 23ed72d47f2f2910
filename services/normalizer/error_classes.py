"""Error classes: what kind of failure an `error` event (or a retry `warning`) reports.

An on-call engineer paged for an error spike first asks *what kind* of error: the provider
rate-limiting the fleet, an expired key, runs hitting the context window, a provider outage,
network timeouts, agents crashing, runs cut by max turns. Each has its own owner and fix, so
every `error` event carries `errorClass` from a closed vocabulary (``ERROR_CLASSES``), and so do
the warnings that are retries of the same causes (``RETRY_WARNING_CODES``). docs/contract.md,
"Error classes", lists every rule with the CLI source it comes from.

Pure and total: any message (empty, huge, binary-looking) classifies without raising, and only
its first ``MAX_CLASSIFIED_CHARS`` characters are read, so a huge message costs no more than a
short one. The contract's `code` is left exactly as the format rules set it (the CLIs' own
vocabularies); the class is a second, closed field beside it.

Order of the rules matters and is part of the contract: a message is given the first class whose
rule matches. The CLIs' own codes decide first (they are exact); then message patterns, most
specific first: "stream disconnected before completion: Your input exceeds the context window"
is a context-length failure, not a network one.
"""

from __future__ import annotations

import re
from typing import Final

from contracts.events import ERROR_CLASSES

RATE_LIMIT: Final = "rate_limit"
AUTH: Final = "auth"
QUOTA: Final = "quota"
CONTEXT_LENGTH: Final = "context_length"
PROVIDER_UNAVAILABLE: Final = "provider_unavailable"
TIMEOUT: Final = "timeout"
MAX_TURNS: Final = "max_turns"
CANCELLED: Final = "cancelled"
AGENT_EXIT: Final = "agent_exit"
OTHER: Final = "other"

# The closed vocabulary is the contract's (contracts/events.py ErrorClass); each name above is one of it
# (tests/core/test_error_classes.py holds them equal), and a metric label takes only these.
__all__ = ["ERROR_CLASSES", "RETRY_WARNING_CODES", "classify", "event_class"]

# Warnings that announce a retry of one of these causes (Claude Code's `api_retry` and
# `rate_limit` (C-R3, §2.6), Codex's retry notices (X-E1)); other warnings carry no class.
RETRY_WARNING_CODES: Final = frozenset({"api_retry", "retry", "rate_limit"})

MAX_CLASSIFIED_CHARS: Final = 2048

# The CLIs' own codes, exact. Claude Code: `result` subtypes (C-F3) and the `error` values of
# synthetic API-error assistant records and `api_retry` (C-B7, claude-code-stream-format §2.2/§2.3).
# A code absent here (`turn_failed`, `error_during_execution`, `invalid_request`, `unknown`, ...)
# says nothing about the cause: the message decides.
_BY_CODE: Final[dict[str, str]] = {
    "error_max_turns": MAX_TURNS,
    "error_max_budget_usd": QUOTA,
    "authentication_failed": AUTH,
    "billing_error": QUOTA,
    "rate_limit": RATE_LIMIT,
    "server_error": PROVIDER_UNAVAILABLE,
    "max_output_tokens": CONTEXT_LENGTH,
}

# An HTTP status as the CLIs print it: "HTTP 429", "API Error: 529", "last status: 503",
# "upstream returned 529", "(code: 401)"
_STATUS: Final = r"\b(?:http|status|error|returned|code)[\s:=]{1,3}"

# Message patterns, most specific first (lower-cased text; see the module docstring).
_RULES: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    # the normalizer's own end-of-run error: "<cli> exited with code N" (contract §4, extension §3)
    (AGENT_EXIT, re.compile(r"^\S+ exited with code -?\d+$")),
    # goose ProviderError::ContextLengthExceeded "Context length exceeded: ..."; Codex
    # ContextWindowExceeded "ran out of room in the model's context window" and the API's "Your input
    # exceeds the context window"; Claude Code "Prompt is too long"; OpenAI `context_length_exceeded`
    (CONTEXT_LENGTH, re.compile(r"context.length|context.window|prompt is too long|input is too long"
                                r"|maximum context|too many tokens|max_output_tokens|max.tokens")),
    # goose ProviderError::Authentication "Authentication error: ..."; Claude Code
    # "Invalid API key · Please run /login", `authentication_error`, "OAuth token has expired";
    # Codex RefreshTokenFailed, HTTP 401/403 answers
    (AUTH, re.compile(r"authenticat|unauthori[sz]ed|invalid.{0,20}api.?key|api.?key.{0,30}(invalid|missing|expired|revoked)"
                      r"|/login|oauth|(access|refresh|auth).?token.{0,30}(expired|invalid|revoked|failed)"
                      r"|permission_error|forbidden|not logged in|" + _STATUS + r"(401|403)\b")),
    # Codex QuotaExceeded "Quota exceeded. Check your plan and billing details", UsageLimitReached
    # "You've hit your usage limit", UsageNotIncluded; Claude Code `billing_error`, "Credit balance is too low"
    (QUOTA, re.compile(r"quota|billing|credit balance|usage limit|insufficient.?(funds|credit)|upgrade to (plus|pro)"
                       r"|" + _STATUS + r"402\b")),
    # goose ProviderError::RateLimitExceeded "Rate limit exceeded: ..."; Claude Code `rate_limit`,
    # `rate_limit_error`, `rate_limit_event`; HTTP 429 "Too Many Requests" (Codex RetryLimit "last status: 429")
    (RATE_LIMIT, re.compile(r"rate.?limit|too many requests|throttl|" + _STATUS + r"429\b")),
    # Claude Code `error_max_turns` "Reached maximum number of turns (N)"; goose's max-turns stop
    (MAX_TURNS, re.compile(r"max(imum)?.{0,12}turns|turn limit")),
    # Codex TurnAborted "turn aborted", Interrupted "interrupted (Ctrl-C)"; cancellations
    (CANCELLED, re.compile(r"cancel+ed|interrupted|turn aborted|aborted by|user abort|ctrl.?c\b")),
    # goose ProviderError::ServerError "Server error: upstream returned 529 overloaded_error"; Claude
    # Code `server_error`, `overloaded_error`, "API Error: 529", `api_error`; Codex InternalServerError
    # "experiencing high demand"; any HTTP 5xx
    (PROVIDER_UNAVAILABLE, re.compile(r"overloaded|server.?error|service unavailable|bad gateway|high demand|api_error"
                                      r"|internal error|" + _STATUS + r"5\d\d\b")),
    # Codex Stream "stream disconnected before completion", ConnectionFailed "Connection failed",
    # ResponseStreamFailed, Timeout, retry notices "Reconnecting... n/m", "error sending request";
    # goose ProviderError::RequestFailed on network errors; Claude Code "Request timed out"
    (TIMEOUT, re.compile(r"timed?.?out|timeout|deadline exceeded|stream disconnected|connection (failed|reset|refused|closed|error)"
                         r"|error sending request|stream error|reconnecting|network|dns|econn|etimedout|socket hang up|broken pipe")),
)


def classify(code: str | None, message: str) -> str:
    """The class of a failure from the CLI's code (exact, first) and its message (bounded)."""
    if code is not None:
        by_code = _BY_CODE.get(code)
        if by_code is not None:
            return by_code
    text = message[:MAX_CLASSIFIED_CHARS].lower()
    for cls, pattern in _RULES:
        if pattern.search(text) is not None:
            return cls
    return OTHER


def event_class(etype: str, code: object, message: object) -> str | None:
    """`errorClass` for an event of type ``etype``: every `error`, and warnings that are retries."""
    if etype == "error":
        pass
    elif etype != "warning" or code not in RETRY_WARNING_CODES:
        return None
    return classify(code if isinstance(code, str) else None, message if isinstance(message, str) else "")
