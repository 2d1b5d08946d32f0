"""AsyncConsumer: ``async for message in consumer`` on the caller's event loop.

Pulls go over each broker's socket on the loop (``actors.aio.connection``), held by
the broker until a message arrives (long polling); what they bring waits in a
buffer of at most ``buffer_messages`` per queue (a full buffer stops that queue's
pulls: backpressure).

Acknowledgement:

* A message is done when the body of the ``async for`` loop that received it
  finishes and the loop asks for the next one, or when ``await message.ack()`` says
  so earlier. A message the loop body failed on is handed to ``await
  message.nack()``: it is sent back to the broker, which delivers it again from the
  group's retry topic ``%RETRY%<group>`` after the push consumer's backoff, and to
  the dead-letter topic ``%DLQ%<group>`` after ``max_reconsume_times`` (the push
  consumer's rule).
* Offsets: a queue's committed offset is the first of its messages not yet done
  (messages done out of order wait for the ones before them). The offsets that moved
  are committed to their brokers together, ``commit_interval_s`` after the first of
  them moved (one commit call per broker per interval, off the message's path, as
  the synchronous push consumer persists its offsets every few seconds); ``await
  message.ack()`` commits at once and returns once it is, and closing the consumer
  or giving a queue up commits too. A consumer that dies re-delivers at most what
  was done in its last interval. A loop
  that is cancelled, or that raises, leaves the message it was in undone: it and
  everything after it is delivered again (to this consumer or another one of the
  group), nothing is committed that was not finished.
* CLUSTERING (default): the group's members share the topic's queues (and the
  group's retry topic's) by ``rebalance_strategy``. ``coordinated=True`` (the
  default, as the synchronous push consumer's): the group's coordinator actor hands
  the queues out, each with a fencing token its commits carry
  (``actors.aio.coordinated``): a queue handed over is committed first, and a
  member fenced off (taken for dead, or the group's offsets reset) can commit
  nothing more of it. ``coordinated=False``: each member computes its share over the
  members the brokers list, every ``rebalance_interval_s``; a queue given up is
  committed first.
* BROADCASTING (``broadcasting=True``): every consumer gets every message; offsets
  are kept by the consumer, in a file of its own (``offset_store_dir``, default
  ``~/.raymq_offsets``, ``<group>/<instance_name>.json``, as the synchronous push
  consumer's: one consumer at a time per file), written (fsynced) at each commit. A
  consumer started again goes on from there; one without a file starts at
  ``consume_from``.
* Orderly (``orderly=True``): a queue's next message is handed out only when the one
  before it is done, so messages of one sharding key come in order; a message
  ``nack``-ed is handed out again (after ``suspend_s``) before anything after it,
  up to ``max_reconsume_times``, then sent to the dead-letter topic. In a
  coordinated group a queue handed to another member goes once the message out of
  it is done (or after half the coordinator's revoke timeout): it is never out in
  two members at once.

Heartbeats run on the process's client instance (``actors.client.instance``), as
the synchronous consumers' do.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from typing import Any

from actors.aio.connection import AsyncBrokers, master, within
from actors.aio.coordinated import CoordinatedGroup
from actors.aio.offsets import GroupOffsets
from actors.client import instance as _instance
from actors.client.pull_consumer import PullResult, PullStatus
from actors.client.push.config import valid_instance_name
from actors.client.push.offset_store import LocalFileOffsetStore
from actors.config.coordinator import CoordinatorConfig
from actors.coordinator.fencing import readable_queues
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.requests import BROKER, by_method
from actors.protocol.topic import retry_topic
from actors.protocol.wire import pull_request_to_wire, pulls_from_wire
from rebalance import MessageQueue, assign
from storage.errors import InvalidMessageError
from storage.message import MessageExt
from storage.subscription import parse_subscription

log = logging.getLogger("raymq.actors.aio.consumer")

_REQUESTS = by_method(BROKER)
_PULL = _REQUESTS["pull_packed"]
CALL_TIMEOUT_S = 10.0


class ConsumedMessage:
    """A message handed out by :class:`AsyncConsumer`: the stored message's fields
    (``body``, ``topic``, ``properties``, ``queue_offset``...) and its acknowledgement."""

    __slots__ = ("message", "queue", "_consumer", "_state", "reconsumed")

    def __init__(self, consumer: AsyncConsumer, queue: MessageQueue, message: MessageExt) -> None:
        self.message, self.queue, self._consumer = message, queue, consumer
        self._state = "handed"  # "handed", then "done"
        self.reconsumed = 0  # times an orderly consumer handed it out again

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    @property
    def done(self) -> bool:
        return self._state == "done"

    async def ack(self) -> None:
        """Done: its offset is committed (with the messages before it) before this returns."""
        self._consumer._done(self)
        await self._consumer.commit()

    async def nack(self) -> None:
        """Not done: delivered again later (see the module doc)."""
        await self._consumer._nack(self)

    def __repr__(self) -> str:
        return f"ConsumedMessage({self.queue}, offset={self.message.queue_offset})"


class _Queue:
    """One owned queue: where its pulls go on, what is buffered, what is undone."""

    def __init__(self, mq: MessageQueue, offset: int) -> None:
        self.mq = mq
        self.next_offset = offset
        self.buffer: collections.deque[ConsumedMessage] = collections.deque()
        self.undone: dict[int, ConsumedMessage] = {}  # queue offset -> message, in order
        self.committed = offset
        self.busy = False  # orderly: a message of it is out
        self.resume_at = 0.0  # orderly: a nack-ed message waits until then
        self.dropped = False
        self.revoking = False  # coordinated: being handed to another member

    def commit_offset(self) -> int:
        return next(iter(self.undone), self.next_offset)

    def handed_out(self) -> bool:
        """Whether a message of it is out in a loop's body (undone, not buffered)."""
        return len(self.undone) > len(self.buffer)


class AsyncConsumer:
    """See the module doc. ``async with AsyncConsumer(group, topic, namespace=...) as c:``."""

    def __init__(
        self,
        group: str,
        topic: str,
        *,
        tags: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        broadcasting: bool = False,
        orderly: bool = False,
        consume_from: str = "last",
        max_reconsume_times: int = 16,
        suspend_s: float = 1.0,
        pull_batch: int = 32,
        buffer_messages: int = 1024,
        long_poll_s: float = 5.0,
        rebalance_strategy: str = "averagely",
        rebalance_interval_s: float = 5.0,
        heartbeat_interval_s: float = 10.0,
        session_timeout_s: float = 30.0,
        data_tls_ca: str | None = None,
        instance_name: str = "DEFAULT",
        offset_store_dir: str | None = None,
        coordinated: bool = True,
        coordinator_config: CoordinatorConfig | None = None,
        commit_interval_s: float = 0.5,
    ) -> None:
        if not isinstance(group, str) or not group:
            raise InvalidMessageError(f"consumer group={group!r}: must be a non-empty str")
        if not isinstance(topic, str) or not topic:
            raise InvalidMessageError(f"topic={topic!r}: must be a non-empty str")
        if consume_from not in ("first", "last"):
            raise InvalidMessageError(f"consume_from={consume_from!r}: 'first' or 'last'")
        for name, value in (("pull_batch", pull_batch), ("buffer_messages", buffer_messages)):
            if not isinstance(value, int) or value <= 0:
                raise InvalidMessageError(f"{name}={value!r}: must be an int > 0")
        if (
            not isinstance(commit_interval_s, (int, float))
            or isinstance(commit_interval_s, bool)
            or not 0 <= commit_interval_s <= 60
        ):
            raise InvalidMessageError(
                f"commit_interval_s={commit_interval_s!r}: must be a number of seconds in 0..60"
            )
        if not valid_instance_name(instance_name):
            raise InvalidMessageError(
                f"instance_name={instance_name!r}: letters, digits, '_', '-' or '.'"
            )
        self.group, self.topic, self.tags = group, topic, tags
        self._subscribed = parse_subscription(tags)
        self.broadcasting, self.orderly = broadcasting, orderly
        self.consume_from = consume_from
        self.max_reconsume_times, self.suspend_s = max_reconsume_times, suspend_s
        self.pull_batch, self.buffer_messages = pull_batch, buffer_messages
        self.long_poll_s = long_poll_s
        self.commit_interval_s = float(commit_interval_s)
        self.strategy = rebalance_strategy
        self.rebalance_interval_s = rebalance_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.session_timeout_s = session_timeout_s
        self.namespace = namespace
        self._lease = _instance.share(
            self, namespace, nameservers, tls_ca=data_tls_ca, kind=_instance.READ
        )
        self.instance, self.ns = self._lease.instance, self._lease.view
        self.client_id = self.instance.new_client_id(group)
        # broadcasting: the consumer's own offsets, in its file (taken last: nothing
        # above can fail and leave the file locked)
        self._local = (
            LocalFileOffsetStore(offset_store_dir, group, instance_name) if broadcasting else None
        )
        self._brokers = AsyncBrokers(data_tls_ca)
        self._group = (
            CoordinatedGroup(self, coordinator_config) if coordinated and not broadcasting else None
        )
        self.topics = [topic] if broadcasting else [topic, retry_topic(group)]
        self._queues: dict[MessageQueue, _Queue] = {}
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._fetchers: dict[tuple[str, str], asyncio.Task[Any]] = {}  # by (broker, topic)
        self._last: dict[asyncio.Task[Any] | None, ConsumedMessage] = {}  # by loop's task
        self._dirty = False
        self._commit_lock: asyncio.Lock | None = None
        self.offsets = GroupOffsets(self)
        self._started = False
        self.closed = False
        self._rr = 0

    # ------------------------------------------------------------ life
    async def start(self) -> None:
        """Join the group and take this consumer's queues (the first ``async for`` does)."""
        if self._started:
            return
        self._started = True
        self._changed = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        if not self.broadcasting:
            await asyncio.to_thread(self._heartbeat)
            self.instance.register(
                ("aio", self.client_id), self._heartbeat, self.heartbeat_interval_s
            )
        if self._group is not None:
            await self._group.join()
            self._tasks.append(asyncio.ensure_future(self._group.follow()))
        else:
            await self._rebalance()
            self._tasks.append(asyncio.ensure_future(self._rebalance_loop()))

    async def close(self) -> None:
        """Commit what is done, stop pulling and leave the group."""
        if self.closed:
            return
        self.closed = True
        for task in [*self._tasks, *self._fetchers.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._fetchers.values(), return_exceptions=True)
        if self._started and self._group is not None:
            await self._group.leave()
        elif self._started:
            await self.commit()
        self.instance.unregister(("aio", self.client_id))
        if not self.broadcasting and self._started:
            await asyncio.to_thread(self._unregister)
        self._brokers.close()
        if self._local is not None:
            self._local.close()
        self._lease.release()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ iteration
    def __aiter__(self) -> AsyncConsumer:
        """A loop starting: the message an earlier loop of this task left unfinished (it
        raised or was cancelled) is handed out again, first of its queue."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return self
        left = self._last.pop(task, None)
        if left is not None and not left.done:
            q = self._queues.get(left.queue)
            if q is not None and not q.dropped:
                q.buffer.appendleft(left)
                q.busy = False
                self._changed.set()
        return self

    async def __anext__(self) -> ConsumedMessage:
        if self.closed:
            raise StopAsyncIteration
        if not self._started:
            await self.start()
        task = asyncio.current_task()
        last = self._last.pop(task, None)
        if last is not None and not last.done:  # the loop's body finished with it
            self._done(last)
        while True:
            msg = self._next_ready()
            if msg is not None:
                self._last[task] = msg
                return msg
            self._changed.clear()
            wait = self._next_resume()
            try:
                if wait is None:
                    await self._changed.wait()
                else:
                    await within(self._changed.wait(), wait)
            except asyncio.TimeoutError:
                pass
            if self.closed:
                raise StopAsyncIteration

    async def receive(self, timeout_s: float | None = None) -> ConsumedMessage | None:
        """The next message (None after ``timeout_s``); acknowledged as ``async for``'s are."""
        try:
            return await within(self.__anext__(), timeout_s)
        except asyncio.TimeoutError:
            return None

    def _next_ready(self) -> ConsumedMessage | None:
        queues = list(self._queues.values())
        now = time.monotonic()
        for i in range(len(queues)):
            q = queues[(self._rr + i) % len(queues)]
            if not q.buffer or q.revoking or (self.orderly and (q.busy or now < q.resume_at)):
                continue
            self._rr = (self._rr + i + 1) % max(1, len(queues))
            msg = q.buffer.popleft()
            q.busy = True
            if len(q.buffer) < self.buffer_messages // 2:
                self._changed.set()  # its fetcher may pull again
            return msg
        return None

    def _next_resume(self) -> float | None:
        now = time.monotonic()
        waits = [q.resume_at - now for q in self._queues.values() if q.buffer and q.resume_at > now]
        return max(0.0, min(waits)) if waits else None

    # ------------------------------------------------------------ acknowledgement
    def _done(self, msg: ConsumedMessage) -> None:
        if msg.done:
            return
        msg._state = "done"
        q = self._queues.get(msg.queue)
        if q is None or q.dropped:
            return  # the queue went to another member: its next owner has it
        q.undone.pop(msg.queue_offset, None)
        q.busy = False
        self._changed.set()
        if not self._dirty:  # the first offset moved since the last commit
            self._dirty = True
            asyncio.get_running_loop().call_later(self.commit_interval_s, self._commit_soon)

    def _commit_soon(self) -> None:
        if self.closed or not self._dirty:  # closing commits; or an ack() committed it
            return
        task = asyncio.ensure_future(self.commit())
        task.add_done_callback(_log_failure)

    async def _nack(self, msg: ConsumedMessage) -> None:
        if msg.done:
            return
        q = self._queues.get(msg.queue)
        for task, last in list(self._last.items()):
            if last is msg:
                del self._last[task]
        if self.orderly and q is not None and msg.reconsumed < self.max_reconsume_times:
            msg.reconsumed += 1
            q.buffer.appendleft(msg)
            q.busy = False
            q.resume_at = time.monotonic() + self.suspend_s
            self._changed.set()
            return
        if self.broadcasting:
            log.warning("broadcasting consumer %s: %r dropped (no retry topic)", self.group, msg)
        else:
            times = self.max_reconsume_times if self.orderly else None
            await self._send_back(msg, times)
        self._done(msg)

    async def _send_back(self, msg: ConsumedMessage, reconsume_times: int | None) -> None:
        actor, handle = await self._master(msg.queue)
        args: list[Any] = [self.group, [msg.commitlog_offset], self.max_reconsume_times]
        if reconsume_times is not None:
            args.append([reconsume_times])
        await within(
            self._brokers.call(actor, handle, "consumer_send_msg_back", *args), CALL_TIMEOUT_S
        )

    async def commit(self) -> None:
        """Commit every queue's offset (the first message not yet done) that moved."""
        await self.offsets.commit([(q, q.commit_offset()) for q in self._queues.values()])

    # ------------------------------------------------------------ queues
    async def _rebalance_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.rebalance_interval_s)
            try:
                await self._rebalance()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("group %s: rebalance failed: %s", self.group, exc)

    async def _rebalance(self) -> None:
        mine: set[MessageQueue] = set()
        for topic in self.topics:
            queues = await asyncio.to_thread(self._readable_queues, topic)
            if not queues:
                continue
            if self.broadcasting:
                mine |= set(queues)
                continue
            cids = await self._members()
            if self.client_id not in cids:
                cids.append(self.client_id)
            mine |= set(assign(self.strategy, self.group, queues, cids).get(self.client_id, []))
        for mq in [m for m in self._queues if m not in mine]:  # given up: committed first
            await self.commit()
            q = self._queues.pop(mq)
            q.dropped = True
        for mq in sorted(mine - set(self._queues)):
            self._add_queue(mq, await self.offsets.start(mq))
        self._start_fetchers()

    def _add_queue(self, mq: MessageQueue, offset: int) -> None:
        self._queues[mq] = _Queue(mq, offset)

    def _start_fetchers(self) -> None:
        """A pulling task for each broker and topic of our queues (one not running yet):
        the retry topic's queues, empty most of the time, are held apart from the
        topic's, whose pulls a message wakes."""
        for key in {(mq.broker_name, mq.topic) for mq in self._queues}:
            task = self._fetchers.get(key)
            if task is None or task.done():
                self._fetchers[key] = asyncio.ensure_future(self._fetch(*key))
        self._changed.set()

    def _readable_queues(self, topic: str) -> list[MessageQueue]:
        route = self.ns.route(topic, refresh=True)
        return [] if route is None else readable_queues(route)

    async def _members(self) -> list[str]:
        route = await asyncio.to_thread(self.ns.require_route, self.topic)
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            if bd.master_actor_name() is None:
                continue
            try:
                _, handle = await self._master(MessageQueue(self.topic, bd.broker_name, 0))
                ids = await within(handle.consumer_list.remote(self.group), CALL_TIMEOUT_S)
                return list(ids)
            except Exception as exc:  # noqa: BLE001 - ask the next broker
                log.warning("group %s: no member list from %s: %s", self.group, bd.broker_name, exc)
        return []

    async def _master(self, mq: MessageQueue) -> tuple[str, Any]:
        return await master(self.ns, mq.topic, mq.broker_name)

    # ------------------------------------------------------------ pulling
    async def _fetch(self, broker_name: str, topic: str) -> None:
        """Pulls of this consumer's queues of ``topic`` on ``broker_name``, one held
        call at a time."""
        failures = 0
        while not self.closed:
            mine = [
                q
                for q in self._queues.values()
                if q.mq.broker_name == broker_name and q.mq.topic == topic
            ]
            wanted = [q for q in mine if len(q.buffer) < self.buffer_messages and not q.revoking]
            if not wanted:
                if not mine:
                    return
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                await self._pull(broker_name, wanted)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - pulled again after a pause
                failures += 1
                log.warning("group %s: pull from %s failed: %s", self.group, broker_name, exc)
                await asyncio.sleep(min(0.1 * 2**failures, 3.0))

    async def _pull(self, broker_name: str, wanted: list[_Queue]) -> None:
        actor, handle = await self._master(wanted[0].mq)
        blob = pull_request_to_wire(
            self.group,
            [(q.mq.topic, q.mq.queue_id, q.next_offset) for q in wanted],
            self.pull_batch,
            self.tags,
            self.long_poll_s,
            self.client_id,
        )
        conn = await self._brokers.connection(actor, handle)
        header, body, decode = _PULL.encode(blob)
        # the answer is taken in the connection's read callback: its messages go to
        # their buffers there, and a loop waiting for them runs in the next turn of the
        # event loop, not one turn later, after this task's own wake-up
        answer = conn.request(header, body, lambda h, b: self._take(wanted, decode(h, b)))
        await within(answer, self.long_poll_s + CALL_TIMEOUT_S)

    def _take(self, wanted: list[_Queue], wire: Any) -> None:
        """A pull's answer: each queue's new messages into its buffer (one that went to
        another member meanwhile is skipped), the waiting loops woken."""
        for q, raw in zip(wanted, pulls_from_wire(wire)):
            if q.dropped or self._queues.get(q.mq) is not q:
                continue
            result = PullResult(q.mq, raw, self._subscribed, True)
            if result.status is PullStatus.FOUND:
                for m in result.messages:
                    if m.queue_offset < q.next_offset:
                        continue
                    cm = ConsumedMessage(self, q.mq, m)
                    q.undone[m.queue_offset] = cm
                    q.buffer.append(cm)
            q.next_offset = max(q.next_offset, result.next_offset)
        self._changed.set()

    # ------------------------------------------------------------ membership (heartbeat thread)
    def _heartbeat(self) -> None:
        for handle in self.ns.master_brokers().values():
            _rpc_get(
                handle.heartbeat.remote(
                    self.group, self.client_id, self.topics, self.session_timeout_s
                )
            )
            _rpc_get(handle.create_retry_topic.remote(self.group))

    def _unregister(self) -> None:
        for handle in self.ns.master_brokers().values():
            try:
                _rpc_get(handle.unregister_consumer.remote(self.group, self.client_id))
            except Exception as exc:  # noqa: BLE001 - the brokers expire it anyway
                log.warning("group %s: could not leave cleanly: %s", self.group, exc)


def _rpc_get(ref: Any) -> Any:
    from actors.protocol import rpc

    return rpc.get(ref, CALL_TIMEOUT_S)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("offset commit failed (committed again with the next): %s", task.exception())
