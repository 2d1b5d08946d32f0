"""The consistent-hash ring of RocketMQ's ``ConsistentHashRouter`` with MD5.

Every consumer puts ``virtual_nodes`` points on a ring of 32-bit positions, at
the MD5 position of ``"<cid>-<i>"``. A key belongs to the first point at or
after its own position, wrapping to the lowest point. So adding a consumer only
takes keys to it, and removing one only moves the keys it held.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable

from rebalance._java import java_utf8


def md5_hash(key: str) -> int:
    """RocketMQ's ``MD5Hash``: the digest's first 4 bytes, unsigned big-endian.

    Java folds the bytes into a ``long`` masking each with ``0xFF``, so the
    value is in ``[0, 2**32)`` and never negative.
    """
    digest = hashlib.md5(java_utf8(key), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


class HashRing:
    """An immutable ring built from ``nodes`` in the given order."""

    def __init__(self, nodes: Iterable[str], virtual_nodes: int) -> None:
        points: dict[int, str] = {}
        for node in nodes:
            for replica in range(virtual_nodes):
                # A collision keeps the later node, as Java's TreeMap.put does.
                points[md5_hash(f"{node}-{replica}")] = node
        if not points:
            raise ValueError("a hash ring needs at least one node and virtual node")
        self._positions = sorted(points)
        self._owners = [points[position] for position in self._positions]

    def route(self, key: str) -> str:
        """The node owning ``key``: the first point at or after its hash."""
        index = bisect_left(self._positions, md5_hash(key))
        return self._owners[index % len(self._positions)]
