"""Futures made cheap to create: they share one lock.

A ``concurrent.futures.Future`` builds a condition (and its lock) of its own, a third
of what a future costs from its creation to its callbacks. A message sent alone makes
several: the caller's (``send_async``), and one per request on the broker's
connection. A :class:`SharedFuture` takes its lock from its owner instead (a
producer's coalescer, a sender, a connection: :func:`new_lock`), and the futures of a
coalesced batch are settled together (:func:`settle_all`): one hold of that lock per
batch, not per message. Each future still gets its own result (or error) and runs its
own callbacks, in the order they were added.

A thread blocked in :meth:`SharedFuture.result` or :meth:`SharedFuture.exception`
waits on a lock of its own, released by that future's answer alone: many threads
waiting on futures of one owner (sync sends on one connection) are not all woken by
each answer. So nothing ever waits on the shared lock as a condition, and settling a
future wakes no one through it: the owner's lock is a plain ``RLock`` (held in C,
where a ``threading.Condition`` runs Python for each hold and each ``notify_all``;
reentrant, as ``concurrent.futures.wait`` takes every future's lock in turn, and
futures of one owner share it). What such a future stands for (a send, a request
written) cannot be taken back once it was handed over: :meth:`SharedFuture.cancel`
returns False (as a running future's does). Everything else (``add_done_callback``,
``concurrent.futures.wait`` and ``as_completed``, ``asyncio.wrap_future``) works as
on any future.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any

log = logging.getLogger("raymq.actors.protocol.shared_future")

_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)


def new_lock() -> Any:
    """The lock an owner's futures share (reentrant: see the module doc)."""
    return threading.RLock()


class SharedFuture(Future[Any]):
    """A future whose lock is shared with the other futures of its owner (``lock``:
    :func:`new_lock`'s, or any lock with ``acquire``/``release``, a ``Condition`` too)."""

    def __init__(self, lock: Any) -> None:  # no super(): no Condition of its own
        self._condition = lock  # the name concurrent.futures.wait takes it by
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def cancel(self) -> bool:
        """False: what was handed over is not taken back."""
        return False

    def set_result(self, result: Any) -> None:
        """As ``Future.set_result``, without a condition's wake: no one waits on it."""
        self._set(result, None, failed=False)

    def set_exception(self, exception: BaseException | None) -> None:
        """As ``Future.set_exception``, without a condition's wake: no one waits on it."""
        self._set(None, exception, failed=True)

    def _set(self, result: Any, exc: BaseException | None, failed: bool) -> None:
        with self._condition:
            if self._state != PENDING:
                raise InvalidStateError(f"{self._state}: {self!r}")
            _finish(self, result, exc, failed)
        _run_callbacks(self)

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
    lock: Any,
    outcomes: Iterable[tuple[Any, Any, BaseException | None]],  # (SharedFuture, ...)
) -> None:
    """Settle each ``(future, result, error)`` (futures sharing ``lock``): one hold of
    the lock for them all, then each future's callbacks in turn, outside the lock. A
    future settled already is left as it is."""
    settled = []
    with lock:
        for future, result, exc in outcomes:
            if future._state != PENDING:
                continue
            _finish(future, result, exc, exc is not None)
            if future._done_callbacks:
                settled.append(future)
    for future in settled:
        _run_callbacks(future)


def _finish(future: Any, result: Any, exc: BaseException | None, failed: bool) -> None:
    """A pending future settled (its lock held): its outcome, then its state (which
    :meth:`SharedFuture.exception` reads without the lock, so the outcome must be there
    first), then its waiters told."""
    if failed:
        future._exception = exc
        future._state = FINISHED
        for waiter in future._waiters:
            waiter.add_exception(future)
    else:
        future._result = result
        future._state = FINISHED
        for waiter in future._waiters:
            waiter.add_result(future)


def _run_callbacks(future: Any) -> None:
    """A settled future's callbacks in the order they were added (as ``Future`` runs
    them: one that raises is logged, the next still runs)."""
    for callback in future._done_callbacks:
        try:
            callback(future)
        except Exception:
            log.exception("exception calling callback for %r", future)
