"""RocketMQ's ``AllocateMachineRoomNearby``: consume in your own machine room.

Queues and consumers are grouped by room (``broker_room`` / ``consumer_room``).
The queues of a room that has consumers are split among exactly those
consumers by the ``inner`` strategy; the queues of a room with no consumer are
split, room by room, among all consumers by the same strategy. A consumer's
share is its own room's part followed by the consumerless rooms' parts in room
order (rooms compared as Java strings). If ``inner`` owns every queue it is
given exactly once, so does this strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

from rebalance._java import java_string_key
from rebalance.message_queue import MessageQueue
from rebalance.strategy import AllocateStrategy, BaseStrategy, Group, allocate_all_with

_T = TypeVar("_T")


class MachineRoomNearbyStrategy(BaseStrategy):
    """Prefer consumers in the queue's own room; share orphaned rooms' queues."""

    name: ClassVar[str] = "machine_room_nearby"

    def __init__(
        self,
        *,
        inner: AllocateStrategy,
        broker_room: Callable[[MessageQueue], str],
        consumer_room: Callable[[str], str],
    ) -> None:
        if not isinstance(inner, AllocateStrategy):
            raise TypeError(
                "machine_room_nearby option inner must be a strategy or a strategy name, "
                f"got {type(inner).__name__}"
            )
        for option, value in (
            ("broker_room", broker_room),
            ("consumer_room", consumer_room),
        ):
            if not callable(value):
                raise TypeError(
                    f"machine_room_nearby option {option} must be callable, "
                    f"got {type(value).__name__}"
                )
        self.inner = inner
        self.broker_room = broker_room
        self.consumer_room = consumer_room

    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        queues_by_room = self._group(group.queues, self._room_of_queue)
        consumers_by_room = self._group(group.consumers, self._room_of_consumer)
        own_room = self._room_of_consumer(current_cid)
        share: list[MessageQueue] = []
        own_queues = queues_by_room.pop(own_room, None)
        if own_queues:
            share += self.inner.allocate(
                group.name, current_cid, own_queues, consumers_by_room[own_room]
            )
        for room, room_queues in queues_by_room.items():
            if room not in consumers_by_room:
                share += self.inner.allocate(group.name, current_cid, room_queues, group.consumers)
        return share

    def _allocate_all(self, group: Group) -> dict[str, list[MessageQueue]]:
        queues_by_room = self._group(group.queues, self._room_of_queue)
        consumers_by_room = self._group(group.consumers, self._room_of_consumer)
        shares: dict[str, list[MessageQueue]] = {cid: [] for cid in group.consumers}
        # Each consumer is in one room, so its own room's part comes first.
        for room, room_consumers in consumers_by_room.items():
            room_queues = queues_by_room.get(room)
            if room_queues:
                self._extend(shares, group.name, room_queues, room_consumers)
        for room, room_queues in queues_by_room.items():
            if room not in consumers_by_room:
                self._extend(shares, group.name, room_queues, group.consumers)
        return shares

    def _extend(
        self,
        shares: dict[str, list[MessageQueue]],
        consumer_group: str,
        queues: Sequence[MessageQueue],
        consumers: Sequence[str],
    ) -> None:
        parts = allocate_all_with(self.inner, consumer_group, queues, consumers)
        for cid, part in parts.items():
            shares[cid] += part

    @staticmethod
    def _group(items: Sequence[_T], room_of: Callable[[_T], str]) -> dict[str, list[_T]]:
        """Items by room, rooms in Java string order, items in their given order."""
        groups: dict[str, list[_T]] = {}
        for item in items:
            groups.setdefault(room_of(item), []).append(item)
        return {room: groups[room] for room in sorted(groups, key=java_string_key)}

    def _room_of_queue(self, mq: MessageQueue) -> str:
        return _checked_room(self.broker_room(mq), "broker_room", mq)

    def _room_of_consumer(self, cid: str) -> str:
        return _checked_room(self.consumer_room(cid), "consumer_room", cid)

    def __repr__(self) -> str:
        return f"MachineRoomNearbyStrategy(inner={self.inner!r})"


def _checked_room(room: object, option: str, of: object) -> str:
    if not isinstance(room, str):
        raise TypeError(
            f"machine_room_nearby option {option} must return a str room, got {room!r} for {of!r}"
        )
    if not room:
        raise ValueError(f"machine_room_nearby option {option} returned an empty room for {of!r}")
    return room
