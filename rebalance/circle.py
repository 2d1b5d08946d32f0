"""RocketMQ's ``AllocateMessageQueueAveragelyByCircle``: round robin.

Queue ``k`` of the sorted queues belongs to consumer ``k % c`` of the ``c``
sorted consumers, so every queue is owned exactly once and neighbouring queues
go to different consumers.
"""

from __future__ import annotations

from typing import ClassVar

from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy, Group


class CircleStrategy(BaseStrategy):
    """Deal the sorted queues to the sorted consumers like cards."""

    name: ClassVar[str] = "circle"

    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        index = group.consumers.index(current_cid)
        return list(group.queues[index :: len(group.consumers)])
