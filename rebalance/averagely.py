"""RocketMQ's ``AllocateMessageQueueAveragely``: contiguous, even blocks.

With ``n`` queues and ``c`` consumers (both sorted), consumer ``i`` owns one
contiguous block; blocks have ``n // c`` queues and the first ``n % c``
consumers get one more. Every queue is owned exactly once; when ``n < c`` the
last ``c - n`` consumers own nothing.
"""

from __future__ import annotations

from typing import ClassVar

from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy, Group


class AveragelyStrategy(BaseStrategy):
    """Split the sorted queues into one contiguous block per consumer."""

    name: ClassVar[str] = "averagely"

    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        index = group.consumers.index(current_cid)
        size, extra = divmod(len(group.queues), len(group.consumers))
        start = index * size + min(index, extra)
        end = start + size + (1 if index < extra else 0)
        return list(group.queues[start:end])
