"""Delay levels as the cluster's brokers define them (``message_delay_level``).

A producer that wants a delay in seconds needs the level that delays at least
that long; levels are broker configuration, so the client asks a live broker
once and caches the answer (RocketMQ's clients assume the default table; asking
keeps a cluster configured with other levels, such as the tests' short ones,
right).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from actors.protocol import rpc as _rpc
from storage.config import DEFAULT_DELAY_LEVELS, parse_delay_levels
from storage.errors import BrokerUnavailableError, InvalidMessageError
from storage.schedule import level_for_delay

if TYPE_CHECKING:
    from actors.client.instance import ClientView

DELAY_LEVELS_TIMEOUT_S = 10.0
_cache: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = {}
_lock = threading.Lock()


def default_levels_ms() -> tuple[int, ...]:
    """RocketMQ's table: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h."""
    return parse_delay_levels(DEFAULT_DELAY_LEVELS)


def broker_levels_ms(ns: ClientView, refresh: bool = False) -> tuple[int, ...]:
    """The delay levels (ms) of the cluster's live master brokers (they must agree)."""
    key = (ns.namespace, ns.nameservers)
    with _lock:
        cached = _cache.get(key)
    if cached is not None and not refresh:
        return cached
    brokers = ns.master_brokers()
    if not brokers:
        raise BrokerUnavailableError(f"no live broker in namespace {ns.namespace!r}")
    answers = _rpc.get([h.delay_levels.remote() for h in brokers.values()], DELAY_LEVELS_TIMEOUT_S)
    tables = {tuple(a) for a in answers}
    if len(tables) > 1:
        raise InvalidMessageError(
            f"brokers {sorted(brokers)} disagree on message_delay_level: {sorted(tables)}"
        )
    levels = tables.pop()
    with _lock:
        _cache[key] = levels
    return levels


def level_for_seconds(seconds: float, levels_ms: tuple[int, ...]) -> int:
    """The smallest level delaying at least ``seconds`` (0 for none; the top level when
    ``seconds`` is past it)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise InvalidMessageError(f"delay seconds={seconds!r}: must be a number >= 0")
    return level_for_delay(float(seconds), levels_ms)
