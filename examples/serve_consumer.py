"""A Ray Serve deployment that consumes a topic and answers requests from it.

    python examples/serve_consumer.py

The ``OrderStatus`` deployment follows the topic ``OrderEvents`` with an
``AsyncConsumer`` (``async for`` on the replica's own event loop, BROADCASTING: every
replica sees every event) and answers ``status(order_id)`` from what it has seen. The
driver sends order events with an ``AsyncProducer`` and asks the deployment through
its handle (HTTP works the same way, through Serve's proxy: disabled here).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from typing import Any

import ray
from ray import serve

import actors
from actors.aio import AsyncConsumer, AsyncProducer
from storage import Message

TOPIC = "OrderEvents"


@serve.deployment
class OrderStatus:
    """The latest status of each order, as the topic's events said."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.statuses: dict[str, str] = {}
        self.task: asyncio.Task[Any] | None = None
        self.ready: asyncio.Event | None = None
        self.changed: asyncio.Condition | None = None
        # The statuses live in this replica's memory, so its broadcasting offsets live
        # and die with it: a replica started again reads the topic from where a new
        # member starts, not from a file an earlier replica left in the home directory.
        self.offsets = tempfile.mkdtemp(prefix="raymq-serve-offsets-")

    def __del__(self) -> None:
        # Serve calls it when the replica shuts down (serve.delete): its offsets go too
        shutil.rmtree(self.offsets, ignore_errors=True)

    async def _follow(self, ready: asyncio.Event) -> None:
        async with AsyncConsumer(
            "order-status",
            TOPIC,
            namespace=self.namespace,
            broadcasting=True,
            offset_store_dir=self.offsets,
        ) as consumer:
            ready.set()
            async for message in consumer:
                order, _, status = message.body.decode().partition(":")
                self.statuses[order] = status
                assert self.changed is not None
                async with self.changed:
                    self.changed.notify_all()

    async def _started(self) -> None:
        if self.task is None:  # on the replica's event loop, at its first request
            self.ready = asyncio.Event()
            self.changed = asyncio.Condition()
            self.task = asyncio.ensure_future(self._follow(self.ready))
        assert self.ready is not None
        await self.ready.wait()

    async def start(self) -> bool:
        """Follow the topic from now on (the first request does it too)."""
        await self._started()
        return True

    async def status(self, order_id: str) -> str | None:
        await self._started()
        return self.statuses.get(order_id)

    async def status_once(self, order_id: str, status: str, timeout_s: float) -> str | None:
        """``order_id``'s status once it is ``status`` (or whatever it is after ``timeout_s``)."""
        await self._started()
        assert self.changed is not None
        try:
            async with asyncio.timeout(timeout_s), self.changed:
                await self.changed.wait_for(lambda: self.statuses.get(order_id) == status)
        except TimeoutError:
            pass
        return self.statuses.get(order_id)


async def send_events(namespace: str, events: list[tuple[str, str]]) -> None:
    async with AsyncProducer("order-events", namespace=namespace) as producer:
        for order, status in events:  # one order's events in order: its key, one queue
            await producer.send(Message(TOPIC, f"{order}:{status}".encode()), sharding_key=order)


def run(cluster: actors.Cluster, orders: int = 20) -> dict[str, str | None]:
    """Deploy ``OrderStatus``, send ``orders`` orders through created -> paid -> shipped,
    and return what the deployment answers for each (all "shipped" once it caught up)."""
    cluster.admin.create_topic(TOPIC, 4, 4)
    serve.start(proxy_location="Disabled")
    handle = serve.run(OrderStatus.bind(cluster.namespace), name="order-status", route_prefix=None)
    try:
        handle.start.remote().result(timeout_s=60)
        events = [(f"o{i}", s) for s in ("created", "paid", "shipped") for i in range(orders)]
        asyncio.run(send_events(cluster.namespace, events))
        calls = {f"o{i}": handle.status_once.remote(f"o{i}", "shipped", 60) for i in range(orders)}
        return {order: call.result(timeout_s=90) for order, call in calls.items()}
    finally:
        serve.delete("order-status")


def main() -> int:
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    root = tempfile.mkdtemp(prefix="raymq-serve-")
    cluster = actors.start_cluster(namespace="serve-demo", store_root=root)
    try:
        answers = run(cluster)
        print(f"{sum(a == 'shipped' for a in answers.values())} of {len(answers)} orders shipped")
        return 0 if all(a == "shipped" for a in answers.values()) else 1
    finally:
        serve.shutdown()
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
