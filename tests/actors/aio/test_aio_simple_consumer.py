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


def test_a_receive_cancelled_at_any_await_loses_nothing(aio_cluster: actors.Cluster) -> None:
    """Receives cancelled 0, 1, 2... turns of the loop after they start: a pop already
    out goes on, and what it brings is handed out by a later receive, so every message
    is received, once (invisible for longer than the test: none comes back)."""
    cluster, topic, group = aio_cluster, "AioPopCancel", "aio-pop-cancel"
    cluster.admin.create_topic(topic, 2, 2)
    bodies = [b"c%d" % i for i in range(20)]

    async def main() -> list[bytes]:
        async with AsyncProducer("aio-pop-cancel-p", namespace=cluster.namespace) as producer:
            await producer.send_batch([Message(topic, b) for b in bodies])
        got: list[bytes] = []
        async with AsyncSimpleConsumer(
            group, topic, namespace=cluster.namespace, wait_s=1.0
        ) as consumer:
            turns = 0
            while len(got) < len(bodies):
                task = asyncio.ensure_future(consumer.receive(4, invisible_s=60.0))
                for _ in range(turns % 7):
                    await asyncio.sleep(0)
                task.cancel()
                (result,) = await asyncio.gather(task, return_exceptions=True)
                if not isinstance(result, BaseException):
                    got.extend(m.body for m in result)
                turns += 1
                if turns % 7 == 6:  # now and then one not cancelled, so that pops land
                    got.extend(m.body for m in await consumer.receive(4, invisible_s=60.0))
        return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(got) == sorted(bodies)  # each once
