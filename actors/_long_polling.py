"""Held pulls (RocketMQ's ``PullRequestHoldService``), woken by the store's dispatch.

The store calls :meth:`on_dispatch` from the putting thread; it hands the
wake-up to the event loop with ``call_soon_threadsafe``, and only when a pull
waits on that queue. A pull registers its waiter *before* re-checking the
queue's max offset, so a message dispatched between its read and its wait is
never missed.
"""

from __future__ import annotations

import asyncio
import contextlib


class PullRequestHoldService:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int) -> None:
        if (topic, queue_id) in self._waiters:
            self._loop.call_soon_threadsafe(self._wake, (topic, queue_id))

    def _wake(self, key: tuple[str, int]) -> None:
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    def register(self, topic: str, queue_id: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault((topic, queue_id), set()).add(fut)
        return fut

    def discard(self, topic: str, queue_id: int, fut: asyncio.Future[None]) -> None:
        waiters = self._waiters.get((topic, queue_id))
        if waiters is not None:
            waiters.discard(fut)
            if not waiters:
                del self._waiters[(topic, queue_id)]

    async def wait(
        self, topic: str, queue_id: int, fut: asyncio.Future[None], timeout: float
    ) -> None:
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            self.discard(topic, queue_id, fut)

    def wake_all(self) -> None:
        for key in list(self._waiters):
            self._wake(key)

    @property
    def held(self) -> int:
        return sum(len(w) for w in self._waiters.values())
