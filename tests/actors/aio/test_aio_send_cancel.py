"""AsyncProducer under cancellation and backpressure: a send cancelled at any of its
await points is stored once or not at all, and a full budget suspends its callers."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import actors
from actors.aio import AsyncProducer
from storage import Message


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
