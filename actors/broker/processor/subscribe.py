"""Serving subscriptions (``actors.protocol.requests.subscribe``): the broker writes a
consumer's new records to its open stream as they are stored, within the credit the
consumer renews.

A subscription is a lasting waiter of the hold service (``PullRequestHoldService.listen``)
on each of its queues: a dispatch to one marks that queue as having news and sets its
event, and the stream's task reads the queues with news (only those: a subscription of
many queues costs no more per message than one of a single queue) from where they stand, writes one answer (the queues with
records or a new offset, as a pull of several queues answers them, each with the offset
it was read from) and takes what it wrote off the credit. With no credit left it writes
nothing until CREDIT adds some: a consumer whose process queue is full stops its stream
by not renewing. What may be
read is the role's call, as for pulls (``Replication.readable``). A queue whose offset
is refused (too small, too far) is answered once with the store's status and next
offset, then left out until SUBSCRIPTION_UPDATE gives it again. A queue with news that
may no longer be read (its topic's perm, its read queue count changed) ends the
subscription with that refusal as SUBSCRIBE's answer, as a pull of it is refused.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from actors.broker.ha import Replication
from actors.broker.metrics import BrokerMetrics
from actors.broker.processor.base import DataPathProcessor
from actors.broker.runtime import BrokerRuntime
from actors.protocol.frame_server import Peer, ServerStream, current_stream
from actors.protocol.wire import pulls_to_wire
from storage.codec import validate_queue_id, validate_topic
from storage.errors import InvalidMessageError
from storage.message import GetStatus, RawGetResult

log = logging.getLogger("raymq.actors.broker.processor.subscribe")

_NOTHING_NEW = (
    GetStatus.OFFSET_OVERFLOW_ONE,
    GetStatus.NO_MESSAGE_IN_QUEUE,
    GetStatus.NO_MATCHED_LOGIC_QUEUE,
)
_READABLE_WAIT_S = 1.0  # records a majority does not hold yet (DLedger): looked at again


class Wakeup:
    """``asyncio.Event``'s ``set``, ``clear`` and ``wait`` for the one task that waits
    (the stream's), bound to the loop it was made on: ``Event.wait`` asks for the
    running loop each time, a ``getpid`` system call per message on Python 3.11."""

    __slots__ = ("_loop", "_set", "_waiter")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None


@dataclass(eq=False)
class Subscription:
    """One consumer's open stream: its queues' next offsets, its credit, its event."""

    group: str
    client_id: str
    tags: str | None
    max_count: int
    credit: int
    credit_bytes: int
    counts_bytes: bool = field(init=False)
    """Whether bytes count against the credit: a byte credit was given at the start."""
    offsets: dict[tuple[str, int], int] = field(default_factory=dict, init=False)
    news: dict[tuple[str, int], None] = field(default_factory=dict, init=False)
    """The queues that may have records past their offset, in the order they got them
    (an ordered set): a dispatch, an added queue, a read that left some behind."""
    wakers: dict[tuple[str, int], Any] = field(default_factory=dict, init=False)
    """Each queue's callback for the hold service (what ``unlisten`` is given)."""
    event: Wakeup = field(default_factory=Wakeup, init=False)
    ended: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.counts_bytes = self.credit_bytes > 0

    def wake(self) -> None:
        self.event.set()

    def waker(self, key: tuple[str, int]) -> Any:
        """The hold service's callback for queue ``key``: news there, and a wake-up."""
        news, event = self.news, self.event

        def wake() -> None:
            news[key] = None
            event.set()

        self.wakers[key] = wake
        return wake

    def end(self, why: str) -> None:
        if not self.ended:
            self.ended = why
        self.event.set()

    @property
    def has_credit(self) -> bool:
        return self.credit > 0 and (not self.counts_bytes or self.credit_bytes > 0)


def _credit(credit: int, credit_bytes: int) -> None:
    for name, value in (("credit", credit), ("credit_bytes", credit_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidMessageError(f"{name} must be an int >= 0, got {value!r:.40}")


class SubscribeProcessor(DataPathProcessor):
    """SUBSCRIBE, CREDIT, SUBSCRIPTION_UPDATE and UNSUBSCRIBE."""

    def __init__(
        self, runtime: BrokerRuntime, role: Replication, metrics: BrokerMetrics | None
    ) -> None:
        super().__init__(runtime, role, metrics)
        self.open = 0

    # ------------------------------------------------------------ the requests
    async def subscribe(
        self,
        group: str,
        queues: dict[tuple[str, int], int],
        tags: str | None = None,
        credit: int = 0,
        credit_bytes: int = 0,
        max_count: int = 32,
        client_id: str = "",
    ) -> str:
        """Writes the new records of ``queues`` (``{(topic, queue id): next offset}``)
        to this request's stream until it is ended; answers why it ended."""
        stream = _stream_of("SUBSCRIBE")
        if not isinstance(group, str) or not group:
            raise InvalidMessageError("SUBSCRIBE needs a consumer group")
        if not isinstance(max_count, int) or not 0 < max_count <= 1024:
            raise InvalidMessageError(f"max_count must be in 1..1024, got {max_count!r:.40}")
        _credit(credit, credit_bytes)
        self._check_queues(queues)
        sub = Subscription(group, client_id, tags, max_count, credit, credit_bytes)
        self.rt.consumers.touch(group, client_id, frozenset(t for t, _ in queues))
        stream.peer.streams[stream.opaque] = sub
        on_lost = self._on_lost(sub)
        stream.peer.on_lost(on_lost)
        self.open += 1
        try:
            self._add(sub, queues)
            # its first answer names it: CREDIT, SUBSCRIPTION_UPDATE, UNSUBSCRIBE use it
            if await stream.send({"s": stream.opaque}, []):
                await self._serve(sub, stream)
        finally:
            self.open -= 1
            stream.peer.forget(on_lost)
            stream.peer.streams.pop(stream.opaque, None)
            for key, wake in sub.wakers.items():
                self.rt.holds.unlisten(key, wake)
        return sub.ended or "closing"

    async def subscription_credit(
        self, subscription: int, credit: int = 0, credit_bytes: int = 0
    ) -> None:
        """Adds to what the subscription may still write; wakes it."""
        _credit(credit, credit_bytes)
        sub = self._find(subscription, "CREDIT")
        sub.credit += credit
        sub.credit_bytes += credit_bytes
        if sub.has_credit:
            sub.wake()

    async def update_subscription(
        self,
        subscription: int,
        add: dict[tuple[str, int], int] | None = None,
        drop: list[Any] | None = None,
    ) -> None:
        """Adds queues from their offset (a queue it has: moved there) and drops others."""
        sub = self._find(subscription, "SUBSCRIPTION_UPDATE")
        add = add or {}
        self._check_queues(add)
        gone = []
        for item in drop or ():
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise InvalidMessageError(f"a dropped queue is [topic, queue id]: {item!r:.80}")
            gone.append((item[0], item[1]))
        for key in gone:
            if sub.offsets.pop(key, None) is not None:
                self._leave(sub, key)
        self._add(sub, add)
        if add:
            self.rt.consumers.touch(sub.group, sub.client_id, frozenset(t for t, _ in add))
        sub.wake()

    async def unsubscribe(self, subscription: int) -> None:
        self._find(subscription, "UNSUBSCRIBE").end("unsubscribed")

    # ------------------------------------------------------------ the stream
    async def _serve(self, sub: Subscription, stream: ServerStream) -> None:
        while not sub.ended and not self.rt.closing:
            sub.event.clear()  # before the reads: a dispatch after them is not missed
            if sub.news and sub.has_credit and sub.offsets:  # no news: nothing to read
                keys, starts, answers, pending = self._read(sub)
                if keys:
                    if not await stream.send({"k": keys, "p": starts}, _parts(answers)):
                        sub.end("lost")
                        break
                    continue  # more may be there (a read is at most max_count)
                if pending:  # DLedger: written here, not held by a majority yet
                    await self.role.wait_readable(_READABLE_WAIT_S)
                    continue
            await sub.event.wait()

    def _read(
        self, sub: Subscription
    ) -> tuple[list[list[Any]], list[int], list[RawGetResult], bool]:
        """The queues with news, the offsets they were read from, their answers, and
        whether some have records that may not be read yet; takes them off the credit
        and moves the offsets. Only the queues with news are read; a queue stays among
        them while it may have more than was read (the credit or ``max_count`` ran out,
        records a majority does not hold yet)."""
        get, readable, store = self.rt.store.get_raw, self.role.readable, self.rt.store
        keys: list[list[Any]] = []
        starts: list[int] = []
        answers: list[RawGetResult] = []
        pending_any = False
        news, offsets = sub.news, sub.offsets
        for key in list(news):
            if not sub.has_credit:
                break
            offset = offsets.get(key)
            if offset is None:  # dropped since
                del news[key]
                continue
            topic, qid = key
            end = store.max_offset(topic, qid)
            if end == offset:  # nothing new (past it: refused)
                del news[key]
                continue
            # a perm or queue count changed since: SUBSCRIBE's answer is the refusal
            self.rt.topics.for_read(topic, qid)
            count = min(sub.max_count, sub.credit)
            got = get(sub.group, topic, qid, offset, count, sub.tags, view=True)
            raw, pending = readable(got, offset)
            pending_any = pending_any or pending
            status = raw.status
            if pending and not raw.count:  # looked at again once a majority holds them
                continue
            if status in _NOTHING_NEW:
                del news[key]
                continue
            if raw.count or status is GetStatus.NO_MATCHED_MESSAGE:
                if raw.next_offset == offset and not raw.count:
                    del news[key]
                    continue
                offsets[key] = raw.next_offset
                if raw.next_offset >= end and not pending:
                    del news[key]
            else:  # refused: the consumer says where this queue goes on
                del offsets[key]
                self._leave(sub, key)
            sub.credit -= raw.count
            sub.credit_bytes -= len(raw.data)
            keys.append([topic, qid])
            starts.append(offset)
            answers.append(raw)
            if raw.count:
                self._count(sub.group, topic, raw)
        return keys, starts, answers, pending_any

    def _count(self, group: str, topic: str, raw: RawGetResult) -> None:
        self.rt.stats["get_msgs"] += raw.count
        gets = self.rt.group_gets
        gets[group] = gets.get(group, 0) + raw.count
        if self.metrics is not None:
            self.metrics.on_get(topic, raw.count, len(raw.data))

    # ------------------------------------------------------------ helpers
    def _check_queues(self, queues: dict[tuple[str, int], int]) -> None:
        if not isinstance(queues, dict):
            raise InvalidMessageError(f"queues must be a map, got {queues!r:.80}")
        for (topic, qid), offset in queues.items():
            validate_topic(topic)
            validate_queue_id(qid)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise InvalidMessageError(f"{topic}/{qid}: offset {offset!r:.40} is not >= 0")
            self.rt.topics.for_read(topic, qid)

    def _add(self, sub: Subscription, queues: dict[tuple[str, int], int]) -> None:
        for key, offset in queues.items():
            if key not in sub.offsets:
                self.rt.holds.listen(key, sub.waker(key))
            sub.offsets[key] = offset
            sub.news[key] = None  # read once from there: it may have records already

    def _leave(self, sub: Subscription, key: tuple[str, int]) -> None:
        wake = sub.wakers.pop(key, None)
        if wake is not None:
            self.rt.holds.unlisten(key, wake)
        sub.news.pop(key, None)

    def _on_lost(self, sub: Subscription) -> Any:
        def lost() -> None:
            sub.end("lost")

        return lost

    def _find(self, subscription: int, what: str) -> Subscription:
        stream = _stream_of(what)
        sub = stream.peer.streams.get(subscription)
        if not isinstance(sub, Subscription):
            raise InvalidMessageError(
                f"{what}: no subscription {subscription!r:.40} on this connection"
            )
        return sub


def _stream_of(what: str) -> ServerStream:
    stream = current_stream()
    if stream is None:
        raise InvalidMessageError(f"{what} is served on a broker's socket only, not through Ray")
    return stream


def _parts(answers: list[RawGetResult]) -> list[Any]:
    wire = pulls_to_wire(answers)
    return wire if isinstance(wire, list) else [wire]


__all__ = ["Peer", "SubscribeProcessor", "Subscription"]
