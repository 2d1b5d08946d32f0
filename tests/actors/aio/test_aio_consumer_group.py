"""AsyncConsumer's group membership against real brokers: a coordinated group hands
queues over with what was finished committed (nothing finished comes again), the
group's offsets reset through its coordinator fence the old owners (their queues
start again from the reset offsets), an orderly queue is never out in two members at
once, and broadcasting offsets are kept in the consumer's file across restarts."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import ray

import actors
from actors.aio import AsyncConsumer
from actors.coordinator.host import coordinator_for
from storage import Message
from storage.errors import InvalidConfigError


def committed(cluster: actors.Cluster, group: str, topic: str) -> int:
    consumer = cluster.pull_consumer(group)
    try:
        return sum(max(0, o) for o in consumer.fetch_offsets(topic).values())
    finally:
        consumer.close()


def send(cluster: actors.Cluster, topic: str, bodies: list[bytes]) -> None:
    with cluster.producer(f"{topic}-p") as producer:  # single sends: the queues in turn
        for body in bodies:
            producer.send(Message(topic, body))


async def until(check: object, what: str, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"no {what} in {timeout_s} s")
        await asyncio.sleep(0.05)


def held(consumer: AsyncConsumer, topic: str) -> int:
    return sum(mq.topic == topic for mq in consumer._queues)


def test_a_coordinated_group_hands_queues_over_and_fences_on_reset(
    aio_cluster: actors.Cluster,
) -> None:
    cluster, topic, group = aio_cluster, "AioGroup", "aio-group"
    cluster.admin.create_topic(topic, 2, 2)  # two queues on each broker
    bodies = [b"g%d" % i for i in range(40)]
    send(cluster, topic, bodies)
    ns = cluster.namespace

    async def drain(consumers: list[AsyncConsumer], finished: Counter[bytes], n: int) -> None:
        async def one(consumer: AsyncConsumer) -> None:
            while sum(finished.values()) < n:
                message = await consumer.receive(0.2)
                if message is not None:
                    finished[message.body] += 1
                    await message.ack()

        await asyncio.gather(*(one(c) for c in consumers))

    async def main() -> tuple[Counter[bytes], Counter[bytes], int]:
        options = {"namespace": ns, "consume_from": "first", "heartbeat_interval_s": 1.0}
        first: Counter[bytes] = Counter()
        async with AsyncConsumer(group, topic, **options) as a:  # type: ignore[arg-type]
            assert held(a, topic) == 4
            await drain([a], first, 10)
            async with AsyncConsumer(group, topic, **options) as b:  # type: ignore[arg-type]
                await until(lambda: held(b, topic) == 2 and held(a, topic) == 2, "handover")
                await drain([a, b], first, 40)
                # the group's offsets back to 0 through its coordinator: the owners'
                # tokens change, they drop their queues uncommitted and start again
                queues = [mq for mq in [*a._queues, *b._queues] if mq.topic == topic]
                coordinator = coordinator_for(group, ns)
                await coordinator.reset_offsets.remote(topic, offsets=dict.fromkeys(queues, 0))
                again: Counter[bytes] = Counter()
                await drain([a, b], again, 40)
                return first, again, held(b, topic)

    first, again, b_held = asyncio.run(asyncio.wait_for(main(), 90))
    assert first == Counter(bodies)  # each finished once across the handover
    assert again == Counter(bodies)  # all again from the reset offsets, each once
    assert b_held == 2
    assert committed(cluster, group, topic) == 40


def test_an_orderly_queue_is_never_out_in_two_members(aio_cluster: actors.Cluster) -> None:
    """A member holds one message of each queue in its loop bodies when a second
    member joins: the queue handed over goes to the new member only once that message
    is finished, and each key's messages come in order."""
    cluster, topic, group = aio_cluster, "AioOrderlyGroup", "aio-orderly-group"
    cluster.admin.create_topic(topic, 1, 1)  # one queue on each broker
    sent: dict[str, list[bytes]] = {}
    with cluster.producer("aio-orderly-p") as producer:
        for key in "abcd":
            for i in range(3):
                r = producer.send(Message(topic, b"%s%d" % (key.encode(), i)), sharding_key=key)
                sent.setdefault(str(r.message_queue), []).append(b"%s%d" % (key.encode(), i))
    assert len(sent) == 2  # both queues hold keys
    events: list[tuple[str, str, bytes]] = []  # (what, queue, body)

    async def main() -> None:
        options = {
            "namespace": cluster.namespace,
            "consume_from": "first",
            "orderly": True,
            "heartbeat_interval_s": 1.0,
        }
        got: list[bytes] = []

        async def follow(consumer: AsyncConsumer) -> None:
            while len(got) < 12:
                message = await consumer.receive(0.2)
                if message is not None:
                    events.append(("out", str(message.queue), message.body))
                    got.append(message.body)
                    await message.ack()

        async with AsyncConsumer(group, topic, **options) as a:  # type: ignore[arg-type]
            held = await asyncio.gather(a.receive(10), a.receive(10))  # two loop bodies
            assert all(m is not None for m in held)
            assert {str(m.queue) for m in held if m is not None} == set(sent)
            got.extend(m.body for m in held if m is not None)
            async with AsyncConsumer(group, topic, **options) as b:  # type: ignore[arg-type]
                b_follows = asyncio.ensure_future(follow(b))
                await asyncio.sleep(1.5)  # b joined; a was asked to give a queue up
                for m in held:
                    assert m is not None
                    events.append(("finished", str(m.queue), m.body))
                    await m.ack()
                await asyncio.gather(follow(a), b_follows)
                assert any(mq.topic == topic for mq in b._queues)

    asyncio.run(asyncio.wait_for(main(), 60))
    for queue, bodies in sent.items():
        mine = [(what, body) for what, q, body in events if q == queue]
        assert mine[0] == ("finished", bodies[0])  # nothing of it out before that
        assert [body for _, body in mine[1:]] == bodies[1:]  # the rest in order


def test_broadcasting_offsets_are_kept_in_the_consumers_file(
    aio_cluster: actors.Cluster, tmp_path: Path
) -> None:
    cluster, topic, group = aio_cluster, "AioBroadcastKept", "aio-bcast"
    cluster.admin.create_topic(topic, 1, 1)
    bodies = [b"b%d" % i for i in range(10)]
    send(cluster, topic, bodies)
    options = {
        "namespace": cluster.namespace,
        "broadcasting": True,
        "consume_from": "first",
        "offset_store_dir": str(tmp_path),
    }

    async def take(n: int | None, **more: str) -> list[bytes]:
        got: list[bytes] = []
        async with AsyncConsumer(group, topic, **options, **more) as c:  # type: ignore[arg-type]
            with pytest.raises(InvalidConfigError):  # one consumer per file
                AsyncConsumer(group, topic, **options, **more)  # type: ignore[arg-type]
            while n is None or len(got) < n:
                message = await c.receive(1.0 if n is None else 10)
                if message is None:
                    break
                got.append(message.body)
                await message.ack()
        return got

    first = asyncio.run(take(6))
    assert (tmp_path / group / "DEFAULT.json").exists()
    rest = asyncio.run(take(None))
    assert sorted(first + rest) == sorted(bodies)  # went on where it stopped
    other = asyncio.run(take(None, instance_name="other"))
    assert sorted(other) == sorted(bodies)  # another instance: from consume_from
    assert ray.is_initialized()
