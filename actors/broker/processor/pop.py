"""POP consumption on the broker (RocketMQ 5's ``PopMessageProcessor``,
``AckMessageProcessor``, ``ChangeInvisibleTimeProcessor``, ``PopLongPollingService`` and
``PopReviveService``): receive from any queue of a topic with an invisible time, ack or
change the invisible time by receipt handle. The state and its durability are the
store's (``storage.pop``); here are the checks of a caller's arguments, the long
polling, the revive timer and the dead letters' write.

* **Receive** (:meth:`PopProcessor.pop`): the queues of the topic this broker holds,
  round robin; with nothing to hand out the call waits up to ``wait_ms`` and is woken by
  a message dispatched to one of them (the store's dispatch listener, as held pulls
  are), by a message whose invisible time lapsed, or by an ack that unblocks a FIFO
  queue.
* **Revive**: every ``pop_revive_interval_s`` the broker asks the state for what lapsed
  when the earliest deadline has passed (no thread hop otherwise); lapsed messages come
  back to the next receive with ``reconsume_times`` + 1, and after
  ``pop_max_reconsume_times`` they go to ``%DLQ%<group>`` as the send-back path's copies
  do (``actors.broker.processor.send_back.send_back_copy``), written through the broker's role.
* The consumer offset of each queue is the state's floor (the acked prefix), committed
  through the consumer offset manager, so lag and the console count what is not acked.
* Only a master serves POP: a slave's state would diverge from its master's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from actors.broker.ha import Replication
from actors.broker.longpolling.pull_hold_service import PullRequestHoldService
from actors.broker.processor.send_back import DLQ_PERM, DLQ_QUEUE_NUMS, send_back_copy
from actors.broker.runtime import BrokerRuntime
from actors.protocol.checks import check_int, check_str, validate_group
from actors.protocol.pop import (
    MAX_INVISIBLE_MS,
    MAX_POP_MSGS,
    MIN_INVISIBLE_MS,
    PoppedMessage,
    pops_heads,
)
from actors.protocol.topic import TopicConfig
from storage.codec import EncodedBatch, validate_topic
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PermissionDeniedError,
    RayMQError,
    TopicNotFoundError,
)
from storage.message import Message, MessageExt
from storage.pop import Popped, PopStore, ReceiptHandle
from storage.store import PutBatchResult
from storage.subscription import parse_subscription

log = logging.getLogger("raymq.actors.broker.processor.pop")

__all__ = ["PopProcessor", "PoppedMessage"]


class PopProcessor:
    """POP receive, ack and change of invisible time for one broker."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = rt = runtime
        self.role = role
        levels = len(rt.store.config.delay_levels_ms)

        def dead_letter(
            m: MessageExt, group: str, max_times: int
        ) -> tuple[Message, tuple[int, str, int]]:
            copy, born, _ = send_back_copy(m, group, max_times, levels)
            return copy, born

        self.state = PopStore(
            rt.store,
            rt.config.broker_name,
            put=self._put_from_thread,
            initial_offset=self._initial_offset,
            on_commit=self._commit,
            dead_letter=dead_letter,
            max_reconsume_times=rt.config.pop_max_reconsume_times,
        )
        # RocketMQ 5 decides FIFO per consumer group (its subscription group's
        # consumeMessageOrderly): kept in config/subscriptionGroup.json, as RocketMQ does
        self._groups_file = rt.store.config_file("subscriptionGroup")
        self.fifo_groups: frozenset[str] = _load_fifo_groups(self._groups_file.load())
        rt.subscription_groups_changed = self._groups_copied  # a slave's copy of its master's
        self._groups_lock = asyncio.Lock()  # one change of the file at a time
        self.holds = PullRequestHoldService(rt.loop)  # receives waiting for a message
        rt.store.add_dispatch_listener(self.holds.on_dispatch)
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = self.rt.loop.create_task(self._revive_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.holds.wake_all()
        await self.rt.run(self.state.close)

    # ------------------------------------------------------------ the state's hooks
    def _initial_offset(self, group: str, topic: str, queue_id: int) -> int:
        """A group's first receive from a queue: from its committed offset, or from the
        queue's first message (a new SimpleConsumer group sees what is stored)."""
        committed = self.rt.offsets.query(group, topic, queue_id)
        return committed if committed >= 0 else self.rt.store.min_offset(topic, queue_id)

    def _commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.rt.offsets.commit(group, topic, queue_id, offset)

    def _put_from_thread(self, batch: EncodedBatch) -> object:
        """The dead letters' write, called by the state on an I/O thread: done on the
        event loop through the role (no I/O thread is needed meanwhile)."""
        fut = asyncio.run_coroutine_threadsafe(self._write(batch), self.rt.loop)
        return fut.result(timeout=60)

    async def _write(self, batch: EncodedBatch) -> PutBatchResult:
        rt = self.rt
        for topic in batch.topics:  # the DLQ, write-only, as the send-back path makes it
            if rt.topics.get(topic) is None:
                rt.topics.put(TopicConfig(topic, DLQ_QUEUE_NUMS, DLQ_QUEUE_NUMS, DLQ_PERM))
                rt.request_registration()
                log.info("created %s on %s for POP dead letters", topic, rt.config.broker_name)
        internal = getattr(self.role, "put_internal", None)  # DLedger: through the Raft log
        if internal is not None:
            result: PutBatchResult = await internal(batch)
            return result
        return await self.role.put(batch, self._local_put)

    async def _local_put(self, batch: EncodedBatch) -> PutBatchResult:
        return self.rt.store._put_encoded(batch)  # on the loop: the caller holds an I/O thread

    async def _revive_loop(self) -> None:
        rt = self.rt
        interval = rt.config.pop_revive_interval_s
        while not rt.closing:
            await asyncio.sleep(interval)
            due = self.state.next_due_ms()
            if due is None or due > rt.store.now_ms():
                continue
            try:
                woken = await rt.run(self.state.revive)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("POP revive failed")
                continue
            for _, topic, qid in woken:
                self.holds.on_dispatch(topic, qid, 0)

    # ------------------------------------------------------------ checks
    def _check_master(self) -> None:
        if not self.role.is_master:
            raise BrokerUnavailableError(
                f"broker {self.rt.config.actor_name} is not its group's master: POP is served "
                "by the master"
            )

    def _queues(self, topic: str) -> list[int]:
        tc = self.rt.topics.get(topic)
        if tc is None:
            raise TopicNotFoundError(
                f"topic={topic!r} does not exist on broker {self.rt.config.broker_name}"
            )
        if not tc.readable:
            raise PermissionDeniedError(
                f"topic={topic!r} on broker {self.rt.config.broker_name} has perm={tc.perm}: "
                "reading is forbidden"
            )
        return list(range(tc.read_queue_nums))

    # ------------------------------------------------------------ FIFO groups
    def group_fifo(self, group: str) -> bool:
        """Whether ``group`` consumes in order (every receive of it is a FIFO one)."""
        return group in self.fifo_groups

    async def set_group_fifo(self, group: str, fifo: bool) -> None:
        """Make ``group`` a FIFO group (RocketMQ's ``consumeMessageOrderly``) or not: from
        now on each of its receives takes nothing from a queue with a message in flight,
        whatever the consumer asks; kept across restarts."""
        validate_group(group)
        if not isinstance(fifo, bool):
            raise InvalidMessageError(f"fifo={fifo!r}: must be a bool")
        async with self._groups_lock:
            groups = self.fifo_groups | {group} if fifo else self.fifo_groups - {group}
            if groups == self.fifo_groups:
                return
            table = {g: {"groupName": g, "consumeMessageOrderly": True} for g in sorted(groups)}
            file = self._groups_file

            def write() -> None:  # the rest of RocketMQ's file, if any, is kept
                file.save({**file.load(), "subscriptionGroupTable": table})

            await self.rt.run(write)  # written before it takes effect
            self.fifo_groups = groups
        log.info("group %s consumes %s", group, "in order (FIFO)" if fifo else "concurrently")

    def _groups_copied(self, data: dict[str, Any]) -> None:
        """A slave saved its master's ``subscriptionGroup.json``: its FIFO groups are
        this broker's from now on (and when it is promoted)."""
        self.fifo_groups = _load_fifo_groups(data)

    # ------------------------------------------------------------ receive
    async def pop(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        wait_ms: int = 0,
        *,
        fifo: bool = False,
        tag_expr: str = "*",
        client_id: str = "",
    ) -> list[PoppedMessage]:
        """Up to ``max_msgs`` messages of ``topic`` from this broker's queues, invisible
        to the group for ``invisible_ms``; waits up to ``wait_ms`` for one."""
        got, _ = await self._pop(
            group, topic, max_msgs, invisible_ms, wait_ms, fifo, tag_expr, client_id, False
        )
        return [PoppedMessage(p.message, p.receipt_handle, p.reconsume_times) for p in got]

    async def pop_packed(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        wait_ms: int = 0,
        *,
        fifo: bool = False,
        tag_expr: str = "*",
        client_id: str = "",
    ) -> tuple[list[list[Any]], bytes]:
        """:meth:`pop` for the data path: ``[receipt handle, reconsume times]`` per
        message, and their records as stored, back to back (``actors.protocol.pop``)."""
        got, records = await self._pop(
            group, topic, max_msgs, invisible_ms, wait_ms, fifo, tag_expr, client_id, True
        )
        return pops_heads(got), records

    async def _pop(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        wait_ms: int,
        fifo: bool,
        tag_expr: str,
        client_id: str,
        packed: bool,
    ) -> tuple[list[Popped], bytes]:
        validate_group(group)
        validate_topic(topic)
        check_int("max_msgs", max_msgs, 1, MAX_POP_MSGS)
        check_int("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        check_int("wait_ms", wait_ms, 0)
        if not isinstance(fifo, bool):
            raise InvalidMessageError(f"fifo={fifo!r}: must be a bool")
        check_str("tag_expr", tag_expr)
        check_str("client_id", client_id, empty=True)
        fifo = fifo or group in self.fifo_groups
        tags = None if tag_expr.strip() in ("", "*") else tag_expr
        parse_subscription(tags)
        self._check_master()
        qids = self._queues(topic)
        rt = self.rt
        if client_id:
            rt.consumers.touch(group, client_id, frozenset((topic,)))
        state = self.state

        def take() -> tuple[list[Popped], bytes]:
            got = state.pop(group, topic, qids, max_msgs, invisible_ms, fifo=fifo, tags=tags)
            return state.raw_records(got) if packed and got else (got, b"")

        keys = [(topic, q) for q in qids]
        wait_s = min(wait_ms / 1000, rt.config.max_pull_suspend_s)
        deadline = rt.loop.time() + wait_s
        while True:
            fut = self.holds.register_many(keys)  # before the pop: no wake-up is missed
            got, records = await rt.run(take)
            remaining = deadline - rt.loop.time()
            if got or remaining <= 0 or rt.closing or not rt.config.long_polling_enable:
                self.holds.discard_many(keys, fut)
                break
            due = state.next_due_ms()
            if due is not None:  # a lapse comes back by then, woken or not
                remaining = min(remaining, max(0.0, (due - rt.store.now_ms()) / 1000) + 0.01)
            await self.holds.wait_many(keys, fut, remaining)
        stats = rt.stats
        stats["pop_msgs"] = stats.get("pop_msgs", 0) + len(got)
        if got:
            rt.group_gets[group] = rt.group_gets.get(group, 0) + len(got)
        return got, records

    # ------------------------------------------------------------ ack, change
    def _check_handle_call(self, group: str, topic: str) -> None:
        validate_group(group)
        validate_topic(topic)
        self._check_master()

    async def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """Done with the message ``receipt_handle`` names (acking it again changes nothing)."""
        self._check_handle_call(group, topic)
        await self.rt.run(self.state.ack, group, topic, receipt_handle)
        self._woke(receipt_handle, topic)

    async def ack_many(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[str | None]:
        """:meth:`ack` of several handles in one call: per handle None, or why it was
        refused (the others are acked all the same)."""
        answers = await self.ack_each(group, topic, receipt_handles)
        return [None if a is None else f"{type(a).__name__}: {a}" for a in answers]

    async def ack_each(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[RayMQError | None]:
        """:meth:`ack_many` with each refusal as its error (the gRPC endpoint maps them to
        status codes): one store operation (``PopStore.ack_many``, one journal write)."""
        self._check_handle_call(group, topic)
        if not isinstance(receipt_handles, (list, tuple)) or len(receipt_handles) > 4096:
            raise InvalidMessageError("receipt_handles: must be a list of at most 4096 handles")
        answers = await self.rt.run(self.state.ack_many, group, topic, list(receipt_handles))
        for handle in receipt_handles:
            self._woke(handle, topic)
        return answers

    async def ack_message(self, group: str, topic: str, receipt_handle: str | list[str]) -> Any:
        """Ack by receipt handle (:meth:`ack`); a list of handles answers, per handle, None
        or why not (:meth:`ack_many`)."""
        if isinstance(receipt_handle, list):
            return await self.ack_many(group, topic, receipt_handle)
        return await self.ack(group, topic, receipt_handle)

    async def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        """Make the message invisible for ``invisible_ms`` from now; its new handle."""
        self._check_handle_call(group, topic)
        check_int("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        return await self.rt.run(
            self.state.change_invisible, group, topic, receipt_handle, invisible_ms
        )

    async def forward_to_dead_letter_queue(
        self, group: str, topic: str, receipt_handle: str
    ) -> None:
        """Give up on the message: its copy goes to ``%DLQ%<group>`` now, and it is done
        (RocketMQ 5's ``ForwardMessageToDeadLetterQueue``)."""
        self._check_handle_call(group, topic)
        await self.rt.run(self.state.forward_to_dlq, group, topic, receipt_handle)
        self._woke(receipt_handle, topic)

    def _woke(self, handle: str, topic: str) -> None:
        """An ack may unblock a FIFO queue: wake the receives waiting on it."""
        try:
            qid = ReceiptHandle.parse(handle).queue_id
        except RayMQError:
            return
        self.holds.on_dispatch(topic, qid, 0)

    def status(self) -> dict[str, Any]:
        return {
            **{f"pop_{k}": v for k, v in self.state.stats.items()},
            "fifo_groups": sorted(self.fifo_groups),
        }


def _load_fifo_groups(data: dict[str, Any]) -> frozenset[str]:
    """The FIFO groups of a ``subscriptionGroup.json`` (RocketMQ's layout: a
    ``subscriptionGroupTable`` of group configs with ``consumeMessageOrderly``)."""
    table = data.get("subscriptionGroupTable", {})
    if not isinstance(table, dict):
        log.error("subscriptionGroup.json: subscriptionGroupTable is not an object: ignored")
        return frozenset()
    return frozenset(
        g
        for g, conf in table.items()
        if isinstance(conf, dict) and conf.get("consumeMessageOrderly") is True
    )
