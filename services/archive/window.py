"""Time windows of `replay` and `reprocess` (`--since`/`--until`): pure, no I/O, no pyarrow.

A window is a range of stream-id milliseconds, i.e. of the time the broker accepted the raw
entries. Not the agents' own timestamps: those come from the hosts' clocks and can be anything
(a broken clock, a hostile line); the stream id is the one clock the log of record is ordered by,
and the archive's date partitions are named after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from services.settings import ConfigError

DAY_MS = 86_400_000
# A segment that starts this long before `since` is still listed: the consumer cuts segments at
# ARCHIVE_SEGMENT_MAX_AGE_S (minutes), so one day is a wide margin even for a lagging archive.
LOOKBACK_MS = DAY_MS
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS}


def date_of(ms: int) -> str:
    """`YYYY-MM-DD` (UTC) of a time in ms (the archive's date partitions, segments.date_of_ms)."""
    return datetime.fromtimestamp(max(ms, 0) / 1000, UTC).strftime("%Y-%m-%d")


# ---------------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class Window:
    """A time window of stream ids (their milliseconds): [since_ms, until_ms); None = unbounded."""

    since_ms: int | None = None
    until_ms: int | None = None

    @property
    def everything(self) -> bool:
        return self.since_ms is None and self.until_ms is None

    def contains(self, ms: int) -> bool:
        return (self.since_ms is None or ms >= self.since_ms) and (self.until_ms is None or ms < self.until_ms)

    def around(self, margin_ms: int = LOOKBACK_MS) -> Window:
        """The window to READ for this one's runs: `margin_ms` more on each side, so that a run with
        an entry inside is rebuilt from its entries before `since` and after `until` too."""
        return Window(None if self.since_ms is None else max(self.since_ms - margin_ms, 0),
                      None if self.until_ms is None else self.until_ms + margin_ms)

    def dates(self, lookback_ms: int = LOOKBACK_MS) -> list[str] | None:
        """The date partitions to list (None: all of them, i.e. no since)."""
        if self.since_ms is None:
            return None
        end = self.until_ms if self.until_ms is not None else _now_ms()
        day = max(self.since_ms - lookback_ms, 0) // DAY_MS
        out = []
        while day * DAY_MS < end:
            out.append(date_of(day * DAY_MS))
            day += 1
        return out or [date_of(self.since_ms)]

    def describe(self) -> str:
        def at(ms: int | None) -> str:
            return "…" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        return "everything" if self.everything else f"[{at(self.since_ms)}, {at(self.until_ms)})"


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def parse_time(text: str, option: str, now_ms: int | None = None) -> int:
    """Milliseconds since the epoch of `--since`/`--until`: an ISO 8601 date or date-time (UTC
    unless it names its offset: `2026-12-01`, `2026-12-01T05:00:00Z`, `2026-12-01 05:00+01:00`) or
    a time ago (`90m`, `3h`, `2d`, `45s`). ConfigError with one line otherwise."""
    value = text.strip()
    m = _RELATIVE.match(value)
    if m:
        now = _now_ms() if now_ms is None else now_ms
        return now - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected an ISO 8601 date or time (2026-12-01, 2026-12-01T05:00:00Z) "
                          "or a time ago (90m, 3h, 2d)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def window(since: str | None, until: str | None, now_ms: int | None = None) -> Window:
    """The window of `--since`/`--until`; ConfigError when it is empty."""
    w = Window(parse_time(since, "--since", now_ms) if since else None, parse_time(until, "--until", now_ms) if until else None)
    if w.since_ms is not None and w.until_ms is not None and w.until_ms <= w.since_ms:
        raise ConfigError(f"--until {until!r} is not after --since {since!r}: the window is empty")
    return w


