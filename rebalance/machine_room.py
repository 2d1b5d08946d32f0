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

from collections.abc import Iterable, Sequence
from typing import ClassVar

from rebalance._java import java_split
from rebalance.message_queue import MessageQueue
from rebalance.strategy import BaseStrategy

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
        if isinstance(consumer_idcs, str) or not isinstance(consumer_idcs, Iterable):
            raise TypeError(
                "machine_room option consumer_idcs must be a collection of room "
                f"names, got {type(consumer_idcs).__name__}"
            )
        rooms = frozenset(consumer_idcs)
        for room in rooms:
            if not isinstance(room, str):
                raise TypeError(
                    f"machine_room option consumer_idcs must hold str room names, got {room!r}"
                )
        if not rooms:
            raise ValueError(
                "machine_room option consumer_idcs is empty: no queue would be consumed"
            )
        self.consumer_idcs = rooms

    def is_eligible(self, mq: MessageQueue) -> bool:
        """Whether ``mq``'s broker is ``<room>@<broker>`` with a listed room."""
        return room_of_broker(mq.broker_name) in self.consumer_idcs

    def _allocate(
        self,
        consumer_group: str,
        current_cid: str,
        queues: Sequence[MessageQueue],
        consumers: Sequence[str],
    ) -> list[MessageQueue]:
        eligible = [mq for mq in queues if self.is_eligible(mq)]
        index = consumers.index(current_cid)
        size, left_over = divmod(len(eligible), len(consumers))
        share = eligible[index * size : (index + 1) * size]
        if index < left_over:
            share.append(eligible[size * len(consumers) + index])
        return share

    def __repr__(self) -> str:
        return f"MachineRoomStrategy(consumer_idcs={sorted(self.consumer_idcs)!r})"
