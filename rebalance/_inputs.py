"""Validation and ordering of a rebalance's inputs, as RocketMQ's RebalanceImpl.

After ``sorted_queues`` and ``sorted_consumers`` the inputs hold no duplicates
and are in RocketMQ's order (queues by topic, broker name and queue id; consumer
ids as Java strings), so an allocation never depends on the callers' order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

from rebalance._java import java_string_key
from rebalance.message_queue import MessageQueue, queue_order_key

_T = TypeVar("_T")


def items_of(
    value: object, item_type: type[_T], name: str, collection: str, items: str
) -> list[_T]:
    """``value``'s items as a list, after checking it is a collection (not a lone
    string or queue) of ``item_type``; ``collection`` and ``items`` name what it
    must be and hold in the error."""
    if isinstance(value, (str, item_type)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a collection of {collection}, got {type(value).__name__}")
    checked = list(value)
    for item in checked:
        if not isinstance(item, item_type):
            raise TypeError(f"{name} must hold {items}, got {item!r}")
    return checked


def check_consumer_group(consumer_group: object) -> None:
    if not isinstance(consumer_group, str):
        raise TypeError(f"consumer_group must be a str, got {type(consumer_group).__name__}")


def check_current_cid(current_cid: object) -> None:
    if not isinstance(current_cid, str):
        raise TypeError(f"current_cid must be a str, got {type(current_cid).__name__}")
    if not current_cid:
        raise ValueError("current_cid is empty: the consumer to allocate for has no id")


def sorted_queues(mq_all: Iterable[MessageQueue]) -> list[MessageQueue]:
    """The distinct queues of ``mq_all`` in RocketMQ's order; never empty."""
    queues = set(items_of(mq_all, MessageQueue, "mq_all", "MessageQueue", "MessageQueue values"))
    if not queues:
        raise ValueError("mq_all is empty: there are no queues to allocate")
    return sorted(queues, key=queue_order_key)


def sorted_consumers(cid_all: Iterable[str]) -> list[str]:
    """The consumer ids of ``cid_all`` in RocketMQ's order; never empty.

    A duplicate id is an error rather than collapsed: two members claiming one
    id would consume the same queues.
    """
    consumers = items_of(cid_all, str, "cid_all", "consumer ids", "str consumer ids")
    for cid in consumers:
        if not cid:
            raise ValueError("cid_all holds an empty consumer id")
    if not consumers:
        raise ValueError("cid_all is empty: there are no consumers to allocate to")
    duplicates = sorted(cid for cid, count in Counter(consumers).items() if count > 1)
    if duplicates:
        raise ValueError(f"cid_all holds duplicate consumer ids: {duplicates}")
    return sorted(consumers, key=java_string_key)
