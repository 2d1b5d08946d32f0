"""RocketMQ's ``AllocateMessageQueueAveragelyByCircle``: round robin.

Queue ``k`` of the sorted queues belongs to consumer ``k % c`` of the ``c``
sorted consumers, so every queue is owned exactly once and neighbouring queues
go to different consumers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy


class CircleStrategy(BaseStrategy):
    """Deal the sorted queues to the sorted consumers like cards."""

    name: ClassVar[str] = "circle"

    def _allocate(
        self,
        consumer_group: str,
        current_cid: str,
        queues: Sequence[MessageQueue],
        consumers: Sequence[str],
    ) -> list[MessageQueue]:
        index = consumers.index(current_cid)
        return list(queues[index :: len(consumers)])
