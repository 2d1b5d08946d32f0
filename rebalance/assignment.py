"""A whole consumer group's assignment under one strategy.

``assign`` gives every member its ``allocate`` result computed over the same
sorted inputs, so the shares are exactly what each member would compute for
itself: for every strategy but ``config``, each eligible queue appears in
exactly one share.
"""

from __future__ import annotations

from collections.abc import Iterable

from rebalance.message_queue import MessageQueue
from rebalance.registry import get_strategy
from rebalance.strategy import AllocateStrategy, allocate_all_with


def assign(
    strategy: AllocateStrategy | str,
    consumer_group: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
) -> dict[str, list[MessageQueue]]:
    """Each consumer id of ``cid_all`` mapped to its queues, ids in sorted order.

    ``strategy`` is a strategy object or the name of a built-in one that needs
    no options.
    """
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    elif not isinstance(strategy, AllocateStrategy):
        raise TypeError(f"strategy must be a strategy or a strategy name, got {strategy!r}")
    return allocate_all_with(strategy, consumer_group, mq_all, cid_all)
