"""RocketMQ's ``AllocateMessageQueueConsistentHash``: an MD5 hash ring.

Each consumer id ``cid`` puts ``virtual_nodes`` points on the ring of
``rebalance._hash``; a queue belongs to the owner of the text
``MessageQueue [topic=T, brokerName=B, queueId=Q]`` (RocketMQ's
``MessageQueue.toString``), so owners equal RocketMQ's. Every queue is owned
exactly once. When a consumer leaves, only its queues move; when one joins,
queues only move to it.
"""

from __future__ import annotations

from typing import ClassVar

from rebalance._hash import HashRing
from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy, Group


def queue_hash_key(mq: MessageQueue) -> str:
    """The text RocketMQ hashes for a queue: its Java ``toString``."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


class ConsistentHashStrategy(BaseStrategy):
    """Route every queue to the nearest consumer point on a hash ring."""

    name: ClassVar[str] = "consistent_hash"

    def __init__(self, *, virtual_nodes: int = 10) -> None:
        if not isinstance(virtual_nodes, int) or isinstance(virtual_nodes, bool):
            raise TypeError(
                "consistent_hash option virtual_nodes must be an int, "
                f"got {type(virtual_nodes).__name__}"
            )
        if virtual_nodes < 1:
            # RocketMQ accepts 0 and then assigns no queue at all.
            raise ValueError(
                f"consistent_hash option virtual_nodes must be >= 1, got {virtual_nodes}"
            )
        self.virtual_nodes = virtual_nodes

    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        ring = HashRing(group.consumers, self.virtual_nodes)
        return [mq for mq in group.queues if ring.route(queue_hash_key(mq)) == current_cid]

    def _allocate_all(self, group: Group) -> dict[str, list[MessageQueue]]:
        ring = HashRing(group.consumers, self.virtual_nodes)
        shares: dict[str, list[MessageQueue]] = {cid: [] for cid in group.consumers}
        for mq in group.queues:
            shares[ring.route(queue_hash_key(mq))].append(mq)
        return shares

    def __repr__(self) -> str:
        return f"ConsistentHashStrategy(virtual_nodes={self.virtual_nodes})"
