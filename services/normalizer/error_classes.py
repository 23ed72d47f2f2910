"""Error classes: what kind of failure an `error` event (or a retry `warning`) reports.

An on-call engineer paged for an error spike first asks *what kind* of error: the provider
rate-limiting the fleet, an expired key, runs hitting the context window, a provider outage,
network timeouts, agents crashing, runs cut by max turns. Each has its own owner and fix, so
every `error` event carries `errorClass` from a closed vocabulary (``ERROR_CLASSES``), and so do
the warnings that are retries of the same causes (``RETRY_WARNING_CODES``). docs/contract.md,
"Error classes", lists every rule with the source of the texts it was written from, and
tests/data/provider_error_texts.json holds those texts (tests/core/test_provider_error_texts.py).

Pure and total: any message (empty, huge, binary-looking) classifies without raising, and only
its first ``MAX_CLASSIFIED_CHARS`` characters are read, so a huge message costs no more than a
short one. The contract's `code` is left exactly as the format rules set it (the CLIs' own
vocabularies); the class is a second, closed field beside it.

Order of the rules matters and is part of the contract: the strongest signal is read first. The
CLIs' own codes decide first (they are exact), except that a code as vague as Claude Code's
`server_error` (it labels refused and reset connections and client timeouts too) yields to a
network message. Then the message: the normalizer's own exit error; an explicit HTTP 401/403
(as prose or as the provider's JSON, `"code":403`, `"status":"PERMISSION_DENIED"`); a throttling
text with a retry hint ("Please retry after 6 seconds", "per minute"), whatever incidental word
("quota") it carries; a quota or billing text; an explicit throttling text or HTTP 429; then the
weaker words, most specific first.
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
__all__ = ["ERROR_CLASSES", "RETRY_WARNING_CODES", "classify", "event_class", "reason_class"]

# Warnings that announce a retry of one of these causes (Claude Code's `api_retry` and
# `rate_limit` (C-R3, §2.6), Codex's retry notices (X-E1)); other warnings carry no class.
RETRY_WARNING_CODES: Final = frozenset({"api_retry", "retry", "rate_limit"})

MAX_CLASSIFIED_CHARS: Final = 2048

# The CLIs' own codes, exact. Claude Code: `result` subtypes (C-F3) and the `error` values of
# synthetic API-error assistant records and `api_retry` (C-B7, claude-code-stream-format §2.2/§2.3;
# `overloaded` is what 2.1.197 reports for a 529). A code absent here (`turn_failed`,
# `error_during_execution`, `invalid_request`, `unknown`, ...) says nothing about the cause: the
# message decides.
_BY_CODE: Final[dict[str, str]] = {
    "error_max_turns": MAX_TURNS,
    "error_max_budget_usd": QUOTA,
    "authentication_failed": AUTH,
    "billing_error": QUOTA,
    "rate_limit": RATE_LIMIT,
    "server_error": PROVIDER_UNAVAILABLE,
    "overloaded": PROVIDER_UNAVAILABLE,
    "overloaded_error": PROVIDER_UNAVAILABLE,
    "max_output_tokens": CONTEXT_LENGTH,
}

# Codes that name a cause only roughly: Claude Code 2.1.197 labels a refused connection, a reset
# connection and its own "Request timed out" `server_error` too. With a network message and no HTTP
# 5xx in it, the message's class (timeout) wins.
_VAGUE_CODES: Final = frozenset({"server_error"})

# Claude Code's `result.terminal_reason` (2.1.197): why the loop stopped, exact, consulted before
# the subtype (`error_during_execution` says nothing: a SIGINT gives it with `aborted_tools` and a
# diagnostic text). `completed` and `api_error` say nothing about the cause.
_BY_REASON: Final[dict[str, str]] = {
    "aborted_tools": CANCELLED,
    "aborted_streaming": CANCELLED,
    "prompt_too_long": CONTEXT_LENGTH,
    "max_turns": MAX_TURNS,
}

# Exit codes of a run ended by SIGINT or SIGTERM: the shell's 128+N, or -N as the tap reports a
# signal death (Python's returncode). The run was stopped, not crashed: `cancelled`.
_SIGNAL_EXITS: Final = frozenset({"130", "143", "-2", "-15"})

# An HTTP status as the CLIs print it: "HTTP 429", "API Error: 529", "last status: 503",
# "upstream returned 529", "(code: 401)", "Error code: 429 -", "status 403 Forbidden", and as the
# providers' JSON bodies carry it inside the message: `"code":403`, `"code": 429`, `"status":429`.
_STATUS: Final = r"\b(?:http|status|error|returned|code)\"?[\s:=]{1,3}"

# The normalizer's own end-of-run error: "<cli> exited with code N" (contract §4, extension §3).
_EXIT: Final = re.compile(r"^\S+ exited with code (-?\d+)$")

# Network failures (the timeout class), also read to overrule a vague code. Codex Stream "stream
# disconnected before completion", ConnectionFailed "Connection failed: ...", ResponseStreamFailed
# "Error while reading the server response: ...", Timeout, its retry notices "Reconnecting... n/m" and
# "Reconnecting... waiting for network (...)"; goose NetworkError "Request timed out — ...", "Could
# not connect to ...", "Network error: ...", RequestFailed "error sending request"; the Anthropic and
# OpenAI SDKs' APIConnectionError "Connection error." and APIConnectionTimeoutError "Request timed
# out." (Claude Code prints them as "API Error: ..."); undici's "fetch failed" and "terminated" (a socket
# closed mid-body; Gemini CLI "[API Error: terminated]"); opencode's "Cannot connect to API: Unable
# to connect." and "Connection reset by server"; Claude Code's api_retry without any status
# ("API request failed (unknown); retry 1/10", C-R3: an HTTP answer always reports its status).
_NETWORK: Final = re.compile(
    r"timed?.?out|timeout|deadline exceeded|stream disconnected|connection (?:failed|reset|refused|closed|error|lost)"
    r"|error sending request|error while reading the server response|stream error|reconnecting|network"
    r"|could not connect|cannot connect|unable to connect|failed to connect|fetch failed|api error: terminated|^terminated$"
    r"|other side closed|\bdns\b|econn|etimedout|enotfound|eai_again|und_err|socket hang up|broken pipe"
    r"|^api request failed(?: \(unknown\))?(?:; retry \d+/\d+)?$"
)

# A retry hint: the provider says when to come back, or that the limit is per minute. Azure OpenAI
# "Please retry after 6 seconds"; Gemini "Please retry in 40.02s", gemini-cli "Suggested retry after
# 1s", RetryInfo `retryDelay`; OpenAI "Please try again in 20s", "tokens per min (TPM)"; Vertex AI
# "..._requests_per_minute_..."; Anthropic "50,000 input tokens per minute".
_RETRY_HINT: Final = re.compile(
    r"retry (?:after|in) \d|retry.?after|retry.?delay|try again in \d|per.?min(?:ute)?\b|_per_minute|per.?second"
    r"|\b[rt]pm\b"
)

# Message rules, strongest signal first: (class, pattern, a second pattern that must match too or None).
_RULES: Final[tuple[tuple[str, re.Pattern[str], re.Pattern[str] | None], ...]] = (
    # an explicit 401/403, as prose or as the provider's JSON (Gemini `"code":403`,
    # `"status":"PERMISSION_DENIED"` / `"UNAUTHENTICATED"`); Codex UnexpectedStatus "unexpected status 401
    # Unauthorized: ...", also when retried ("Reconnecting... 1/1 (unexpected status 401 ...)")
    (AUTH, re.compile(_STATUS + r"(?:401|403)\b|\"status\"\s?:\s?\"(?:permission_denied|unauthenticated)\""), None),
    # a throttling text with a retry hint wins over its incidental words ("quota" in Azure OpenAI's
    # aka.ms/oai/quotaincrease, Vertex AI's "Quota exceeded for ..._requests_per_minute_...", Gemini's
    # "You exceeded your current quota ... Please retry in 40s")
    (RATE_LIMIT, re.compile(r"rate.?limit|throttl|too many (?:requests|tokens)|resource.?exhausted|resource has been exhausted"
                            r"|quota|" + _STATUS + r"429\b"), _RETRY_HINT),
    # quota, billing, credits, plan: OpenAI `insufficient_quota` "You exceeded your current quota, please
    # check your plan and billing details" (a 429 without a retry hint); Codex QuotaExceeded, UsageLimitReached
    # "You've hit your usage limit", UsageNotIncluded "upgrade to Plus"; Claude Code `billing_error`,
    # "Credit balance is too low"; goose CreditsExhausted "Please add credits to your account ...";
    # gemini-cli TerminalQuotaError "You have exhausted your daily quota"; HTTP 402
    (QUOTA, re.compile(r"insufficient.?quota|current quota|billing|credit balance|credits? exhausted|add (?:more )?credits"
                       r"|purchase (?:more )?credits|insufficient.?(?:funds|credits?|balance)|usage limit|upgrade to (?:plus|pro)"
                       r"|daily quota|quota will reset|" + _STATUS + r"402\b"), None),
    # explicit throttling: goose RateLimitExceeded "Rate limit exceeded: ..."; Claude Code `rate_limit_error`;
    # Bedrock ThrottlingException "Too many tokens, please wait before trying again."; Gemini
    # RESOURCE_EXHAUSTED "Resource has been exhausted (e.g. check quota)."; Codex RetryLimit "last status: 429"
    (RATE_LIMIT, re.compile(r"rate.?limit|throttl|too many (?:requests|tokens)|request rate is too high|resource.?exhausted"
                            r"|resource has been exhausted|" + _STATUS + r"429\b"), None),
    # any other quota text ("Quota exceeded for ...")
    (QUOTA, re.compile(r"quota"), None),
    # goose ContextLengthExceeded "Context length exceeded: ..." and "Context limit still exceeded after
    # compaction"; Codex ContextWindowExceeded and the API's "Your input exceeds the context window";
    # Claude Code "Prompt is too long"; OpenAI "maximum context length"; Bedrock "Input is too long";
    # Gemini "The input token count (N) exceeds the maximum number of tokens allowed", gemini-cli
    # "Model response was truncated because it exceeded the token limit"
    (CONTEXT_LENGTH, re.compile(r"context.length|context.window|context limit|prompt is too long|input is too long"
                                r"|maximum context|input token count|maximum number of tokens|exceeded the token limit"
                                r"|max_output_tokens|max.tokens"), None),
    # goose Authentication "Authentication error: ..."; Claude Code "Invalid API key · Please run /login",
    # `authentication_error`, "OAuth token has expired"; OpenAI "Incorrect API key provided"; Gemini
    # "API key not valid" (API_KEY_INVALID); Azure OpenAI "Access denied due to invalid subscription key";
    # Codex RefreshTokenFailed
    (AUTH, re.compile(r"authenticat|unauthori[sz]ed|(?:invalid|incorrect).{0,20}(?:api.?key|subscription key)"
                      r"|api.?key.{0,30}(?:invalid|not valid|missing|expired|revoked)|/login|oauth"
                      r"|(?:access|refresh|auth).?token.{0,30}(?:expired|invalid|revoked|failed)|permission_error|permission_denied"
                      r"|forbidden|access.?denied|not logged in|no auth credentials"), None),
    # Claude Code `error_max_turns` "Reached maximum number of turns (N)"; gemini-cli "Reached max
    # session turns"; goose's max-turns stop
    (MAX_TURNS, re.compile(r"max(?:imum)?.{0,12}turns|turn limit"), None),
    # Codex TurnAborted "turn aborted", Interrupted "interrupted (Ctrl-C)"; Claude Code "[Request
    # interrupted by user]"; goose "Headless run interrupted"; the Anthropic and OpenAI SDKs'
    # APIUserAbortError "Request was aborted."; gemini-cli FatalCancellationError "Operation cancelled."
    # ("Request timed out or interrupted" is a network failure: rule 12)
    (CANCELLED, re.compile(r"cancel+ed|(?<!timed out or )interrupted|turn aborted|request was aborted|aborted by|user abort"
                           r"|ctrl.?c\b"), None),
    # goose ServerError "Server error: upstream returned 529 overloaded_error"; Claude Code
    # `overloaded_error`, "API Error: 529", `api_error`; Codex InternalServerError "experiencing high
    # demand"; OpenAI "The server had an error while processing your request"; any HTTP 5xx
    (PROVIDER_UNAVAILABLE, re.compile(r"overloaded|server.?error|server had an error|service.?unavailable|bad gateway"
                                      r"|high demand|api_error|internal error|model is down|" + _STATUS + r"5\d\d\b"), None),
    (TIMEOUT, _NETWORK, None),
)
_SERVER_STATUS: Final = re.compile(_STATUS + r"5\d\d\b")


def classify(code: str | None, message: str) -> str:
    """The class of a failure from the CLI's code (exact, first) and its message (bounded)."""
    text = message[:MAX_CLASSIFIED_CHARS].lower()
    if code is not None:
        by_code = _BY_CODE.get(code)
        if by_code is not None:
            if code not in _VAGUE_CODES or _NETWORK.search(text) is None or _SERVER_STATUS.search(text) is not None:
                return by_code
            return TIMEOUT
    exited = _EXIT.match(text)
    if exited is not None:
        return CANCELLED if exited.group(1) in _SIGNAL_EXITS else AGENT_EXIT
    for cls, pattern, also in _RULES:
        if pattern.search(text) is not None and (also is None or also.search(text) is not None):
            return cls
    return OTHER


def reason_class(reason: object) -> str | None:
    """The class a Claude Code `terminal_reason` names exactly, or None when it names no cause."""
    return _BY_REASON.get(reason) if type(reason) is str else None


def event_class(etype: str, code: object, message: object) -> str | None:
    """`errorClass` for an event of type ``etype``: every `error`, and warnings that are retries."""
    if etype == "error":
        pass
    elif etype != "warning" or code not in RETRY_WARNING_CODES:
        return None
    return classify(code if isinstance(code, str) else None, message if isinstance(message, str) else "")
