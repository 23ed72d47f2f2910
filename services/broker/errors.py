"""What a Redis error reply says, read the same way everywhere (no redis-py import: the tap uses it).

redis-py turns some reply codes into classes and drops the code from the message
(``MOVED 3999 127.0.0.1:7002`` -> ``MovedError("3999 127.0.0.1:7002")``, code kept in
``status_code``), and a pipeline's first error gets the failing command quoted in front of its
message (``Command # 1 (XADD ... line <the entry's text>...) of pipeline caused error: ...``).
So a code is never read off the message's first word alone, and a message is never logged as
redis-py formats it: the quoted command carries the entry's line, which may hold a secret.
"""

from __future__ import annotations

# Codes that say the cluster's shape changed (or is changing) under the client: re-read the slot map.
TOPOLOGY_CODES = frozenset({"MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY"})
# Codes about the broker's state, not a request's content: wait and retry, never split or dead-letter.
TRANSIENT_CODES = TOPOLOGY_CODES | {"OOM", "BUSY", "LOADING", "MASTERDOWN", "NOREPLICAS", "NOSCRIPT"}

_PIPELINE_ANNOTATION = "caused error: "  # redis-py's (sync and asyncio) prefix ends with this
# redis-py's classes for the codes it strips, for versions whose errors carry no `status_code`
_CODE_OF_CLASS = {"MovedError": "MOVED", "AskError": "ASK", "ClusterDownError": "CLUSTERDOWN",
                  "TryAgainError": "TRYAGAIN", "ReadOnlyError": "READONLY", "MasterDownError": "MASTERDOWN",
                  "BusyLoadingError": "LOADING", "OutOfMemoryError": "OOM", "NoPermissionError": "NOPERM",
                  "AuthenticationError": "NOAUTH", "NoScriptError": "NOSCRIPT"}


# Errors that are no reply at all but the broker (or the route to it) being away for a moment: a lost
# connection, a timeout, a slot no known node serves while a replica is being promoted. Class names,
# read along the MRO (redis-py's ConnectionError and TimeoutError, the builtins of the same names,
# redis-py's cluster classes), so that this module needs no redis-py import.
_OUTAGE_CLASSES = frozenset({"ConnectionError", "TimeoutError", "SlotNotCoveredError", "ClusterDownError",
                             "MaxConnectionsError"})


def is_outage(exc: BaseException) -> bool:
    """The broker could not take the request now (an outage, a failover, a topology change), as
    opposed to a refusal of the request itself: retry the same request, never split it, never
    count it against an entry."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _OUTAGE_CLASSES:
        return True
    return "ResponseError" in names and reply_code(exc) in TRANSIENT_CODES


def server_message(exc: BaseException) -> str:
    """The error as the server sent it, without redis-py's quoted pipeline command in front."""
    text = str(exc)
    if text.startswith("Command # "):
        # The quoted command comes first and is bounded (redis-py shortens it); the server's own text
        # last. rpartition, so a line that contains the annotation itself cannot extend the quote.
        text = text.rpartition(_PIPELINE_ANNOTATION)[2]
    return text


def _stripped_code(exc: BaseException) -> str | None:
    code = getattr(exc, "status_code", None)
    if code:
        return str(code)
    for cls in type(exc).__mro__:
        if cls.__name__ in _CODE_OF_CLASS:
            return _CODE_OF_CLASS[cls.__name__]
    return None


def reply_code(exc: BaseException) -> str:
    """The reply's error code (``MOVED``, ``NOPERM``, ``ERR``...), however redis-py presented it."""
    return _stripped_code(exc) or server_message(exc).split(" ", 1)[0]


def describe(exc: BaseException) -> str:
    """A one-line account of a broker error that is safe to log: the class, then the server's text
    (a connection error's text names the address, never a credential or an entry)."""
    code = _stripped_code(exc)
    text = server_message(exc)
    if code and not text.startswith(code):
        text = f"{code} {text}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """An error reply about the broker's state, not the batch's content: never a reason to split the
    batch or dead-letter an entry."""
    return reply_code(exc) in TRANSIENT_CODES
