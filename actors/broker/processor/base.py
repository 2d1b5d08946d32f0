"""What a data-path processor holds (RocketMQ's processors share a base the same way)."""

from __future__ import annotations

from actors.broker.ha import Replication
from actors.broker.metrics import BrokerMetrics
from actors.broker.runtime import BrokerRuntime


class DataPathProcessor:
    """A processor of messages going in or out: the broker's runtime, its role (what a
    write waits for, what a read may return) and its metrics (None without them)."""

    def __init__(
        self, runtime: BrokerRuntime, role: Replication, metrics: BrokerMetrics | None
    ) -> None:
        self.rt = runtime
        self.role = role
        self.metrics = metrics
