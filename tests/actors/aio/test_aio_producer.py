"""AsyncProducer against a real broker over real sockets: what it sends is stored once,
in order per sharding key, and a cancelled send is either not sent or stored once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray
from raymq_testkit import drain

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


def test_a_lone_send_whose_broker_crashed_after_storing_is_stored_once(make_cluster: Any) -> None:
    """A single send with nothing else in flight is written in its caller's step; its
    broker stores it and dies before answering (``crash_after_store``). Ray restarts
    the broker, which recovers the producer's sequences from its CommitLog: the send,
    retried as the same numbered run, is answered with the stored copy, and the sends
    after it go on. Each message is stored once."""
    cluster = make_cluster(nameservers=1, brokers=1, topics=[actors.TopicConfig("AioCrash", 2, 2)])
    broker = cluster.broker("broker-a")

    async def main() -> tuple[Any, list[Any]]:
        async with AsyncProducer(
            "aio-crash", namespace=cluster.namespace, delivery_timeout_s=90.0
        ) as producer:
            await producer.send(Message("AioCrash", b"warm-up"))  # route, id, connection
            await asyncio.to_thread(ray.get, broker.inject_fault.remote("crash_after_store", 1))
            crashed = await producer.send(Message("AioCrash", b"crashed"))
            after = [await producer.send(Message("AioCrash", b"a%d" % i)) for i in range(5)]
            return crashed, after

    crashed, after = asyncio.run(main())
    assert crashed.status is SendStatus.SEND_OK and crashed.queue_offset >= 0
    assert cluster.admin.query_by_id(crashed.offset_msg_id).body == b"crashed"
    assert all(r.status is SendStatus.SEND_OK for r in after)
    consumer = cluster.pull_consumer("aio-crash-check")
    got = Counter(m.body for ms in drain(consumer, "AioCrash").values() for m in ms)
    consumer.close()
    assert got == Counter([b"warm-up", b"crashed", *(b"a%d" % i for i in range(5))])
