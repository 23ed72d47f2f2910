"""Shard routing and key names, shared by every producer and consumer.

The shard function is CRC-32 (IEEE, as zlib, Go's hash/crc32 and most shippers compute it)
of the UTF-8 run key, modulo the shard count, so shippers in any language route alike.
"""

from __future__ import annotations

import zlib


def shard_of(run: str, shards: int) -> int:
    return zlib.crc32(run.encode("utf-8")) % shards
