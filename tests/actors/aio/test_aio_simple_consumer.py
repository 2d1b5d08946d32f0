"""AsyncSimpleConsumer against a real broker: received messages stay invisible until
acked, an unacked one comes back after its invisible time, a changed invisible time
gives a new receipt handle and the old one is refused."""

from __future__ import annotations

import asyncio

import pytest

import actors
from actors.aio import AsyncProducer, AsyncSimpleConsumer
from storage import Message
from storage.errors import InvalidReceiptHandleError


def test_receive_ack_and_change_invisible_duration(aio_cluster: actors.Cluster) -> None:
    cluster, topic, group = aio_cluster, "AioPop", "aio-pop"
    cluster.admin.create_topic(topic, 2, 2)

    async def main() -> None:
        async with AsyncProducer("aio-pop-p", namespace=cluster.namespace) as producer:
            await producer.send_batch([Message(topic, b"p%d" % i) for i in range(6)])
        async with AsyncSimpleConsumer(
            group, topic, namespace=cluster.namespace, wait_s=2.0
        ) as consumer:
            got = []
            while len(got) < 6:
                got.extend(await consumer.receive(16, invisible_s=1.0))
            assert sorted(m.body for m in got) == [b"p%d" % i for i in range(6)]
            kept = got[0]
            old = kept.receipt_handle
            await consumer.change_invisible_duration(kept, 30.0)
            assert kept.receipt_handle != old
            for m in got[1:5]:
                await consumer.ack(m)
            with pytest.raises(InvalidReceiptHandleError):
                await consumer._on_broker(old, "ack_message", old)
            # p of got[5] was neither acked nor kept: back after its second of invisibility
            again = []
            while not again:
                again = await consumer.receive(16, invisible_s=10.0, wait_s=3.0)
            assert [m.body for m in again] == [got[5].body]
            await consumer.ack(again[0])
            await consumer.ack(kept)

    asyncio.run(asyncio.wait_for(main(), 60))
