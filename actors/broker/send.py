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

from actors.broker import send_back
from actors.broker.ha import Replication
from actors.broker.metrics import BrokerMetrics
from actors.broker.runtime import BrokerRuntime
from actors.protocol.shared_ring import RingId, RingReader
from actors.protocol.wire import AckWire, SendAck
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError, TopicNotFoundError
from storage.store import PutBatchResult


class SendMessageProcessor:
    """Sends, shared-ring sends and consumer send-back for one broker."""

    def __init__(
        self, runtime: BrokerRuntime, role: Replication, metrics: BrokerMetrics | None
    ) -> None:
        self.rt = runtime
        self.role = role
        self.metrics = metrics
        self.rings = RingReader()
        self._inline_puts = runtime.config.inline_async_puts and not runtime.store.config.sync_flush

    def _check_open(self) -> None:
        if self.rt.closing:
            raise BrokerUnavailableError(f"broker {self.rt.config.actor_name} is shutting down")

    async def put(self, batch: EncodedBatch) -> PutBatchResult:
        """Every write goes through the broker's role."""
        started = time.perf_counter()
        result = await self.role.put(batch, self._local_put)
        seconds = time.perf_counter() - started
        stats = self.rt.stats
        stats["put_timed"] += 1
        stats["put_micros"] += int(seconds * 1e6)
        if self.metrics is not None:
            self.metrics.on_put(batch, seconds)
        return result

    async def _local_put(self, batch: EncodedBatch) -> PutBatchResult:
        # ASYNC_FLUSH puts are a copy into the mapped file: a thread hop would cost more
        # than the put. SYNC_FLUSH puts wait for fsync, so they leave the event loop.
        if self._inline_puts:
            return self.rt.store.put_encoded(batch)
        return await self.rt.run(self.rt.store.put_encoded, batch)

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

    async def send_shared(
        self, ring: RingId, offset: int, length: int, auto_create_queue_nums: int = 0
    ) -> AckWire | None:
        self._check_open()
        view = self.rings.view(ring, offset, length)
        if view is None:
            return None
        ack = await self._send(EncodedBatch.from_bytes(view), auto_create_queue_nums)
        self.rt.stats["shared_batches"] += 1
        return ack

    async def _send(self, batch: EncodedBatch, auto_create_queue_nums: int) -> AckWire:
        rt = self.rt
        max_qid = {}
        for i, topic in enumerate(batch.topics):
            ids = (
                batch.queue_ids if len(batch.topics) == 1 else batch.queue_ids[batch.topic_idx == i]
            )
            max_qid[topic] = int(ids.max())
        created = False
        for topic, qid in max_qid.items():
            _, new = rt.topics.for_write(topic, qid, auto_create_queue_nums)
            created |= new
        woken = rt.holds.woken
        result = await self.put(batch)
        if rt.faults.after_store():  # an injected hang: this answer never comes
            await asyncio.Event().wait()
        if rt.holds.woken != woken:  # let the held pulls it woke answer first
            await asyncio.sleep(0)
        if created:  # routable on every NameServer once the sender hears back
            await rt.register_all()
        rt.stats["put_msgs"] += len(batch)
        rt.stats["put_bytes"] += len(batch.data)
        rt.stats["put_batches"] += 1
        return SendAck(
            result.status,
            rt.config.broker_name,
            rt.addr,
            result.queue_offsets,
            result.commitlog_offsets,
        ).to_wire()

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
