"""RocketMQ's ``AllocateMessageQueueByMachineRoom``: the queues of some rooms.

A queue is eligible when its broker is named ``<room>@<broker>`` (split as
Java's ``String.split("@")``, exactly two parts) and ``<room>`` is one of
``consumer_idcs``. The sorted eligible queues are cut into one block of
``e // c`` queues per consumer (in order), and the ``e % c`` left at the end go
one each to the first consumers. Every eligible queue is owned exactly once;
no other queue is owned by anyone.

``room_of_broker`` is that reading of a broker name on its own, for the other
parts that need a queue's room (``machine_room_nearby``'s room resolvers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rebalance._inputs import items_of
from rebalance._java import java_split
from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy, Group

ROOM_SEPARATOR = "@"


def room_of_broker(broker_name: str) -> str | None:
    """The room of a ``<room>@<broker>`` name, as RocketMQ splits it (exactly two
    parts); ``None`` for a name without one."""
    parts = java_split(broker_name, ROOM_SEPARATOR)
    return parts[0] if len(parts) == 2 else None


class MachineRoomStrategy(BaseStrategy):
    """Share the queues of the brokers in ``consumer_idcs`` among all consumers."""

    name: ClassVar[str] = "machine_room"

    def __init__(self, *, consumer_idcs: Iterable[str]) -> None:
        option = "machine_room option consumer_idcs"
        rooms = frozenset(items_of(consumer_idcs, str, option, "room names", "str room names"))
        if not rooms:
            raise ValueError(
                "machine_room option consumer_idcs is empty: no queue would be consumed"
            )
        self.consumer_idcs = rooms

    def is_eligible(self, mq: MessageQueue) -> bool:
        """Whether ``mq``'s broker is ``<room>@<broker>`` with a listed room."""
        return room_of_broker(mq.broker_name) in self.consumer_idcs

    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        eligible = [mq for mq in group.queues if self.is_eligible(mq)]
        index = group.consumers.index(current_cid)
        size, left_over = divmod(len(eligible), len(group.consumers))
        share = eligible[index * size : (index + 1) * size]
        if index < left_over:
            share.append(eligible[size * len(group.consumers) + index])
        return share

    def __repr__(self) -> str:
        return f"MachineRoomStrategy(consumer_idcs={sorted(self.consumer_idcs)!r})"
