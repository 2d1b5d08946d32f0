"""A Ray async actor that consumes a topic with ``async for``.

    python examples/async_actor_consumer.py

Starts a local Ray and a one-broker cluster, an async actor whose event loop runs an
``AsyncConsumer`` loop (the offset of each message is committed once the loop's body
finished with it), sends 100 orders with an ``AsyncProducer`` from the driver's own
loop, and asks the actor for the total it summed.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from typing import Any

import ray

import actors
from actors.aio import AsyncConsumer, AsyncProducer
from storage import Message

TOPIC = "Orders"


@ray.remote
class OrderTotals:
    """Sums the amounts of the orders on ``TOPIC`` as they arrive."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.total = 0
        self.count = 0
        self.started = asyncio.Event()
        self.loop: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        consumer = AsyncConsumer("order-totals", TOPIC, namespace=self.namespace)
        await consumer.start()  # its queues taken: messages sent from now on are its
        self.loop = asyncio.ensure_future(self._consume(consumer))

    async def _consume(self, consumer: AsyncConsumer) -> None:
        async with consumer:
            async for message in consumer:
                self.total += int(message.body)
                self.count += 1

    async def totals(self, expected: int, timeout_s: float = 60.0) -> tuple[int, int]:
        """(count, total) once ``expected`` orders were summed."""
        async with asyncio.timeout(timeout_s):
            while self.count < expected:
                await asyncio.sleep(0.01)
        return self.count, self.total

    async def stop(self) -> None:
        if self.loop is not None:
            self.loop.cancel()
            await asyncio.gather(self.loop, return_exceptions=True)


async def send_orders(namespace: str, amounts: list[int]) -> None:
    async with AsyncProducer("orders", namespace=namespace) as producer:
        await asyncio.gather(*(producer.send(Message(TOPIC, b"%d" % a)) for a in amounts))


def run(cluster: actors.Cluster, orders: int = 100) -> tuple[int, int]:
    """The actor's (count, total) for ``orders`` orders of 1..orders on ``cluster``."""
    cluster.admin.create_topic(TOPIC, 4, 4)
    actor = OrderTotals.remote(cluster.namespace)
    try:
        ray.get(actor.start.remote())
        asyncio.run(send_orders(cluster.namespace, list(range(1, orders + 1))))
        return ray.get(actor.totals.remote(orders))
    finally:
        ray.get(actor.stop.remote())
        ray.kill(actor)


def main() -> int:
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    root = tempfile.mkdtemp(prefix="raymq-async-actor-")
    cluster = actors.start_cluster(namespace="async-actor-demo", store_root=root)
    try:
        count, total = run(cluster)
        print(f"the actor summed {count} orders: {total}")
        return 0 if (count, total) == (100, 5050) else 1
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
