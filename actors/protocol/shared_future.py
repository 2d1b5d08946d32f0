"""Futures made cheap to create: they share a ``threading.Condition``.

A ``concurrent.futures.Future`` builds a condition (and its lock) of its own, a third
of what a future costs from its creation to its callbacks. A message sent alone makes
several: the caller's (``send_async``), and one per request on the broker's
connection. A :class:`SharedFuture` takes its condition from its owner instead (a
producer's coalescer, a sender, a connection), and the futures of a coalesced batch
are settled together (:func:`settle_all`): one hold of that lock and one wake of its
waiters per batch, not per message. Each future still gets its own result (or error)
and runs its own callbacks, in the order they were added.

A thread blocked in :meth:`SharedFuture.result` or :meth:`SharedFuture.exception`
waits on a lock of its own, released by that future's answer alone: many threads
waiting on futures of one owner (sync sends on one connection) are not all woken by
each answer. What such a future stands for (a send, a request written) cannot be
taken back once it was handed over: :meth:`SharedFuture.cancel` returns False (as a
running future's does). Everything else (``add_done_callback``,
``concurrent.futures.wait`` and ``as_completed``, ``asyncio.wrap_future``) works as
on any future.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any

log = logging.getLogger("raymq.actors.protocol.shared_future")

_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)


class SharedFuture(Future[Any]):
    """A future whose condition is shared with the other futures of its owner."""

    def __init__(self, condition: threading.Condition) -> None:  # no super(): no Condition
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def cancel(self) -> bool:
        """False: what was handed over is not taken back."""
        return False

    def result(self, timeout: float | None = None) -> Any:
        exc = self.exception(timeout)
        if exc is not None:
            try:
                raise exc
            finally:
                self = None  # type: ignore[assignment]  # no cycle through the traceback
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:  # final, set after the answer: no lock to read it
            return self._exception
        with self._condition:
            if self._state == FINISHED:
                return self._exception
            if self._state in _CANCELLED:
                raise CancelledError()
            waiter = _Waiter()  # woken by this future's answer alone, not its owner's others
            self._waiters.append(waiter)
        woken = waiter.lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        with self._condition:
            self._waiters.remove(waiter)
            if not woken and self._state != FINISHED:
                raise TimeoutError()
            return self._exception


class _Waiter:
    """One thread blocked on one :class:`SharedFuture`: a lock held until the future is
    settled (as ``concurrent.futures.wait``'s waiters are told, under the condition).
    A waiter of its own, so a settled future wakes only the threads waiting for it: the
    shared condition wakes no one (with it, every answer woke every waiting thread)."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()

    def add_result(self, future: Any) -> None:
        self.lock.release()

    add_exception = add_cancelled = add_result


def settle_all(
    condition: threading.Condition,
    outcomes: Iterable[tuple[Any, Any, BaseException | None]],  # (SharedFuture, ...)
) -> None:
    """Settle each ``(future, result, error)`` (futures sharing ``condition``): one
    hold of the lock and one wake of its waiters for them all, then each future's
    callbacks in turn, outside the lock. A future settled already is left as it is."""
    settled = []
    with condition:
        for future, result, exc in outcomes:
            if future._state != PENDING:
                continue
            if exc is not None:
                future._exception = exc
                future._state = FINISHED
                for waiter in future._waiters:
                    waiter.add_exception(future)
            else:
                future._result = result
                future._state = FINISHED
                for waiter in future._waiters:
                    waiter.add_result(future)
            if future._done_callbacks:
                settled.append(future)
        condition.notify_all()
    for future in settled:
        for callback in future._done_callbacks:
            try:
                callback(future)
            except Exception:
                log.exception("exception calling callback for %r", future)
