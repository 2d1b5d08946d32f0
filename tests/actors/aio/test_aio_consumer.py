"""AsyncConsumer against a real broker: ``async for`` commits what its body finished
(every ``commit_interval_s`` while it runs, and at close), a cancelled loop commits
nothing it did not finish (its message comes again), and a ``nack``-ed message comes
back from the group's retry topic."""

from __future__ import annotations

import asyncio

import pytest

import actors
from actors.aio import AsyncConsumer, AsyncProducer
from storage import Message
from storage.errors import InvalidMessageError


def committed(cluster: actors.Cluster, group: str, topic: str) -> int:
    consumer = cluster.pull_consumer(group)
    try:
        return sum(max(0, o) for o in consumer.fetch_offsets(topic).values())
    finally:
        consumer.close()


def test_async_for_commits_what_the_body_finished(aio_cluster: actors.Cluster) -> None:
    cluster = aio_cluster
    topic, group = "AioConsume", "aio-consume"
    cluster.admin.create_topic(topic, 2, 2)

    async def main() -> list[bytes]:
        got: list[bytes] = []
        async with AsyncConsumer(
            group, topic, namespace=cluster.namespace, consume_from="first"
        ) as consumer:
            async with AsyncProducer("aio-consume-p", namespace=cluster.namespace) as producer:
                await producer.send_batch([Message(topic, b"m%d" % i) for i in range(40)])
            async for message in consumer:
                got.append(message.body)
                if len(got) == 40:
                    break
        return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(got) == sorted(b"m%d" % i for i in range(40))
    # the 40th message's body did not finish through the loop (break): 39 are committed
    assert committed(cluster, group, topic) == 39


def test_finished_bodies_are_committed_every_interval_while_the_loop_runs(
    aio_cluster: actors.Cluster,
) -> None:
    cluster = aio_cluster
    topic, group = "AioInterval", "aio-interval"
    cluster.admin.create_topic(topic, 1, 1)
    with pytest.raises(InvalidMessageError, match="commit_interval_s"):
        AsyncConsumer(group, topic, namespace=cluster.namespace, commit_interval_s=-1)
    with cluster.producer("aio-interval-p") as producer:
        producer.send_batch([Message(topic, b"i%d" % i) for i in range(10)])

    async def main() -> int:
        async with AsyncConsumer(
            group, topic, namespace=cluster.namespace, consume_from="first", commit_interval_s=0.2
        ) as consumer:
            async for message in consumer:
                if message.queue_offset == 9:
                    break  # the 10th body did not finish
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while (seen := await asyncio.to_thread(committed, cluster, group, topic)) < 9:
                assert loop.time() < deadline, f"committed {seen} of 9 while open"
                await asyncio.sleep(0.05)
            return seen

    assert asyncio.run(asyncio.wait_for(main(), 60)) == 9  # before close, without an ack
    assert committed(cluster, group, topic) == 9


def test_cancelled_loop_commits_nothing_it_did_not_finish(aio_cluster: actors.Cluster) -> None:
    cluster = aio_cluster
    topic, group = "AioCancel", "aio-cancel"
    cluster.admin.create_topic(topic, 1, 1)
    with cluster.producer("aio-cancel-p") as producer:  # one batch: one queue, in order
        producer.send_batch([Message(topic, b"c%d" % i) for i in range(10)])

    async def first() -> list[bytes]:
        finished: list[bytes] = []
        in_body = asyncio.Event()
        consumer = AsyncConsumer(group, topic, namespace=cluster.namespace, consume_from="first")

        async def loop() -> None:
            async for message in consumer:
                if message.body == b"c5":
                    in_body.set()
                    await asyncio.Event().wait()  # held here until cancelled
                finished.append(message.body)
                await asyncio.sleep(0)  # an await point inside the body

        task = asyncio.create_task(loop())
        await in_body.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await consumer.close()
        return finished

    assert asyncio.run(asyncio.wait_for(first(), 60)) == [b"c%d" % i for i in range(5)]
    assert committed(cluster, group, topic) == 5  # c5's loop was cancelled: not committed

    async def second() -> list[bytes]:
        got: list[bytes] = []
        async with AsyncConsumer(group, topic, namespace=cluster.namespace) as consumer:
            async for message in consumer:
                got.append(message.body)
                await message.ack()
                if len(got) == 5:
                    break
        return got

    assert asyncio.run(asyncio.wait_for(second(), 60)) == [
        b"c%d" % i for i in range(5, 10)
    ]  # nothing lost
    assert committed(cluster, group, topic) == 10


def test_nack_comes_back_from_the_retry_topic(aio_cluster: actors.Cluster) -> None:
    cluster = aio_cluster
    topic, group = "AioNack", "aio-nack"
    cluster.admin.create_topic(topic, 1, 1)

    async def main() -> list[tuple[bytes, int]]:
        seen: list[tuple[bytes, int]] = []
        async with AsyncConsumer(
            group,
            topic,
            namespace=cluster.namespace,
            consume_from="first",
            rebalance_interval_s=0.5,
        ) as consumer:
            async with AsyncProducer("aio-nack-p", namespace=cluster.namespace) as producer:
                await producer.send(Message(topic, b"again"))
            async for message in consumer:
                seen.append((message.body, message.reconsume_times))
                if len(seen) == 1:
                    await message.nack()
                else:
                    break
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 60))
    assert seen == [(b"again", 0), (b"again", 1)]


@pytest.mark.parametrize("coordinated", [True, False], ids=["coordinated", "uncoordinated"])
def test_a_loop_cancelled_at_any_await_commits_what_it_acked_and_nothing_else(
    aio_cluster: actors.Cluster, coordinated: bool
) -> None:
    """Loops acknowledging each message, cancelled before their first message or a few
    turns of the event loop after their 1st or 3rd ack (inside ``await message.ack()``
    with its commit out, or between): the loop ends, the group's committed offset is
    exactly past the messages whose ack was called, and the next member of the group
    (joining the coordinator, or not) starts there."""
    cluster, topic = aio_cluster, f"AioCancelAck{coordinated}"
    cluster.admin.create_topic(topic, 1, 1)
    with cluster.producer("aio-cancel-ack-p") as producer:  # one batch: one queue, in order
        result = producer.send_batch([Message(topic, b"a%d" % i) for i in range(200)])
    queue = result[0].message_queue
    options = {"namespace": cluster.namespace, "consume_from": "first", "coordinated": coordinated}

    async def run(group: str, acks: int, turns: int) -> tuple[list[int], int | None]:
        acked: list[int] = []
        async with AsyncConsumer(group, topic, **options) as consumer:  # type: ignore[arg-type]
            while queue not in consumer._queues or not consumer._queues[queue].buffer:
                await asyncio.sleep(0.01)  # pulled: the loop starts at once

            async def loop() -> None:
                async for message in consumer:
                    acked.append(message.queue_offset)  # ack() marks it done at once
                    await message.ack()

            task = asyncio.ensure_future(loop())
            while len(acked) < acks:
                await asyncio.sleep(0.001)
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()  # the loop ended there, and took nothing more
        async with AsyncConsumer(group, topic, **options) as after:  # type: ignore[arg-type]
            nxt = await after.receive(10)
            return acked, None if nxt is None else nxt.queue_offset

    lengths = []
    for acks, turns in ((0, 0), (1, 2), (3, 0), (3, 5)):
        group = f"aio-cancel-ack-{coordinated}-{acks}-{turns}"
        acked, nxt = asyncio.run(asyncio.wait_for(run(group, acks, turns), 30))
        lengths.append(len(acked))
        assert acked == list(range(len(acked)))  # in order, each once
        assert committed(cluster, group, topic) == len(acked)
        assert nxt == len(acked)  # the first message not acked comes next
    assert lengths[0] == 0 and lengths[2] >= 3, lengths
