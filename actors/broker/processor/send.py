"""Storing what producers send (RocketMQ's ``SendMessageProcessor``).

A send is one batch a client encoded in the CommitLog's record layout
(``storage.codec.EncodedBatch``), validated here before anything is stored.
Every write goes through the broker's role (``actors.broker.ha``): a slave
refuses it, a SYNC_MASTER waits for a slave, a DLedger leader for a majority.
Consumers' send-back of failed messages is a send of copies of stored
messages, so it is here too, as in RocketMQ.

Large batches from a producer on this node arrive through its shared memory ring
(``actors.protocol.shared_ring``): the call carries where the batch is, and the
batch is copied from the producer's mapping straight into the CommitLog before
the answer, so the producer may reuse the slot once answered.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from actors.broker.ha import Replication
from actors.broker.metrics import BrokerMetrics
from actors.broker.processor import send_back
from actors.broker.processor.base import DataPathProcessor
from actors.broker.runtime import BrokerRuntime
from actors.protocol.shared_ring import RingId, RingReader
from actors.protocol.wire import AckWire, SendAck, one_ack_wire
from storage.codec import SMALL_BATCH, EncodedBatch, OneSend, parse_send_one
from storage.errors import BrokerUnavailableError, OutOfOrderSequenceError, TopicNotFoundError
from storage.message import PutStatus
from storage.store import PutBatchResult


def _highest(queue_ids: np.ndarray) -> int:
    """The highest of a batch's queue ids (a list's max for the usual few)."""
    return max(queue_ids.tolist()) if len(queue_ids) <= SMALL_BATCH else int(queue_ids.max())


class SendMessageProcessor(DataPathProcessor):
    """Sends, shared-ring sends and consumer send-back for one broker."""

    def __init__(
        self, runtime: BrokerRuntime, role: Replication, metrics: BrokerMetrics | None
    ) -> None:
        super().__init__(runtime, role, metrics)
        self.rings = RingReader()

    def _check_open(self) -> None:
        if self.rt.closing:
            raise BrokerUnavailableError(f"broker {self.rt.config.actor_name} is shutting down")
        self.rt.check_writable()

    async def put(self, batch: EncodedBatch) -> PutBatchResult:
        """Every write goes through the broker's role (none while it is fenced)."""
        self.rt.check_writable()
        started = time.perf_counter()
        try:
            result = await self.role.put(batch, self._local_put)
        except OutOfOrderSequenceError:
            self.rt.stats["put_out_of_order"] += 1  # a producer's runs came out of order
            raise
        self._timed(batch, started)
        return result

    def _timed(self, batch: EncodedBatch, started: float) -> None:
        seconds = time.perf_counter() - started
        stats = self.rt.stats
        stats["put_timed"] += 1
        stats["put_micros"] += int(seconds * 1e6)
        if self.metrics is not None:
            self.metrics.on_put(batch, seconds)

    async def _local_put(self, batch: EncodedBatch) -> PutBatchResult:
        # ASYNC_FLUSH puts are a copy into the mapped file: a thread hop would cost more
        # than the put. SYNC_FLUSH puts are written here too, in the order the requests
        # came (an idempotent producer's runs arrive in sequence; a pool of threads would
        # write them in any order), and only their wait for the fsync leaves the loop.
        store = self.rt.store
        if self.rt.inline_puts:
            return store.put_encoded(batch)
        if not store.config.sync_flush:  # inline puts turned off
            return await self.rt.run(store.put_encoded, batch)
        result, end = store.put_encoded_written(batch)
        if end and not await self.rt.run(store.wait_durable, end):
            result.status = PutStatus.FLUSH_DISK_TIMEOUT
        return result

    async def send(
        self, blob: bytes | memoryview | np.ndarray, auto_create_queue_nums: int = 0
    ) -> AckWire:
        self._check_open()
        return await self._send(EncodedBatch.from_bytes(blob), auto_create_queue_nums)

    async def send_batch(self, batch: EncodedBatch, auto_create_queue_nums: int = 0) -> AckWire:
        """:meth:`send` for a batch encoded in the broker (the gRPC endpoint's sends)."""
        self._check_open()
        batch.check_structure()
        return await self._send(batch, auto_create_queue_nums)

    def ring_view(self, ring: Any, offset: Any, length: Any) -> memoryview | None:
        """The bytes of a send waiting in a producer's shared ring, or None when this
        broker cannot read that ring (``RingReader.view``, which checks the three as
        they came over the wire: malformed, they raise ``InvalidMessageError``)."""
        self._check_open()
        view = self.rings.view(ring, offset, length)
        if view is not None:
            self.rt.stats["shared_batches"] += 1
        return view

    async def send_shared(
        self, ring: RingId, offset: Any, length: Any, auto_create_queue_nums: int = 0
    ) -> AckWire | None:
        view = self.ring_view(ring, offset, length)
        if view is None:
            return None
        return await self._send(EncodedBatch.from_bytes(view), auto_create_queue_nums)

    def send_now(self, blob: bytes | memoryview) -> tuple[AckWire, bool] | None:
        """:meth:`send` of a batch to topics that exist, done at once when nothing in it
        would wait (an ASYNC_FLUSH store putting on the event loop, a role with nothing
        to wait for, no fault armed): the data path's frame reader answers it from its
        callback, without a task and a chain of coroutines per request. Returns the
        answer and whether the put woke held pulls (to be let answer first), or None:
        the general path's case. Errors raise as :meth:`send`'s do, nothing stored."""
        rt = self.rt
        if rt.faults.armed or not rt.puts_now(self.role):
            return None
        got = parse_send_one(blob)
        if got.__class__ is OneSend:
            done = self._send_one_now(got)  # type: ignore[arg-type]
            if done is not None:
                return done
            batch = EncodedBatch.from_bytes(blob)  # what the single put leaves to a batch
        else:
            batch = got  # type: ignore[assignment]
        self._check_queues(batch, 0)
        woken = rt.holds.woken
        started = time.perf_counter()
        try:
            result = rt.store.put_encoded(batch)
        except OutOfOrderSequenceError:
            rt.stats["put_out_of_order"] += 1
            raise
        self._timed(batch, started)
        return self._answer(batch, result), rt.holds.woken != woken

    def _send_one_now(self, one: OneSend) -> tuple[AckWire, bool] | None:
        """:meth:`send_now` of a single plain record, in plain values from the wire to
        the answer's bytes (``MessageStore.put_one_send``): None, nothing stored, for
        what the store leaves to the batch's put."""
        rt = self.rt
        rt.topics.for_write(one.topic, one.queue_id, 0)
        woken = rt.holds.woken
        started = time.perf_counter()
        at = rt.store.put_one_send(one)
        if at is None:
            return None
        seconds = time.perf_counter() - started
        nbytes = len(one.data)
        stats = rt.stats
        stats["put_timed"] += 1
        stats["put_micros"] += int(seconds * 1e6)
        stats["put_msgs"] += 1
        stats["put_bytes"] += nbytes
        stats["put_batches"] += 1
        stats["put_single"] += 1
        if self.metrics is not None:
            self.metrics.on_put_one(one.topic, nbytes, seconds)
        ack = one_ack_wire(rt.config.broker_name, rt.addr, at[0], at[1])
        return ack, rt.holds.woken != woken

    def _check_queues(self, batch: EncodedBatch, auto_create_queue_nums: int) -> bool:
        """Each topic's queues take the batch's queue ids (a topic made, or grown, when
        ``auto_create_queue_nums`` asks): whether a topic was created."""
        rt = self.rt
        if len(batch.topics) == 1:  # the usual batch: one topic, its highest queue
            _, created = rt.topics.for_write(
                batch.topics[0], _highest(batch.queue_ids), auto_create_queue_nums
            )
            return created
        created = False
        for i, topic in enumerate(batch.topics):
            qid = _highest(batch.queue_ids[batch.topic_idx == i])
            _, new = rt.topics.for_write(topic, qid, auto_create_queue_nums)
            created |= new
        return created

    def _answer(self, batch: EncodedBatch, result: PutBatchResult) -> AckWire:
        rt = self.rt
        stats = rt.stats
        stats["put_msgs"] += len(batch)
        stats["put_bytes"] += len(batch.data)
        stats["put_batches"] += 1
        return SendAck(
            result.status,
            rt.config.broker_name,
            rt.addr,
            result.queue_offsets,
            result.commitlog_offsets,
        ).to_wire()

    async def _send(self, batch: EncodedBatch, auto_create_queue_nums: int) -> AckWire:
        rt = self.rt
        created = self._check_queues(batch, auto_create_queue_nums)
        woken = rt.holds.woken
        result = await self.put(batch)
        if rt.faults.after_store():  # an injected hang: this answer never comes
            await asyncio.Event().wait()
        if rt.holds.woken != woken:  # let the held pulls it woke answer first
            await asyncio.sleep(0)
        if created:  # routable on every NameServer once the sender hears back
            await rt.register_all()
        return self._answer(batch, result)

    async def recall_timer(self, topic: str, uniq_key: str, deliver_ms: int) -> None:
        """Cancel a pending timer message of ``topic`` (RocketMQ 5.3's RecallMessage): its
        delete marker goes through this master's timer service, which writes it as it
        writes its own deliveries (``storage.timer``, "Recall"). ``TimerRecallError`` when
        its time has come; ``BrokerUnavailableError`` on a broker running no timer (a
        slave, or ``timer_wheel_enable`` off)."""
        self._check_open()
        if self.rt.topics.get(topic) is None:
            raise TopicNotFoundError(f"topic {topic!r} is not on {self.rt.config.broker_name}")
        timer = self.role.services.timer
        if timer is None:
            raise BrokerUnavailableError(
                f"broker {self.rt.config.actor_name} runs no timer service (not a master, "
                "or timer messages disabled)"
            )
        await self.rt.run(timer.recall, topic, uniq_key, deliver_ms)

    async def consumer_send_msg_back(
        self,
        group: str,
        commitlog_offsets: list[int],
        max_reconsume_times: int,
        reconsume_times: list[int] | None = None,
    ) -> list[str]:
        return await send_back.consumer_send_msg_back(
            self.rt, self.put, group, commitlog_offsets, max_reconsume_times, reconsume_times
        )

    async def create_retry_topic(self, group: str) -> bool:
        return await send_back.create_retry_topic(self.rt, group)

    def status(self) -> dict[str, Any]:
        return {"shared_rings": len(self.rings)}  # producers' rings this broker has mapped
