"""Splitting a pipe's byte chunks into lines, in bulk (the tap reads its child's output in large chunks).

Same lines as ``readline()`` on the whole stream followed by stripping one ``\\n`` and then one ``\\r``:
a last line without a newline is kept as it is (``\\r`` included). A property test in tests/tap/test_tap.py
holds the two together for arbitrary bytes and chunkings.
"""

from __future__ import annotations


class LineSplitter:
    """Feed chunks, get the complete lines they finish; ``rest()`` returns the unterminated tail.

    A line split over many chunks is kept as a list of pieces and joined once (no quadratic copying)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        end = chunk.rfind(b"\n")
        if end < 0:
            if chunk:
                self._parts.append(chunk)
            return []
        head = chunk[:end]
        if self._parts:
            self._parts.append(head)
            head = b"".join(self._parts)
            self._parts = []
        if end + 1 < len(chunk):
            self._parts.append(chunk[end + 1:])
        lines = head.split(b"\n")
        if b"\r" in head:
            lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
        return lines

    def rest(self) -> bytes | None:
        """The bytes after the last newline (None when there are none); the splitter is empty after."""
        if not self._parts:
            return None
        tail = b"".join(self._parts)
        self._parts = []
        return tail
