"""The future ``send_async`` hands back for each message, made cheap to create.

A ``concurrent.futures.Future`` builds a ``threading.Condition`` (and its lock) of
its own: for a service sending one message per call that was ~40 % of the caller's
time in ``send_async``. A :class:`SendFuture` shares its producer's condition
instead, and the futures of a coalesced batch are settled together
(:func:`settle_all`): one hold of that lock and one wake of its waiters per batch,
not per message. Each future still gets its own result (or error) and runs its own
callbacks, in the order they were added.

Sharing the condition means a waiter may wake for another future's answer, so
:meth:`SendFuture.result` and :meth:`SendFuture.exception` wait again until their
own is there or their timeout has passed. A send cannot be taken back once it was
handed over: :meth:`SendFuture.cancel` returns False (as a running future's does).
Everything else (``add_done_callback``, ``concurrent.futures.wait`` and
``as_completed``, ``asyncio.wrap_future``) works as on any future.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any

log = logging.getLogger("raymq.actors.send_future")

_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)


class SendFuture(Future[Any]):
    """A future of one send, its condition shared with the others of its producer."""

    def __init__(self, condition: threading.Condition) -> None:  # no super(): no Condition
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def cancel(self) -> bool:
        """False: a send handed over is not taken back."""
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
        cond = self._condition
        with cond:
            if self._state != FINISHED:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self._state != FINISHED:  # the condition is shared: wake-ups of others
                    if self._state in _CANCELLED:
                        raise CancelledError()
                    if deadline is None:
                        cond.wait()
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError()
                    cond.wait(left)
            return self._exception


def settle_all(
    condition: threading.Condition,
    outcomes: Iterable[tuple[Any, Any, BaseException | None]],  # (SendFuture, ...)
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
