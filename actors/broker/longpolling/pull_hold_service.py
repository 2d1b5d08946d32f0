"""Held pulls (RocketMQ's ``PullRequestHoldService``), woken by the store's dispatch.

The store calls :meth:`on_dispatch` from the putting thread, and only when a
pull waits on that queue does anything happen: on the event loop's own thread
(an inline put) the waiters are woken at once, from any other thread the
wake-up is handed over with ``call_soon_threadsafe``. A pull registers its
waiter *before* re-checking the queue's max offset, so a message dispatched
between its read and its wait is never missed.

A subscription (``actors.broker.processor.subscribe``) is a lasting waiter: its
callback, registered with :meth:`listen` for each queue it follows, is called on every
dispatch to them (on the loop's thread) until :meth:`unlisten`; no timer.

``woken`` counts the pulls woken so far: a send that woke one yields to the
loop once, so the held pull answers before the send's own acknowledgement
does (the consumer's latency is the one a held pull exists for).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class PullRequestHoldService:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}
        self._listeners: dict[tuple[str, int], set[Callable[[], None]]] = {}
        self._loop_thread = -1
        """The loop's thread, as the waiters and listeners were added there: whether a
        dispatch comes from it is a compare of thread idents (``get_running_loop`` made
        a ``getpid`` system call per put on Python 3.11)."""
        self.woken = 0

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int) -> None:
        key = (topic, queue_id)
        if key in self._waiters or key in self._listeners:
            if threading.get_ident() == self._loop_thread:
                self._wake(key)
            else:
                self._loop.call_soon_threadsafe(self._wake, key)

    def _wake(self, key: tuple[str, int]) -> None:
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)
                self.woken += 1
        for wake in tuple(self._listeners.get(key, ())):
            wake()
            self.woken += 1

    def listen(self, key: tuple[str, int], wake: Callable[[], None]) -> None:
        """``wake()`` on every dispatch to ``key``'s queue until :meth:`unlisten` (on the
        loop's thread)."""
        self._loop_thread = threading.get_ident()
        self._listeners.setdefault(key, set()).add(wake)

    def unlisten(self, key: tuple[str, int], wake: Callable[[], None]) -> None:
        listeners = self._listeners.get(key)
        if listeners is not None:
            listeners.discard(wake)
            if not listeners:
                del self._listeners[key]

    def register(self, topic: str, queue_id: int) -> asyncio.Future[None]:
        """A waiter woken by the next dispatch to the queue (on the loop's thread)."""
        self._loop_thread = threading.get_ident()
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
        """Until ``fut`` is woken or ``timeout`` passes (a timer, not ``wait_for``: its
        extra task and shield cost a few loop turns of latency per wake-up)."""
        timer = self._loop.call_later(timeout, _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self.discard(topic, queue_id, fut)

    def register_many(self, keys: list[tuple[str, int]]) -> asyncio.Future[None]:
        """One waiter for several queues: woken by the first message to any of them."""
        self._loop_thread = threading.get_ident()
        fut: asyncio.Future[None] = self._loop.create_future()
        for key in keys:
            self._waiters.setdefault(key, set()).add(fut)
        return fut

    async def wait_many(
        self, keys: list[tuple[str, int]], fut: asyncio.Future[None], timeout: float
    ) -> None:
        """:meth:`wait` for a :meth:`register_many` waiter; it leaves every queue after."""
        timer = self._loop.call_later(timeout, _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self.discard_many(keys, fut)

    def discard_many(self, keys: list[tuple[str, int]], fut: asyncio.Future[None]) -> None:
        for topic, queue_id in keys:
            self.discard(topic, queue_id, fut)

    def wake_all(self) -> None:
        for key in list(self._waiters) + list(self._listeners):
            self._wake(key)

    @property
    def held(self) -> int:
        return sum(len(w) for w in self._waiters.values())


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
