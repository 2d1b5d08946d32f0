"""Java-compatible hashing: ``String.hashCode`` one string at a time and vectorised,
and RocketMQ's index key hash (what the ConsumeQueue's tag codes and the IndexFile's
slots are computed with, so that files stay RocketMQ's)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

_MASK32 = 0xFFFFFFFF
# :func:`java_hashes` hashes in a Python loop up to this many characters in all
# (0.15 us a character against ~25 us of fixed cost for the vectorised path)
_SCALAR_HASH_CHARS = 160


def java_hash(s: str) -> int:
    """Java's ``String.hashCode``: 31-polynomial over UTF-16 code units, int32."""
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = (31 * h + c) & _MASK32
    else:
        data = s.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=1024)
def java_hash_cached(s: str) -> int:
    """:func:`java_hash` of a string a producer hashes at every batch (a topic with its
    key prefix, a tag): computed once, as the hash is a Python loop over characters."""
    return java_hash(s)


_POW31 = np.ones(1, dtype=np.uint32)


def _pow31(n: int) -> np.ndarray:
    global _POW31
    if len(_POW31) < n:
        table = np.empty(max(n, 2 * len(_POW31)), dtype=np.uint32)
        value = 1
        for i in range(len(table)):
            table[i] = value
            value = (value * 31) & _MASK32
        _POW31 = table
    return _POW31


def java_hashes(strings: Sequence[str]) -> np.ndarray:
    """:func:`java_hash` of many strings at once (int32 array), vectorised."""
    n = len(strings)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    joined = "".join(strings)
    if len(joined) <= _SCALAR_HASH_CHARS:
        return np.array([java_hash(s) for s in strings], dtype=np.int32)
    if joined.isascii():
        codes = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).astype(np.uint32)
        lengths = np.fromiter(map(len, strings), dtype=np.int64, count=n)
    else:
        codes = np.frombuffer(joined.encode("utf-16-be", "surrogatepass"), dtype=">u2").astype(
            np.uint32
        )
        lengths = np.fromiter(
            (len(s.encode("utf-16-be", "surrogatepass")) // 2 for s in strings),
            dtype=np.int64,
            count=n,
        )
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1])
    if total == 0:
        return np.zeros(n, dtype=np.int32)
    pos = np.arange(total, dtype=np.int64)
    seg_end = np.repeat(ends, lengths)
    weights = _pow31(int(lengths.max()) + 1)[seg_end - pos - 1]
    products = np.append(codes * weights, np.uint32(0))
    sums = np.add.reduceat(products, np.minimum(starts, total), dtype=np.uint32)
    sums[lengths == 0] = 0
    return sums.view(np.int32).copy()


def prefixed_java_hashes(prefix: str, chars: np.ndarray) -> np.ndarray:
    """``java_hash(prefix + row)`` for each row of an ``(n, w)`` ASCII array, as one
    wrapping uint32 product instead of n Python strings: the hash of a concatenation
    is ``hash(prefix) * 31**w + hash(row)`` modulo 2**32."""
    width = chars.shape[1]
    powers = _pow31(width + 1)
    rows = np.zeros(len(chars), dtype=np.uint32)
    if width:
        rows = chars.astype(np.uint32) @ powers[width - 1 :: -1]
    head = np.uint32((java_hash_cached(prefix) * int(powers[width])) & 0xFFFFFFFF)
    return np.asarray(rows + head, dtype=np.uint32).view(np.int32)


def index_key_hash(h: int) -> int:
    """RocketMQ's ``IndexService`` key hash: ``abs(hashCode)``, MIN_VALUE -> 0."""
    return 0 if h == -(1 << 31) else abs(h)
