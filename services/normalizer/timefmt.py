"""Timestamps: raw `ts` values in, RFC 3339 UTC millisecond strings out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Years 0001..9999 only: anything else cannot be written as RFC 3339.
MIN_MS = -62135596800000
MAX_MS = 253402300799999


def parse_ts(value: object) -> int | None:
    """Unix ms from an int, a decimal string or an RFC 3339 string; None when unusable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        ms = value
    elif isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        text = text.strip()
        if not text:
            return None
        if text.lstrip("-").isdigit():
            ms = int(text)
        else:
            try:
                dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            except ValueError:
                return None
            if dt.tzinfo is None:
                return None  # RFC 3339 requires an offset; a naive time is ambiguous
            delta = dt - _EPOCH
            ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    else:
        return None
    return ms if MIN_MS <= ms <= MAX_MS else None


_last_second: tuple[int | None, str] = (None, "")
# ".000Z" .. ".999Z": the millisecond tail of every timestamp, formatted once.
_MILLIS = tuple(f".{milli:03d}Z" for milli in range(1000))


def format_ms(ms: int) -> str:
    global _last_second
    seconds = ms // 1000
    # Consecutive lines mostly share a second: reuse its formatted prefix. One tuple, swapped
    # in a single assignment, so concurrent threads never pair a second with another's text.
    cached = _last_second
    if cached[0] == seconds:
        return cached[1] + _MILLIS[ms - seconds * 1000]
    text = _format(ms)
    _last_second = (seconds, text[:19])
    return text


def _format(ms: int) -> str:
    seconds, milli = divmod(ms, 1000)
    # Arithmetic from the epoch works for years before 1970 too (fromtimestamp may not).
    dt = _EPOCH + timedelta(seconds=seconds)
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{milli:03d}Z"
