"""AsyncProducer against a real broker over real sockets: what it sends is stored once,
in order per sharding key, and a cancelled send is either not sent or stored once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import actors
from actors.aio import AsyncProducer
from actors.client.send_result import SendStatus
from storage import Message
from storage.errors import InvalidMessageError


def test_send_single_batch_and_sharding_key(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    cluster, topic = aio_cluster, "AioSend"
    cluster.admin.create_topic(topic, 4, 4)

    async def main() -> None:
        async with AsyncProducer("aio-send", namespace=cluster.namespace) as producer:
            one = await producer.send(Message(topic, b"one"))
            assert one.status is SendStatus.SEND_OK and one.queue_offset >= 0
            many = await asyncio.gather(
                *(producer.send(Message(topic, b"s%d" % i)) for i in range(200))
            )
            assert all(r.status is SendStatus.SEND_OK for r in many)
            batch = await producer.send_batch([Message(topic, b"b%d" % i) for i in range(50)])
            assert len(batch) == 50
            keyed = [
                await producer.send(Message(topic, b"k%d" % i), sharding_key="order-7")
                for i in range(10)
            ]
            assert len({r.message_queue for r in keyed}) == 1
            offsets = [r.queue_offset for r in keyed]
            assert offsets == sorted(offsets)

    asyncio.run(main())
    bodies = Counter(stored(topic))
    expected = {b"one"} | {b"s%d" % i for i in range(200)} | {b"b%d" % i for i in range(50)}
    expected |= {b"k%d" % i for i in range(10)}
    assert set(bodies) == expected and max(bodies.values()) == 1


def test_a_bad_message_fails_only_its_own_send(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    """Single messages sent in one turn of the loop leave as one batch; one of them
    refused by validation (an empty body) fails its caller alone, the others are
    stored."""
    cluster, topic = aio_cluster, "AioBadOne"
    cluster.admin.create_topic(topic, 2, 2)

    async def main() -> list[object]:
        async with AsyncProducer("aio-bad-one", namespace=cluster.namespace) as producer:
            await producer.send(Message(topic, b"warm"))  # route and producer id
            bodies = [b"a", b"", b"c", b"d"]
            return await asyncio.gather(
                *(producer.send(Message(topic, b)) for b in bodies), return_exceptions=True
            )

    results = asyncio.run(main())
    assert isinstance(results[1], InvalidMessageError)
    assert all(
        getattr(r, "status", None) is SendStatus.SEND_OK for i, r in enumerate(results) if i != 1
    )
    assert sorted(stored(topic)) == [b"a", b"c", b"d", b"warm"]
