"""Tag subscription expressions: ``"*"`` or ``"TagA || TagB"``.

The broker filters ConsumeQueue entries by tag hash (cheap, may let a hash
collision through); consumers then filter exactly by tag text.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .errors import InvalidMessageError
from .java_hash import java_hash


@lru_cache(maxsize=1024)
def parse_subscription(expression: str | None) -> frozenset[str] | None:
    """The set of tags an expression accepts, or ``None`` for every message."""
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise InvalidMessageError(f"subscription={expression!r}: must be a str")
    text = expression.strip()
    if text in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in text.split("||"))
    if "" in tags or any("\x01" in t or "\x02" in t for t in tags):
        raise InvalidMessageError(f"subscription={expression!r}: empty or invalid tag")
    return tags


@lru_cache(maxsize=1024)
def tag_codes(tags: frozenset[str]) -> np.ndarray:
    return np.array(sorted(java_hash(t) for t in tags), dtype=np.int64)


def matches(tags: frozenset[str] | None, message_tags: str | None) -> bool:
    return tags is None or (message_tags is not None and message_tags in tags)
