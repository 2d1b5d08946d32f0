"""A bound on what ``send_async`` holds for the caller (RocketMQ's async backpressure).

Without it, a loop calling ``send_async`` faster than the brokers answer keeps
every batch it made in the producer's memory until the lanes get to it. RocketMQ
bounds async sends with two semaphores (``backPressureForAsyncSendNum`` and
``backPressureForAsyncSendSize``); a send waits for room up to its timeout and
fails with ``RemotingTooMuchRequestException`` past it. This budget does the same
in messages and encoded bytes, since a RayMQ send may carry one message or 4096.

A send bigger than the whole budget is let through when nothing else is
unanswered, so it waits instead of failing forever. A send made while answers
are being delivered (a completion callback that sends more) is let through
without waiting: that thread is the one that would free room, and waiting on it
would hold every other answer back until the timeout.
"""

from __future__ import annotations

import contextlib
import threading
import time

from storage.errors import RayMQError


class ProducerBusyError(RayMQError):
    """``send_async`` found no room within the send timeout: too much is unanswered."""


class AsyncSendBudget:
    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._messages = 0
        self._bytes = 0
        self._waiting = 0  # threads in ``_cond.wait``: an answer wakes the condition only then
        self._delivering = threading.local()

    @property
    def in_flight(self) -> tuple[int, int]:
        """Messages and bytes taken and not yet given back."""
        with self._cond:
            return self._messages, self._bytes

    def acquire(self, messages: int, nbytes: int, timeout_s: float) -> None:
        """Take room for a send, waiting up to ``timeout_s``; :class:`ProducerBusyError`
        past it (nothing taken)."""
        with self._lock:  # the common case, room at once: no frame of the condition's
            taken = self._messages
            if (
                not taken
                or taken + messages <= self.max_messages
                and self._bytes + nbytes <= self.max_bytes
            ):
                self._messages = taken + messages
                self._bytes += nbytes
                return
        with self._cond:
            if not getattr(self._delivering, "active", False):
                deadline = time.monotonic() + timeout_s
                while not self._fits(messages, nbytes):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ProducerBusyError(
                            f"send_async: {self._messages} messages / {self._bytes} B "
                            f"unanswered for {timeout_s:g} s (budget {self.max_messages} "
                            f"messages / {self.max_bytes} B; ProducerConfig."
                            "async_send_max_messages / async_send_max_bytes)"
                        )
                    self._wait(left)
            self._messages += messages
            self._bytes += nbytes

    def release(self, messages: int, nbytes: int) -> None:
        with self._lock:  # the condition's lock, held in C; its wake only for a waiter
            self._messages -= messages
            self._bytes -= nbytes
            if self._waiting:
                self._cond.notify_all()

    def _wait(self, timeout_s: float) -> None:
        """``_cond.wait``, counted in ``_waiting`` (``_lock`` held, as for any wait)."""
        self._waiting += 1
        try:
            self._cond.wait(timeout_s)
        finally:
            self._waiting -= 1

    def wait_empty(self, timeout_s: float) -> bool:
        """Wait until everything taken was given back; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._messages or self._bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wait(left)
            return True

    def delivering(self) -> contextlib.AbstractContextManager[None]:
        """Around code that runs callers' completion callbacks (see the module doc)."""
        return _Delivering(self._delivering)

    def _fits(self, messages: int, nbytes: int) -> bool:
        if self._messages == 0:
            return True  # alone, anything goes: a send over the budget must not wait forever
        return (
            self._messages + messages <= self.max_messages
            and self._bytes + nbytes <= self.max_bytes
        )


class _Delivering:
    """:meth:`AsyncSendBudget.delivering`'s context: the thread's mark set for its
    duration, the outer one back after (a class: a generator's context manager costs
    a few microseconds more on every answer)."""

    __slots__ = ("_local", "_outer")

    def __init__(self, local: threading.local) -> None:
        self._local = local
        self._outer = False

    def __enter__(self) -> None:
        self._outer = getattr(self._local, "active", False)
        self._local.active = True

    def __exit__(self, *exc: object) -> None:
        self._local.active = self._outer
