"""The contract of an allocation strategy and the base the built-in ones share.

A strategy is a pure function of its options and its inputs: for one consumer
group, every consumer that runs it over the same queues and consumer ids gets a
share such that every eligible queue has exactly one owner, whatever order the
inputs came in. ``BaseStrategy`` does what RocketMQ's ``RebalanceImpl`` and
``AbstractAllocateMessageQueueStrategy`` do before a strategy runs: reject
empty inputs, drop duplicate queues, sort both lists, and give a consumer that
is not a member nothing.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from rebalance._inputs import (
    check_consumer_group,
    check_current_cid,
    sorted_consumers,
    sorted_queues,
)
from rebalance.message_queue import MessageQueue

_log = logging.getLogger("raymq.rebalance")


@runtime_checkable
class AllocateStrategy(Protocol):
    """Anything that splits a consumer group's queues among its members."""

    @property
    def name(self) -> str: ...

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Iterable[MessageQueue],
        cid_all: Iterable[str],
    ) -> list[MessageQueue]:
        """The queues ``current_cid`` owns among ``cid_all``."""
        ...


@dataclass(frozen=True, slots=True)
class Group:
    """A rebalance's checked inputs: sorted, distinct and non-empty."""

    name: str
    queues: Sequence[MessageQueue]
    consumers: Sequence[str]

    @classmethod
    def of(
        cls, consumer_group: str, mq_all: Iterable[MessageQueue], cid_all: Iterable[str]
    ) -> Group:
        """The checked inputs; ``TypeError`` or ``ValueError`` for bad ones."""
        check_consumer_group(consumer_group)
        return cls(consumer_group, sorted_queues(mq_all), sorted_consumers(cid_all))


class BaseStrategy(ABC):
    """Validates and sorts the inputs, then runs ``_allocate`` on them."""

    name: ClassVar[str]

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Iterable[MessageQueue],
        cid_all: Iterable[str],
    ) -> list[MessageQueue]:
        """The queues ``current_cid`` owns; ``[]`` if it is not in ``cid_all``."""
        check_consumer_group(consumer_group)
        check_current_cid(current_cid)
        group = Group.of(consumer_group, mq_all, cid_all)
        if current_cid not in group.consumers:
            _log.warning(
                "consumer %r is not a member of group %r (members: %s); it gets no queues",
                current_cid,
                consumer_group,
                group.consumers,
            )
            return []
        return self._allocate(group, current_cid)

    def allocate_all(
        self,
        consumer_group: str,
        mq_all: Iterable[MessageQueue],
        cid_all: Iterable[str],
    ) -> dict[str, list[MessageQueue]]:
        """Every member's ``allocate`` result at once, keyed in member order."""
        return self._allocate_all(Group.of(consumer_group, mq_all, cid_all))

    @abstractmethod
    def _allocate(self, group: Group, current_cid: str) -> list[MessageQueue]:
        """``current_cid``'s share; ``current_cid`` is one of ``group.consumers``."""

    def _allocate_all(self, group: Group) -> dict[str, list[MessageQueue]]:
        """Override where the whole group is cheaper in one pass."""
        return {cid: self._allocate(group, cid) for cid in group.consumers}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def allocate_all_with(
    strategy: AllocateStrategy,
    consumer_group: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
) -> dict[str, list[MessageQueue]]:
    """Every member's share under any strategy, in one pass where it has one."""
    if isinstance(strategy, BaseStrategy):
        return strategy.allocate_all(consumer_group, mq_all, cid_all)
    group = Group.of(consumer_group, mq_all, cid_all)
    return {
        cid: list(strategy.allocate(group.name, cid, group.queues, group.consumers))
        for cid in group.consumers
    }
