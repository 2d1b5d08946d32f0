"""Lite topics from Python: :class:`LiteProducer` and :class:`LiteConsumer`.

A lite topic lives on one master broker of its parent topic: the one at
``crc32(name) % n`` of the parent's writable master brokers, sorted by name, so every
producer and consumer finds it at the same place while the parent's brokers stay the
same. Calls go over the broker's socket as a normal send or pull does (the lite
requests of ``actors.protocol.requests.lite``, served by
``actors.broker.lite.processor``); ``data_path="ray"`` makes them Ray calls to the
broker's ``lite_*`` methods instead.

Within a consumer group a lite topic is consumed by one consumer at a time (the first
subscriber; another takes over when it unsubscribes, closes or falls silent). A
consumer acks a lite topic up to an offset; the group resumes from there, and
:meth:`LiteConsumer.pull` reads a lite topic from any offset the caller kept.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from actors.client import instance as _instance
from actors.protocol import rpc
from actors.protocol.checks import check_number, validate_group
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.topic import is_writeable
from storage.codec import validate_topic
from storage.errors import InvalidMessageError, TopicNotFoundError
from storage.lite import validate_lite_name
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.client.lite")

__all__ = ["LiteBatch", "LiteConsumer", "LiteProducer", "home_broker", "send_item_topic"]


@dataclass(frozen=True)
class LiteBatch:
    """Messages of one lite topic from ``offset``; ack ``next_offset`` once consumed."""

    lite_topic: str
    offset: int
    messages: list[MessageExt]
    next_offset: int


def home_broker(route: Any, parent: str, lite_topic: str) -> str:
    """The broker of ``parent``'s route that holds ``lite_topic``: ``crc32(name) % n`` of
    its writable brokers sorted by name."""
    names = sorted({qd.broker_name for qd in route.queue_datas if is_writeable(qd.perm)})
    if not names:
        raise TopicNotFoundError(f"topic={parent!r}: no broker takes its lite topics")
    return names[zlib.crc32(lite_topic.encode()) % len(names)]


def _wait_first(calls: Sequence[Any], timeout: float) -> list[Any]:
    """Those of ``calls`` answered, once at least one is (at most ``timeout`` s)."""
    if all(isinstance(c, rpc.PendingCall) for c in calls):
        concurrent.futures.wait(
            [c.future() for c in calls], timeout, concurrent.futures.FIRST_COMPLETED
        )
        return [c for c in calls if c.done()]
    if not any(isinstance(c, rpc.PendingCall) for c in calls):
        return list(ray.wait(list(calls), num_returns=1, timeout=timeout)[0])
    return rpc.wait(calls, timeout)[0]  # mixed paths: all of them


def send_item_topic(item: Any) -> str:
    """A send item's lite topic, checked with the item's shape: ``(lite topic, body)``
    or ``(lite topic, body, options)``."""
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise InvalidMessageError(
            "a lite send item is (lite topic, body) or (lite topic, body, options)"
        )
    return validate_lite_name(item[0])


class _LiteClient:
    def __init__(
        self,
        parent: str,
        namespace: str,
        nameservers: Sequence[str] | None,
        call_timeout_s: float,
        kind: str,
        data_path: str,
    ) -> None:
        self.parent = validate_topic(parent)
        self.call_timeout_s = check_number("call_timeout_s", call_timeout_s)
        if data_path not in ("socket", "ray"):
            raise ValueError(f"data_path={data_path!r}: 'socket' or 'ray'")
        self._lease = _instance.share(self, namespace, nameservers, data_path=data_path, kind=kind)
        self.ns = self._lease.view
        self._closed = False

    def _home(self, lite_topic: str) -> str:
        return home_broker(self.ns.require_route(self.parent), self.parent, lite_topic)

    def _call(self, broker_name: str, method: str, *args: Any) -> Any:
        return self._call_many([broker_name], method, lambda _: args)[0]

    def _call_many(
        self,
        broker_names: Sequence[str],
        method: str,
        args_of: Any,
        wait_s: float = 0.0,
    ) -> list[Any]:
        """``method`` on each broker at once with ``args_of(broker name)``; the answers in
        order, once all came (a held call's timeout counts ``wait_s`` more)."""
        route = self.ns.require_route(self.parent)
        calls = []
        for name in broker_names:
            broker = self.ns.broker(route, name)
            calls.append(getattr(broker, method).remote(*args_of(name)))
        try:
            return list(rpc.get(calls, timeout=self.call_timeout_s + wait_s))
        except ray.exceptions.RayActorError:
            for name in broker_names:
                self.ns.forget_topic_broker(self.parent, name)
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._lease.release()

    def __enter__(self) -> _LiteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiteProducer(_LiteClient):
    """Sends to lite topics of ``parent`` (a topic created with type LITE)."""

    def __init__(
        self,
        parent: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        data_path: str = "socket",
    ) -> None:
        super().__init__(parent, namespace, nameservers, call_timeout_s, _instance.SEND, data_path)

    def send(
        self,
        lite_topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] | str = (),
        properties: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one message; ``{"lite_topic", "offset", "msg_id"}``."""
        opts: dict[str, Any] = {"tags": tags, "keys": keys, "properties": properties}
        return self.send_batch([(lite_topic, body, opts)])[0]

    def send_batch(
        self, items: Iterable[tuple[str, bytes] | tuple[str, bytes, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Send ``(lite topic, body)`` or ``(lite topic, body, {"tags", "keys",
        "properties"})`` items, one call per broker; the results in the items' order.
        Names are checked before anything is sent."""
        items = list(items)
        per_broker: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            per_broker.setdefault(self._home(send_item_topic(item)), []).append(i)
        out: list[dict[str, Any]] = [{} for _ in items]
        for name, picks in per_broker.items():
            results = self._call(name, "lite_send", self.parent, [items[i] for i in picks])
            for i, r in zip(picks, results):
                out[i] = r
        return out


class LiteConsumer(_LiteClient):
    """Consumes lite topics of ``parent`` for ``group``: subscribe and unsubscribe at
    any time, receive from the lite topics this consumer owns, ack, or pull from an
    offset."""

    def __init__(
        self,
        group: str,
        parent: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        call_timeout_s: float = 10.0,
        resync_s: float = 10.0,
        data_path: str = "socket",
    ) -> None:
        super().__init__(parent, namespace, nameservers, call_timeout_s, _instance.READ, data_path)
        self.resync_s = check_number("resync_s", resync_s)
        self._synced = 0.0
        self.group = validate_group(group)
        self.client_id = self._lease.instance.new_client_id(group)
        self._subscribed: set[str] = set()

    def subscribe(self, *lite_topics: str) -> list[str]:
        """Subscribe these lite topics (created if new); the lite topics this consumer
        owns among all it subscribes."""
        return self._change(lite_topics, "add")

    def unsubscribe(self, *lite_topics: str) -> list[str]:
        return self._change(lite_topics, "remove")

    def _change(self, lite_topics: Iterable[str], action: str) -> list[str]:
        names = [validate_lite_name(t) for t in lite_topics]
        per_broker: dict[str, list[str]] = {}
        for name in names:
            per_broker.setdefault(self._home(name), []).append(name)
        for broker, group_names in per_broker.items():
            self._call(
                broker,
                "lite_subscribe",
                self.group,
                self.parent,
                self.client_id,
                group_names,
                action,
            )
        self._synced = time.monotonic()
        if action == "add":
            self._subscribed.update(names)
        else:
            self._subscribed.difference_update(names)
        return self.owned()

    def owned(self) -> list[str]:
        """The subscribed lite topics this consumer consumes now (renews its claim)."""
        owned: list[str] = []
        for broker in sorted({self._home(n) for n in self._subscribed}):
            view = self._call(
                broker, "lite_subscribe", self.group, self.parent, self.client_id, [], "add"
            )
            owned.extend(view["owned"])
        return sorted(owned)

    def receive(self, max_count: int = 32, wait_s: float = 0.0) -> list[LiteBatch]:
        """Messages of the owned lite topics from where the group stands, per topic.
        With none, the call is held up to ``wait_s`` for a send to one of them: on one
        broker, by that broker; on several, each is asked at once whether it has any
        (held there) and the first that has is received from. Every ``resync_s`` it
        first sends its whole subscription again (a broker started anew knows none)."""
        wait_ms = int(check_number("wait_s", wait_s) * 1000)
        if time.monotonic() - self._synced >= self.resync_s and self._subscribed:
            self._change(sorted(self._subscribed), "add")
        brokers = sorted({self._home(n) for n in self._subscribed})
        if len(brokers) > 1 and wait_ms:
            got = self._receive_from(brokers, max_count)
            if got:
                return got
            ready = self._first_with_messages(brokers, wait_ms)
            return self._receive_from(ready, max_count) if ready else []
        answers = self._call_many(
            brokers,
            "lite_receive",
            lambda _: (self.group, self.parent, self.client_id, max_count, wait_ms),
            wait_s,
        )
        return [
            LiteBatch(b["lite_topic"], b["offset"], b["messages"], b["next_offset"])
            for got in answers
            for b in got
        ]

    def _receive_from(self, brokers: Sequence[str], max_count: int) -> list[LiteBatch]:
        """What each of ``brokers`` hands out now (asked at once)."""
        answers = self._call_many(
            brokers,
            "lite_receive",
            lambda _: (self.group, self.parent, self.client_id, max_count, 0),
        )
        return [
            LiteBatch(b["lite_topic"], b["offset"], b["messages"], b["next_offset"])
            for got in answers
            for b in got
        ]

    def _first_with_messages(self, brokers: Sequence[str], wait_ms: int) -> list[str]:
        """The brokers that have messages for this consumer, as soon as one has: each is
        asked at once with a held peek (nothing handed out, so the peeks still held
        when one answers are left to time out at their brokers). None within
        ``wait_ms``: []."""
        route = self.ns.require_route(self.parent)
        args = (self.group, self.parent, self.client_id, 32, wait_ms, True)
        calls = {self.ns.broker(route, b).lite_receive.remote(*args): b for b in brokers}
        pending = list(calls)
        deadline = time.monotonic() + wait_ms / 1000 + self.call_timeout_s
        ready: list[str] = []
        while pending and not ready:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done = _wait_first(pending, left)
            for call in done:
                pending.remove(call)
                try:
                    if rpc.get([call], timeout=0)[0]:
                        ready.append(calls[call])
                except Exception as exc:  # noqa: BLE001 - the receive that follows tells
                    log.debug("lite peek on %s failed: %s", calls[call], exc)
        return sorted(ready)

    def ack(self, batch_or_topic: LiteBatch | str, next_offset: int | None = None) -> None:
        """Commit a lite topic for the group up to ``next_offset`` (a batch: its
        ``next_offset``)."""
        offset: int | None
        if isinstance(batch_or_topic, LiteBatch):
            topic, offset = batch_or_topic.lite_topic, batch_or_topic.next_offset
        else:
            topic, offset = batch_or_topic, next_offset
        if not isinstance(offset, int):
            raise InvalidMessageError(f"next_offset={offset!r}: an int is needed to ack {topic!r}")
        self._call(
            self._home(topic), "lite_ack", self.group, self.parent, self.client_id, topic, offset
        )

    def pull(
        self, lite_topic: str, offset: int, max_count: int = 32, wait_s: float = 0.0
    ) -> LiteBatch:
        """``lite_topic`` from ``offset`` (a resume from where the caller stood); with
        nothing there yet the broker holds the call up to ``wait_s`` for a send to it."""
        validate_lite_name(lite_topic)
        wait_ms = int(check_number("wait_s", wait_s) * 1000)
        args = (self.parent, lite_topic, offset, max_count, wait_ms)
        got = self._call_many([self._home(lite_topic)], "lite_pull", lambda _: args, wait_s)[0]
        return LiteBatch(lite_topic, offset, got["messages"], got["next_offset"])

    def committed_offset(self, lite_topic: str) -> int:
        return self._call(
            self._home(lite_topic), "lite_committed_offset", self.group, self.parent, lite_topic
        )

    def close(self) -> None:
        if not self._closed and self._subscribed:
            try:  # the lite topics pass to the group's other consumers at once
                self._change(sorted(self._subscribed), "remove")
            except Exception:  # noqa: BLE001 - they pass on anyway when its claim lapses
                log.warning("lite consumer %s: unsubscribe at close failed", self.client_id)
        super().close()
