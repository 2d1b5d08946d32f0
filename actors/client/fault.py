"""Latency fault tolerance (RocketMQ's ``MQFaultStrategy``): avoid brokers that
failed or answered slowly, for a time that grows with how slow they were.

The durations are RocketMQ 5's (at most 30 s, for an answer slower than 15 s). A
broker is avoided as the master it was when it failed (``master``: its
:meth:`~actors.protocol.route.BrokerData.master_key`): once the route names another
master for it (a slave promoted, the broker restarted on another port), the broker
is available again at once, since what failed is no longer what a send would reach."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# a send that took >= LATENCY_MAX[i] seconds makes the broker unavailable for NOT_AVAILABLE[i]
LATENCY_MAX_S = (0.05, 0.1, 0.55, 1.8, 3.0, 5.0, 15.0)
NOT_AVAILABLE_S = (0.0, 0.0, 2.0, 5.0, 6.0, 10.0, 30.0)
_ISOLATES_FROM_S = min(m for m, w in zip(LATENCY_MAX_S, NOT_AVAILABLE_S) if w > 0)
"""The fastest answer that isolates its broker (an answer faster than this, from a
broker isolated for nothing, changes nothing)."""


class LatencyFaultTolerance:
    def __init__(
        self, isolation_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.isolation_s = isolation_s
        self._clock = clock
        self._until: dict[str, float] = {}
        self._master: dict[str, str | None] = {}  # the master each isolation is about
        self._lock = threading.Lock()

    def update(
        self,
        broker_name: str,
        latency_s: float,
        *,
        failed: bool = False,
        master: str | None = None,
    ) -> None:
        if not failed and latency_s < _ISOLATES_FROM_S and broker_name not in self._until:
            return  # the usual answer: nothing to isolate, nothing to lift (no lock taken)
        if failed:
            duration = self.isolation_s
        else:
            duration = 0.0
            for limit, wait in zip(reversed(LATENCY_MAX_S), reversed(NOT_AVAILABLE_S)):
                if latency_s >= limit:
                    duration = wait
                    break
        with self._lock:
            if duration > 0:
                self._until[broker_name] = self._clock() + duration
                self._master[broker_name] = master
            elif not failed:
                self._until.pop(broker_name, None)
                self._master.pop(broker_name, None)

    def is_available(self, broker_name: str, master: str | None = None) -> bool:
        """Whether sends may go to ``broker_name``, whose master is now ``master``."""
        until = self._until.get(broker_name)
        if until is None or self._clock() >= until:
            return True
        isolated = self._master.get(broker_name)
        if master is not None and isolated is not None and master != isolated:
            with self._lock:  # another master now: what failed is gone
                if self._master.get(broker_name) == isolated:
                    self._until.pop(broker_name, None)
                    self._master.pop(broker_name, None)
            return True
        return False

    def least_bad(self, broker_names: list[str]) -> str | None:
        """Of brokers all unavailable, the one that becomes available first."""
        if not broker_names:
            return None
        return min(broker_names, key=lambda b: self._until.get(b, 0.0))

    def snapshot(self) -> dict[str, float]:
        now = self._clock()
        return {b: round(u - now, 3) for b, u in self._until.items() if u > now}
