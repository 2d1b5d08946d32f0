"""Latency fault tolerance (RocketMQ's ``MQFaultStrategy``): avoid brokers that
failed or answered slowly, for a time that grows with how slow they were."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# a send that took >= LATENCY_MAX[i] seconds makes the broker unavailable for NOT_AVAILABLE[i]
LATENCY_MAX_S = (0.05, 0.1, 0.55, 1.0, 2.0, 3.0, 15.0)
NOT_AVAILABLE_S = (0.0, 0.0, 30.0, 60.0, 120.0, 180.0, 600.0)


class LatencyFaultTolerance:
    def __init__(
        self, isolation_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.isolation_s = isolation_s
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def update(self, broker_name: str, latency_s: float, *, failed: bool = False) -> None:
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
            elif not failed:
                self._until.pop(broker_name, None)

    def is_available(self, broker_name: str) -> bool:
        until = self._until.get(broker_name)
        return until is None or self._clock() >= until

    def least_bad(self, broker_names: list[str]) -> str | None:
        """Of brokers all unavailable, the one that becomes available first."""
        if not broker_names:
            return None
        return min(broker_names, key=lambda b: self._until.get(b, 0.0))

    def snapshot(self) -> dict[str, float]:
        now = self._clock()
        return {b: round(u - now, 3) for b, u in self._until.items() if u > now}
