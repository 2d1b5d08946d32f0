"""AsyncProducer under cancellation and backpressure: a send cancelled at any of its
await points is stored once or not at all, and a full budget suspends its callers."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import actors
from actors.aio import AsyncProducer
from storage import Message
from storage.message import PutStatus


def test_a_cancelled_send_is_stored_at_most_once_and_the_producer_goes_on(
    aio_cluster: actors.Cluster,
    stored: Callable[[str], list[bytes]],
) -> None:
    """Cancelled after 0, 1, 2... turns of the loop, a send is caught at its await points
    in turn: whatever it was doing, its message is stored once or not at all, and the
    sends after it are stored."""
    cluster, topic = aio_cluster, "AioCancelSend"
    cluster.admin.create_topic(topic, 2, 2)
    outcomes: dict[bytes, str] = {}

    async def main() -> None:
        async with AsyncProducer("aio-cancel-send", namespace=cluster.namespace) as producer:
            for turns in range(60):
                for single in (True, False):
                    body = b"x%d-%d" % (turns, single)
                    message = Message(topic, body)
                    send = producer.send(message) if single else producer.send_batch([message])
                    task = asyncio.ensure_future(send)
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    task.cancel()
                    done = await asyncio.gather(task, return_exceptions=True)
                    cancelled = isinstance(done[0], asyncio.CancelledError)
                    outcomes[body] = "cancelled" if cancelled else "sent"
            after = await producer.send_batch([Message(topic, b"after%d" % i) for i in range(5)])
            assert len(after) == 5

    asyncio.run(main())
    bodies = Counter(stored(topic))
    assert max(bodies.values()) == 1  # nothing stored twice
    assert {b"after%d" % i for i in range(5)} <= set(bodies)
    for body, outcome in outcomes.items():
        if outcome == "sent":
            assert bodies[body] == 1
    cancelled = [body for body, outcome in outcomes.items() if outcome == "cancelled"]
    assert any(bodies[body] == 0 for body in cancelled)  # cancelled before its frame left


def test_a_full_budget_suspends_the_caller(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    cluster, topic = aio_cluster, "AioBudget"
    cluster.admin.create_topic(topic, 2, 2)

    async def main() -> int:
        most = 0
        async with AsyncProducer(
            "aio-budget", namespace=cluster.namespace, async_send_max_messages=8
        ) as producer:
            budget = producer._get_budget()

            async def one(i: int) -> None:
                nonlocal most
                await producer.send(Message(topic, b"%d" % i))
                most = max(most, budget.messages)

            await asyncio.gather(*(one(i) for i in range(100)))
            assert budget.messages == 0
        return most

    assert asyncio.run(main()) <= 8
    assert len(stored(topic)) == 100


def test_a_send_cancelled_after_its_frame_left_ends_stored_once_and_known(
    aio_cluster: actors.Cluster, stored: Callable[[str], list[bytes]]
) -> None:
    """Both brokers hold the answer of their next send after storing it
    (``hang_after_store``): the caller is cancelled once its message is seen stored,
    so its frame certainly left. The send goes on without it: no answer in
    ``send_timeout_s``, it is sent again as the same numbered bytes to the same queue,
    which the broker answers as stored before; the outcome is known (``close`` waits
    for it, and the background send ends with the stored message's result), the
    message is stored once and the producer's next sends to that queue are stored in
    order after it."""
    cluster, topic = aio_cluster, "AioCancelAfterWrite"
    cluster.admin.create_topic(topic, 1, 1)  # one queue on each broker
    brokers = [cluster.broker(name) for name in ("broker-a", "broker-b")]

    async def main(single: bool) -> tuple[list[Any], list[Any]]:
        body = b"held-%d" % single
        async with AsyncProducer(
            "aio-cancel-after", namespace=cluster.namespace, send_timeout_s=1.0
        ) as producer:
            await producer.send_batch(
                [Message(topic, b"warm-up-%d" % single)]
            )  # routes and id known
            await asyncio.gather(*(b.inject_fault.remote("hang_after_store", 1) for b in brokers))
            before = set(producer._background)
            message = Message(topic, body)
            send = producer.send(message) if single else producer.send_batch([message])
            task = asyncio.ensure_future(send)
            while body not in await asyncio.to_thread(stored, topic):
                assert not task.done()  # its answer is held: the caller still waits
                await asyncio.sleep(0.05)
            task.cancel()
            assert isinstance(
                (await asyncio.gather(task, return_exceptions=True))[0], asyncio.CancelledError
            )
            going_on = list(set(producer._background) - before)
            assert going_on  # the send was not abandoned with its caller
            done, _ = await asyncio.wait(going_on, timeout=30)
            outcomes = [t.result() for t in done]
            after = await producer.send_batch(
                [Message(topic, b"after-%d-%d" % (single, i)) for i in range(3)]
            )
            # the next sends of both queues
            more = await asyncio.gather(
                *(producer.send(Message(topic, b"more-%d-%d" % (single, i))) for i in range(6))
            )
        await asyncio.gather(*(b.inject_fault.remote("hang_after_store", 0) for b in brokers))
        return outcomes, [*after, *more]

    for single in (True, False):
        outcomes, later = asyncio.run(asyncio.wait_for(main(single), 60))
        assert len(outcomes) == 1 and len(outcomes[0]) == 1  # one chunk, its outcome known
        _, _, ack = outcomes[0][0]
        assert ack.status is PutStatus.PUT_OK  # stored (answered now, or as stored before)
        assert len(later) == 9
        assert Counter(stored(topic))[b"held-%d" % single] == 1  # stored once
    bodies = Counter(stored(topic))
    assert max(bodies.values()) == 1
    expected = {b"after-%d-%d" % (s, i) for s in (0, 1) for i in range(3)}
    expected |= {b"more-%d-%d" % (s, i) for s in (0, 1) for i in range(6)}
    assert expected <= set(bodies)
