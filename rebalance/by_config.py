"""RocketMQ's ``AllocateMessageQueueByConfig``: a fixed list of queues.

Every member gets the configured ``queues``, in the configured order, whatever
the group's queues and members are. This is the one built-in strategy that does
not give each queue a single owner: it is meant for a group of one, or for
consumers that must all read the same queues.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rebalance._inputs import items_of
from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy, Group


class ConfigStrategy(BaseStrategy):
    """Give every member the same configured queues."""

    name: ClassVar[str] = "config"

    def __init__(self, *, queues: Iterable[MessageQueue]) -> None:
        configured = tuple(
            items_of(
                queues, MessageQueue, "config option queues", "MessageQueue", "MessageQueue values"
            )
        )
        if not configured:
            raise ValueError("config option queues is empty: nothing would be consumed")
        if len(set(configured)) != len(configured):
            raise ValueError("config option queues lists a queue more than once")
        self.queues = configured

    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        return list(self.queues)

    def __repr__(self) -> str:
        return f"ConfigStrategy(queues={list(self.queues)!r})"
