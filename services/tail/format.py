"""One line per harness event or run record, readable at a glance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_WIDTH = 100
_SUCCESS_MARK: dict[object, str] = {True: " ✓", False: " ✗"}  # keyed by `isSuccess`; absent: no mark


def _short(text: Any, width: int = _WIDTH) -> str:
    s = text if isinstance(text, str) else repr(text)
    s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def summary(event: Mapping[str, Any]) -> str:
    t = event.get("type")
    ok = _SUCCESS_MARK.get(event.get("isSuccess"), "")
    if t in ("agent", "reasoning", "error", "warning"):
        # the CLI's own code and the contract's class side by side: a page names the class
        # (`auth`), the agent's output the code (`server_error`, `authentication_failed`)
        tags = [str(event[k]) for k in ("code", "errorClass") if event.get(k)]
        return _short(event.get("message", "")) + (f" [{' '.join(tags)}]" if tags else "")
    if t == "command":
        code = f" (exit {event['exitCode']})" if "exitCode" in event else ""
        return f"$ {_short(event.get('command', ''), 80)}{code}{ok}"
    if t in ("read", "write"):
        span = ""
        if "startLine" in event:
            span = f":{event['startLine']}" + (f"-{event['endLine']}" if "endLine" in event else "")
        return f"{event.get('path', '')}{span}{ok}"
    if t == "search":
        where = f" in {event['path']}" if "path" in event else ""
        return f"{_short(event.get('query', ''), 60)!r}{where}{ok}"
    if t == "list":
        return f"{event.get('path', '.')}{ok}"
    if t == "skill":
        return f"{event.get('skillName', '')} {event.get('path', '')}{ok}"
    raw = event.get("raw")
    kind = raw.get("type") if isinstance(raw, dict) else type(raw).__name__
    tool = f" {event['tool']}" if "tool" in event else ""
    return f"<{kind}>{tool}"


def when(item: Mapping[str, Any]) -> str:
    """`2026-12-01 05:02:42.674` from the contract's ISO timestamp (date included: runs outlive a day)."""
    ts = str(item.get("timestamp", ""))
    return f"{ts[:10]} {ts[11:23]}" if len(ts) >= 23 else ts


def event_line(event: Mapping[str, Any], host: str | None = None) -> str:
    """`host`: the run's host label, when the caller knows it (`tail --class` names it)."""
    ts = when(event)
    where = f" host={host}" if host else ""
    return f"{ts} {event.get('runId', '')}#{event.get('seq', '')}{where} {event.get('type', ''):<9} {summary(event)}"


def record_line(record: Mapping[str, Any]) -> str:
    ts = when(record)
    counts = record.get("counts") or {}
    nonzero = " ".join(f"{k}={v}" for k, v in counts.items() if v)
    extra = ""
    if "exitCode" in record:
        extra += f" exit={record['exitCode']}"
    if "totalTokens" in record:
        extra += f" tokens={record['totalTokens']}"
    if "missing" in record:
        extra += f" missing={record['missing']}"
    return f"{ts} {record.get('runId', '')} RUN {record.get('state', '').upper()}{extra} [{nonzero}]"
