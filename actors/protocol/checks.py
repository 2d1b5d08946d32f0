"""Checks of the values a caller hands an actor: the handle is the trust boundary.

A client library validates what its user gives it, but anyone holding an actor
handle can call a method with anything (an object built around its own checks, a
path-like name, a negative count). Actors check their arguments again with these,
and refuse with an ``InvalidMessageError`` that names the argument, the value and
the limit, before anything changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from storage.codec import validate_queue_id, validate_topic
from storage.errors import InvalidMessageError

MAX_GROUP_LEN = 120
"""So that ``%RETRY%<group>`` and ``%DLQ%<group>`` are valid topic names (127 chars)."""
GROUP_RE = re.compile(rf"[A-Za-z0-9_%|-]{{1,{MAX_GROUP_LEN}}}")
MAX_KEY_LEN = 4096


def validate_group(group: object, what: str = "group") -> str:
    """A consumer or producer group name: RocketMQ's ``[%|a-zA-Z0-9_-]``, 1..120 chars."""
    if not isinstance(group, str) or not GROUP_RE.fullmatch(group):
        raise InvalidMessageError(
            f"{what}={group!r}: must match [A-Za-z0-9_%|-]{{1,{MAX_GROUP_LEN}}}"
        )
    return group


def check_int(what: str, value: object, lo: int, hi: int | None = None) -> int:
    """An int (not a bool) in ``lo..hi``."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < lo
        or (hi is not None and value > hi)
    ):
        limit = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise InvalidMessageError(f"{what}={value!r}: must be an int {limit}")
    return value


def check_half_ref(value: object) -> int | str:
    """A multi-message transaction's half message as a commit names it: its CommitLog
    offset (an int >= 0) or, where a retried send left the offset unknown, its message
    id (the ``UNIQ_KEY`` its producer gave it)."""
    if isinstance(value, str):
        return check_str("half message id", value)
    return check_int("half offset", value, 0)


def check_number(what: str, value: object, lo: float = 0.0) -> float:
    """A finite int or float >= ``lo``."""
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not lo <= value < float("inf")
    ):
        raise InvalidMessageError(f"{what}={value!r}: must be a number >= {lo}")
    return float(value)


def check_str(what: str, value: object, max_len: int = MAX_KEY_LEN, empty: bool = False) -> str:
    """A str of at most ``max_len`` characters (non-empty unless ``empty``)."""
    if not isinstance(value, str) or len(value) > max_len or (not empty and not value):
        raise InvalidMessageError(
            f"{what}={value!r}: must be a {'' if empty else 'non-empty '}str of at most "
            f"{max_len} characters"
        )
    return value


def check_queue_offsets(what: str, value: object) -> dict[tuple[str, int], Any]:
    """A ``{(topic, queue_id): value}`` mapping with valid topics and queue ids."""
    if not isinstance(value, Mapping):
        raise InvalidMessageError(
            f"{what}: expected a dict of (topic, queue_id) -> value, got {type(value).__name__}"
        )
    out = {}
    for key, v in value.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise InvalidMessageError(f"{what}: key {key!r} must be a (topic, queue_id) pair")
        out[(validate_topic(key[0]), validate_queue_id(key[1]))] = v
    return out
