"""The identity of one message queue: a topic's queue on one broker.

A ``MessageQueue`` is a value: equal fields mean the same queue. Queues sort by
(topic, broker_name, queue_id), with the strings compared as Java compares them,
which is the order RocketMQ's ``RebalanceImpl`` sorts them in before allocating.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering

from rebalance._java import java_string_key


@total_ordering
@dataclass(frozen=True)
class MessageQueue:
    """One queue of ``topic`` on the broker group ``broker_name``."""

    topic: str
    broker_name: str
    queue_id: int

    def __post_init__(self) -> None:
        for name in ("topic", "broker_name"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"MessageQueue.{name} must be a str, got {type(value).__name__}")
            if not value:
                raise ValueError(f"MessageQueue.{name} must not be empty")
        if not isinstance(self.queue_id, int) or isinstance(self.queue_id, bool):
            raise TypeError(
                f"MessageQueue.queue_id must be an int, got {type(self.queue_id).__name__}"
            )
        if self.queue_id < 0:
            raise ValueError(f"MessageQueue.queue_id must be >= 0, got {self.queue_id}")

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return queue_order_key(self) < queue_order_key(other)


def queue_order_key(mq: MessageQueue) -> tuple[bytes, bytes, int]:
    """Sort key equal to RocketMQ's ``MessageQueue.compareTo`` order."""
    return (java_string_key(mq.topic), java_string_key(mq.broker_name), mq.queue_id)
