"""Lite topics over gRPC: ``SyncLiteSubscription``, and the lite side of ``SendMessage``,
``ReceiveMessage`` and ``AckMessage``, onto the broker's
:class:`actors.broker.lite.processor.LiteProcessor`.

* A message whose ``system_properties.lite_topic`` is set goes to that lite topic of its
  topic, which must be a parent of type LITE (created with ``lite_create_parent``).
* ``SyncLiteSubscription`` changes the calling client's lite subscriptions in its group
  (``PARTIAL_ADD``, ``PARTIAL_REMOVE``, ``COMPLETE_ADD``, ``COMPLETE_REMOVE``).
* A receive from a LITE parent hands out messages of the lite topics the client owns,
  in order; each carries its lite topic and, as its ``queue_offset``, its offset in the
  lite topic. It long-polls: a write to the parent wakes it.
* An ack commits the lite topic's offset past the message for the group, never back.

The lite topics a gRPC client uses live on the broker it calls (its access point for
subscriptions, the parent's first queue's broker for receives, the queue it sends to):
a LITE parent served over gRPC is created on one master broker group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from actors.broker.grpc.activity import Activity, unary
from actors.broker.grpc.convert import (
    StatusError,
    overall_status,
    raymq_name,
    status,
    status_of,
    to_pb_message,
    to_store_message,
)
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.broker.lite.processor import (
    SUBSCRIBE_ADD,
    SUBSCRIBE_COMPLETE,
    SUBSCRIBE_REMOVE,
    SUBSCRIBE_RESYNC,
    LiteProcessor,
)
from storage.lite import MAX_NAME_LEN, NotALiteParentError
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.broker.grpc")

_ACTIONS = {
    pb.LiteSubscriptionAction.PARTIAL_ADD: SUBSCRIBE_ADD,
    pb.LiteSubscriptionAction.PARTIAL_REMOVE: SUBSCRIBE_REMOVE,
    # the official clients' periodic resync (every 30 s): it creates no lite topic
    pb.LiteSubscriptionAction.COMPLETE_ADD: SUBSCRIBE_RESYNC,
    pb.LiteSubscriptionAction.COMPLETE_REMOVE: SUBSCRIBE_COMPLETE,
}
_HANDLE_PREFIX = "lite:"
LITE_CLIENT_TYPES = (pb.ClientType.LITE_SIMPLE_CONSUMER, pb.ClientType.LITE_PUSH_CONSUMER)
MAX_LITE_SUBSCRIPTIONS = 1_000_000
"""The lite subscriptions a client may hold (``Settings.subscription.lite_subscription_quota``),
at most its parent's quota of lite topics."""


def lite_handle(lite_topic: str, next_offset: int) -> str:
    """The receipt handle of a lite message: its lite topic and the offset after it."""
    return f"{_HANDLE_PREFIX}{next_offset}:{lite_topic}"


def parse_lite_handle(handle: str) -> tuple[str, int]:
    """``(lite topic, offset after the message)`` of a handle :func:`lite_handle` made."""
    if handle.startswith(_HANDLE_PREFIX):
        offset, sep, lite_topic = handle[len(_HANDLE_PREFIX) :].partition(":")
        if sep and lite_topic and offset.isdigit():
            return lite_topic, int(offset)
    raise StatusError(pb.Code.INVALID_RECEIPT_HANDLE, f"not a lite receipt handle: {handle!r}")


def _split_characters(names: Sequence[str]) -> bool:
    """The official Python client 5.1.2's ``subscribe_lite(name)`` sends ``name`` spread
    into one entry per character (``extend`` of a string): a ``PARTIAL_ADD`` of several
    one-character names, which no client's single subscription sends otherwise."""
    return len(names) > 1 and all(len(n) == 1 for n in names)


class LiteActivity(Activity):
    """Lite subscriptions, sends, receives and acks (RocketMQ's proxy lite handling)."""

    def _lite_processor(self) -> LiteProcessor:
        if self.lite is None:
            raise StatusError(pb.Code.NOT_IMPLEMENTED, "this broker serves no lite topics")
        return self.lite

    def is_lite_parent(self, topic: str) -> bool:
        if self.lite is None:
            return False
        try:
            self.lite.store.parent_settings(topic)
        except NotALiteParentError:
            return False
        return True

    def _parent(self, resource: Any) -> str:
        topic = raymq_name(resource)
        if not self.is_lite_parent(topic):
            raise StatusError(
                pb.Code.BAD_REQUEST,
                f"topic {topic!r} is not of type LITE on {self.rt.config.broker_name}",
            )
        return topic

    def lite_settings(self, out: pb.Settings) -> None:
        """A lite consumer's limits: its subscriptions and the length of a lite topic's name."""
        sub = out.subscription
        quota = MAX_LITE_SUBSCRIPTIONS
        for entry in sub.subscriptions:
            try:
                topic = raymq_name(entry.topic)
            except StatusError:
                continue
            if self.is_lite_parent(topic):
                quota = min(quota, self._lite_processor().store.parent_settings(topic)["quota"])
        sub.lite_subscription_quota = quota
        sub.max_lite_topic_size = MAX_NAME_LEN

    # ------------------------------------------------------------ subscriptions
    @unary(spb.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        lite = self._lite_processor()
        parent = self._parent(request.topic)
        group = raymq_name(request.group, "group")
        client = self.client_id(context)
        if not client:
            raise StatusError(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
        action = _ACTIONS.get(request.action)
        if action is None:
            raise StatusError(pb.Code.BAD_REQUEST, f"unknown lite action {request.action}")
        names = list(request.lite_topic_set)
        if request.action == pb.LiteSubscriptionAction.COMPLETE_REMOVE:
            names = []
        elif request.action == pb.LiteSubscriptionAction.PARTIAL_ADD and _split_characters(names):
            names = ["".join(names)]
        view = await lite.consumers.subscribe(group, parent, client, names, action)
        if view["gone"]:  # expired or deleted since it subscribed: told again, not made
            self._notify_unsubscribe(client, view["gone"])
        subscribed = self._lite_clients.setdefault(client, set())
        if view["subscribed"]:
            subscribed.add((group, parent))
        else:
            subscribed.discard((group, parent))
            if not subscribed:
                del self._lite_clients[client]
        return spb.SyncLiteSubscriptionResponse(status=status())

    async def release_lite(self, client: str) -> None:
        """A terminated client's lite topics pass to the next subscribers of its groups."""
        lite = self.lite
        for group, parent in sorted(self._lite_clients.pop(client, ())):
            if lite is not None:
                await lite.consumers.subscribe(group, parent, client, [], SUBSCRIBE_COMPLETE)

    # ------------------------------------------------------------ send
    async def send_lite(self, request: Any) -> Any:
        """Messages that name lite topics, all of one LITE parent."""
        lite = self._lite_processor()
        parents = {raymq_name(m.topic) for m in request.messages}
        if len(parents) != 1:
            raise StatusError(pb.Code.BAD_REQUEST, "lite messages of one request: one topic")
        (parent,) = parents
        if not self.is_lite_parent(parent):
            raise StatusError(
                pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {parent!r} is not of type LITE: it takes no lite_topic",
            )
        max_body = self.rt.store.config.max_message_size
        items = []
        for m in request.messages:
            sp = m.system_properties
            if not sp.HasField("lite_topic"):
                raise StatusError(
                    pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                    f"a message to LITE topic {parent!r} names no lite_topic",
                )
            if sp.HasField("message_group") or sp.message_type == pb.MessageType.TRANSACTION:
                raise StatusError(
                    pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                    "a lite message has no message_group and is not transactional",
                )
            stored = to_store_message(m, parent, 0, max_body)
            items.append(
                (
                    sp.lite_topic,
                    stored.body,
                    {"tags": stored.tags, "keys": stored.keys, "properties": stored.properties},
                )
            )
        sent = await lite.send(parent, items)
        entries = [
            spb.SendResultEntry(
                status=status(),
                message_id=m.system_properties.message_id,
                offset=int(r["offset"]),
            )
            for m, r in zip(request.messages, sent)
        ]
        return spb.SendMessageResponse(status=status(), entries=entries)

    # ------------------------------------------------------------ receive
    def _wake(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """The store's dispatch listener: a write to a parent someone waits on wakes them."""
        waiting = self._lite_waiting.get(topic)
        if waiting is not None:
            waiting[0].call_soon_threadsafe(waiting[1].set)

    async def receive_lite(
        self, request: Any, context: Any, parent: str, wait_ms: int
    ) -> list[tuple[str, int, MessageExt]]:
        """Up to ``batch_size`` messages of the lite topics the client owns, each with its
        lite topic and offset; waits up to ``wait_ms`` for one."""
        lite = self._lite_processor()
        group = raymq_name(request.group, "group")
        client = self.client_id(context)
        if not client:
            raise StatusError(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        if not self._listening:
            self.rt.store.add_dispatch_listener(self._wake)
            self._listening = True
        while True:
            waiting = self._lite_waiting.get(parent)
            if waiting is None:
                waiting = self._lite_waiting[parent] = (loop, asyncio.Event())
            event = waiting[1]
            event.clear()  # before the look: a write after it wakes the wait below
            batches = await lite.receive(group, parent, client, request.batch_size)
            if batches:
                return [
                    (b["lite_topic"], b["offset"] + i, m)
                    for b in batches
                    for i, m in enumerate(b["messages"])
                ]
            left = deadline - loop.time()
            if left <= 0 or self.rt.closing:
                return []
            try:
                await asyncio.wait_for(event.wait(), left)
            except asyncio.TimeoutError:
                return []

    def lite_message(
        self, lite_topic: str, offset: int, ext: MessageExt, resource: Any, invisible_ms: int
    ) -> pb.Message:
        out = to_pb_message(
            ext,
            resource,
            receipt_handle=lite_handle(lite_topic, offset + 1),
            invisible_ms=invisible_ms,
        )
        sp = out.system_properties
        sp.lite_topic = lite_topic
        sp.message_type = pb.MessageType.LITE
        sp.queue_offset = offset
        return out

    # ------------------------------------------------------------ ack
    async def ack_lite(self, request: Any, context: Any, parent: str) -> Any:
        """Commit each lite topic's offset past its acked messages (never back: acks may
        arrive out of order), one answer per entry."""
        lite = self._lite_processor()
        group = raymq_name(request.group, "group")
        client = self.client_id(context)
        parsed: list[tuple[str, int] | StatusError] = []
        for entry in request.entries:
            try:
                parsed.append(parse_lite_handle(entry.receipt_handle))
            except StatusError as exc:
                parsed.append(exc)
        highest: dict[str, int] = {}
        for p in parsed:
            if not isinstance(p, StatusError):
                highest[p[0]] = max(highest.get(p[0], 0), p[1])
        failed: dict[str, BaseException] = {}
        for name, offset in highest.items():
            key = (group, parent, name)
            held = self._lite_acking.setdefault(key, [asyncio.Lock(), 0])
            held[1] += 1
            try:
                async with held[0]:  # one commit of a lite topic at a time: read, then move on
                    if offset > await lite.committed_offset(group, parent, name):
                        await lite.consumers.ack(group, parent, client, name, offset)
            except Exception as exc:  # noqa: BLE001 - each entry answers on its own
                failed[name] = exc
            finally:
                held[1] -= 1
                if not held[1]:
                    del self._lite_acking[key]
        entries = []
        for entry, p in zip(request.entries, parsed):
            if isinstance(p, StatusError):
                st = status(p.code, p.message)
            elif p[0] in failed:
                code, message = status_of(failed[p[0]])
                st = status(code, message)
                self.refused("AckMessage", code, message, failed[p[0]])
            else:
                st = status()
            entries.append(
                spb.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
                )
            )
        return spb.AckMessageResponse(status=overall_status(entries), entries=entries)
