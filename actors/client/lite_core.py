"""The core of the lite clients, shared by the threaded ones (:mod:`actors.client.lite`)
and the awaited ones (:mod:`actors.aio.lite`): where a lite topic lives, what a
consumer subscribes and owns, and which request each call makes to which broker
(a :class:`LiteCall`). A client only makes those calls, in its own way: a Ray or socket
call a thread waits on, or a socket request awaited on the caller's loop (as
``actors.client.transactional`` holds what the threaded and the awaited transactional
producers share).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from actors.client import instance as _instance
from actors.protocol.checks import check_number, validate_group
from actors.protocol.topic import is_writeable
from storage.codec import validate_topic
from storage.errors import InvalidMessageError, TopicNotFoundError
from storage.lite import validate_lite_name
from storage.message import MessageExt

__all__ = [
    "LiteBatch",
    "LiteCall",
    "LiteClientCore",
    "LiteConsumerCore",
    "LiteProducerCore",
    "LiteSendPlan",
    "home_broker",
    "send_item",
    "send_item_topic",
    "wait_ms_of",
]

#: How many messages a held peek asks a broker whether it has (it hands out none).
PEEK_COUNT = 32


@dataclass(frozen=True)
class LiteBatch:
    """Messages of one lite topic from ``offset``; ack ``next_offset`` once consumed."""

    lite_topic: str
    offset: int
    messages: list[MessageExt]
    next_offset: int


class LiteCall(NamedTuple):
    """One request to one broker: ``method(*args)`` on ``broker``, its answer awaited
    ``wait_s`` longer than the client's call timeout (a call the broker holds)."""

    broker: str
    method: str
    args: tuple[Any, ...]
    wait_s: float = 0.0


def home_broker(route: Any, parent: str, lite_topic: str) -> str:
    """The broker of ``parent``'s route that holds ``lite_topic``: ``crc32(name) % n`` of
    its writable brokers sorted by name."""
    names = sorted({qd.broker_name for qd in route.queue_datas if is_writeable(qd.perm)})
    if not names:
        raise TopicNotFoundError(f"topic={parent!r}: no broker takes its lite topics")
    return names[zlib.crc32(lite_topic.encode()) % len(names)]


def send_item_topic(item: Any) -> str:
    """A send item's lite topic, checked with the item's shape: ``(lite topic, body)``
    or ``(lite topic, body, options)``."""
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise InvalidMessageError(
            "a lite send item is (lite topic, body) or (lite topic, body, options)"
        )
    return validate_lite_name(item[0])


def send_item(
    lite_topic: str,
    body: bytes,
    tags: str | None,
    keys: Sequence[str] | str,
    properties: dict[str, str] | None,
) -> tuple[str, bytes, dict[str, Any]]:
    """The send item of one message with its options."""
    return lite_topic, body, {"tags": tags, "keys": keys, "properties": properties}


def wait_ms_of(wait_s: float) -> int:
    """``wait_s`` checked, in the milliseconds a held request takes."""
    return int(check_number("wait_s", wait_s) * 1000)


def _by_home(route: Any, parent: str, names: Iterable[str]) -> dict[str, list[str]]:
    """``names`` grouped by the broker that holds them, in their order."""
    per_broker: dict[str, list[str]] = {}
    for name in names:
        per_broker.setdefault(home_broker(route, parent, name), []).append(name)
    return per_broker


class LiteSendPlan:
    """A batch of send items as one ``lite_send`` per broker: names and shapes are
    checked here, before anything is sent; :meth:`results` puts the brokers' answers
    back in the items' order."""

    def __init__(self, parent: str, route: Any, items: Iterable[Any]) -> None:
        self._items = list(items)
        per_broker: dict[str, list[int]] = {}
        for i, item in enumerate(self._items):
            per_broker.setdefault(home_broker(route, parent, send_item_topic(item)), []).append(i)
        self._picks = list(per_broker.values())
        self.calls = [
            LiteCall(name, "lite_send", (parent, [self._items[i] for i in picks]))
            for name, picks in per_broker.items()
        ]

    def results(self, answers: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in self._items]
        for picks, results in zip(self._picks, answers):
            for i, result in zip(picks, results):
                out[i] = result
        return out


class LiteClientCore(_instance.SharedClient):
    """A lite client of ``parent`` with its checked settings; it takes its share of the
    process's client instance (NameServers, routes, broker handles) as every client
    does: ``_share`` for a producer, ``_join`` for a consumer."""

    def __init__(self, parent: str, call_timeout_s: float) -> None:
        self.parent = validate_topic(parent)
        self.call_timeout_s = check_number("call_timeout_s", call_timeout_s)
        self.closed = False

    def home(self, route: Any, lite_topic: str) -> str:
        return home_broker(route, self.parent, lite_topic)

    def _release(self) -> None:
        """Give the share back (once)."""
        if not self.closed:
            self.closed = True
            self._leave()


class LiteProducerCore(LiteClientCore):
    """A lite producer: its sends on the instance's send pool."""

    def __init__(
        self,
        parent: str,
        namespace: str,
        nameservers: Sequence[str] | None,
        call_timeout_s: float,
        connection: _instance.ConnectionOptions,
    ) -> None:
        super().__init__(parent, call_timeout_s)
        self._share(namespace, nameservers, connection, _instance.SEND)


class LiteConsumerCore(LiteClientCore):
    """A lite consumer of ``group``: the lite topics it subscribes, when to send them all
    again, and its requests, on the instance's read pool."""

    def __init__(
        self,
        group: str,
        parent: str,
        namespace: str,
        nameservers: Sequence[str] | None,
        call_timeout_s: float,
        resync_s: float,
        connection: _instance.ConnectionOptions,
    ) -> None:
        super().__init__(parent, call_timeout_s)
        self.resync_s = check_number("resync_s", resync_s)
        group = validate_group(group)
        self._join("lite consumer", group, namespace, nameservers, connection, _instance.READ)
        self._subscribed: set[str] = set()
        self._synced = 0.0

    def _subscribe_call(self, broker: str, names: list[str], action: str) -> LiteCall:
        return LiteCall(
            broker, "lite_subscribe", (self.group, self.parent, self.client_id, names, action)
        )

    def change_calls(
        self, route: Any, lite_topics: Iterable[str], action: str
    ) -> tuple[list[str], list[LiteCall]]:
        """The checked names, and one ``lite_subscribe`` per broker that holds them to
        ``action`` (``"add"`` or ``"remove"``) them."""
        names = [validate_lite_name(t) for t in lite_topics]
        per_broker = _by_home(route, self.parent, names)
        return names, [self._subscribe_call(b, group, action) for b, group in per_broker.items()]

    def changed(
        self, names: Iterable[str], action: str, answers: Iterable[dict[str, Any]] = ()
    ) -> None:
        """The brokers took ``action`` on ``names`` and answered ``answers`` (a
        ``keep`` answers the lite topics deleted or expired since: forgotten here, so
        the next resync does not create them again)."""
        self._synced = time.monotonic()
        if action == "add":
            self._subscribed.update(names)
        elif action == "keep":
            for view in answers:
                self._subscribed.difference_update(view.get("gone", ()))
        else:
            self._subscribed.difference_update(names)

    def subscription(self) -> list[str]:
        """The lite topics this consumer subscribes."""
        return sorted(self._subscribed)

    def resync_due(self) -> list[str]:
        """The whole subscription when it is due to be sent again (every ``resync_s``:
        a broker started anew knows none), as a ``keep``: the lite topics deleted or
        expired since are not created again; else []."""
        if time.monotonic() - self._synced >= self.resync_s:
            return self.subscription()
        return []

    def subscribed_brokers(self, route: Any) -> list[str]:
        return sorted(_by_home(route, self.parent, self._subscribed))

    def renew_calls(self, route: Any) -> list[LiteCall]:
        """A ``lite_subscribe`` of nothing new to each broker of the subscription: it
        renews the claim and answers what this consumer owns there."""
        return [self._subscribe_call(b, [], "add") for b in self.subscribed_brokers(route)]

    @staticmethod
    def owned_of(views: Iterable[dict[str, Any]]) -> list[str]:
        return sorted(name for view in views for name in view["owned"])

    def receive_calls(
        self, brokers: Iterable[str], max_count: int, wait_ms: int, peek: bool = False
    ) -> list[LiteCall]:
        """A ``lite_receive`` to each broker, held there up to ``wait_ms``; a ``peek``
        hands out nothing (it only answers whether there is something)."""
        if peek:
            args: tuple[Any, ...] = (
                self.group,
                self.parent,
                self.client_id,
                PEEK_COUNT,
                wait_ms,
                True,
            )
        else:
            args = (self.group, self.parent, self.client_id, max_count, wait_ms)
        return [LiteCall(b, "lite_receive", args, wait_ms / 1000) for b in brokers]

    @staticmethod
    def batches(answers: Iterable[Iterable[dict[str, Any]]]) -> list[LiteBatch]:
        return [
            LiteBatch(b["lite_topic"], b["offset"], b["messages"], b["next_offset"])
            for got in answers
            for b in got
        ]

    def ack_call(
        self, route: Any, batch_or_topic: LiteBatch | str, next_offset: int | None
    ) -> LiteCall:
        offset: int | None
        if isinstance(batch_or_topic, LiteBatch):
            topic, offset = batch_or_topic.lite_topic, batch_or_topic.next_offset
        else:
            topic, offset = batch_or_topic, next_offset
        if not isinstance(offset, int):
            raise InvalidMessageError(f"next_offset={offset!r}: an int is needed to ack {topic!r}")
        args = (self.group, self.parent, self.client_id, topic, offset)
        return LiteCall(self.home(route, topic), "lite_ack", args)

    def pull_call(
        self, route: Any, lite_topic: str, offset: int, max_count: int, wait_s: float
    ) -> LiteCall:
        validate_lite_name(lite_topic)
        args = (self.parent, lite_topic, offset, max_count, wait_ms_of(wait_s))
        return LiteCall(self.home(route, lite_topic), "lite_pull", args, wait_s)

    def pulled(self, lite_topic: str, offset: int, answer: dict[str, Any]) -> LiteBatch:
        return LiteBatch(lite_topic, offset, answer["messages"], answer["next_offset"])

    def committed_call(self, route: Any, lite_topic: str) -> LiteCall:
        args = (self.group, self.parent, lite_topic)
        return LiteCall(self.home(route, lite_topic), "lite_committed_offset", args)
