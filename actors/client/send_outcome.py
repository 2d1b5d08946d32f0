"""What the sender knows of one chunk across its attempts, and its retry helpers.

:class:`Outcome` judges each failure of a chunk's numbered run (where the next attempt
may go, ``actors.client.idempotence``); :class:`Delayed` runs the backoffs of async
retries on one timer thread; the functions say which failures are worth another
attempt and how long to wait before it.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from actors.client.idempotence import Sequencer
from actors.client.send_result import _Chunk
from actors.protocol import rpc as _rpc
from actors.protocol.errors import refused
from actors.protocol.wire import SendAck
from rebalance import MessageQueue
from storage.codec import EncodedBatch
from storage.errors import (
    BrokerUnavailableError,
    OutOfOrderSequenceError,
    TopicNotFoundError,
)
from storage.message import PutStatus

Sent = tuple[_Chunk, MessageQueue, SendAck]
"""One chunk's outcome: where it went and the broker's answer."""

Pinned = EncodedBatch | None
"""An idempotent chunk as bound and sent (it may be stored): only ever sent again as
is, to the same queue (``actors.client.idempotence``); None for other chunks."""

log = logging.getLogger("raymq.actors.producer")


def may_retry(exc: BaseException) -> bool:
    """A send worth making again: Ray or the broker's availability failed it, or an
    idempotent run arrived before one sent ahead of it."""
    return _rpc.send_may_retry(exc) or isinstance(exc, OutOfOrderSequenceError)


@contextmanager
def pinned_route() -> Iterator[None]:
    """Around the route lookup of a pinned run's next attempt: a topic with no route
    now (its only broker restarting, unregistered until it is back) is its broker
    unavailable, worth waiting for until the delivery deadline, not a missing topic."""
    try:
        yield
    except TopicNotFoundError as exc:
        raise BrokerUnavailableError(str(exc)) from exc


def backoff(attempt: int) -> float:
    return float(min(0.05 * 2**attempt, 0.5))


def stored_before(mq: MessageQueue, n: int) -> SendAck:
    """The answer to a run the broker says it stored long ago: offsets unknown (-1)."""
    unknown = np.full(n, -1, dtype=np.int64)
    return SendAck(PutStatus.PUT_OK, mq.broker_name, "0.0.0.0:0", unknown, unknown)


def answer_from(
    fut: concurrent.futures.Future[Any],
    answered: Callable[[SendAck | None, BaseException | None], None],
) -> None:
    try:
        ack = SendAck.from_wire(fut.result())
    except Exception as exc:  # noqa: BLE001 - retried by ``answered``
        answered(None, exc)
        return
    answered(ack, None)


class NotSent(BrokerUnavailableError):
    """A lane's call could not be made: nothing of it reached the broker."""


class Outcome:
    """What is known of one chunk's numbered run across its attempts, and so where the
    next attempt may go (``actors.client.idempotence``).

    ``bound``: the run as last numbered (None: numbered afresh by the next attempt);
    ``maybe_stored``: an attempt's answer was lost, so the broker may hold the run;
    ``pinned``: the next attempt sends ``bound`` as it is, to the same queue (it may be
    stored, or it waits for the run before it); ``moved``: the last failure was the
    broker's trouble (the fault tolerance hears of it), not the order of runs.
    A producer without idempotence numbers nothing: every failure is judged as
    RocketMQ's producer does (``send_may_retry``: elsewhere, or raised).
    """

    def __init__(self, sequencer: Sequencer | None) -> None:
        self.sequencer = sequencer
        self.bound: Pinned = None
        self.maybe_stored = False
        self.pinned = False
        self.moved = True
        self.last_exc: BaseException | None = None
        self.stored: tuple[MessageQueue, SendAck] | None = None

    def not_durable(self, ack: SendAck, mq: MessageQueue) -> bool:
        """``ack`` says the run is stored, but not as durably as asked (FLUSH_DISK_TIMEOUT,
        FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE): True when it is to be sent again as
        it is (an idempotent run: its broker answers from its record, never storing it
        twice, and answers SEND_OK once its disk or slave has caught up); the answer is
        kept, to be the outcome should no later attempt do better."""
        if ack.status is PutStatus.PUT_OK or self.sequencer is None or self.bound is None:
            return False
        self.stored = (mq, ack)
        self.maybe_stored = self.pinned = True
        self.moved = False
        return True

    def failed(self, exc: BaseException, mq: MessageQueue | None) -> bool:
        """An attempt failed with ``exc``: whether another attempt is worth making."""
        self.last_exc = exc
        self.moved = not isinstance(exc, OutOfOrderSequenceError)
        bound, seq = self.bound, self.sequencer
        if bound is None or seq is None or bound.seq_runs is None or mq is None:
            self.pinned = False
            return _rpc.send_may_retry(exc)
        if isinstance(exc, OutOfOrderSequenceError):  # refused: the broker lacks the run
            if seq.gap_is_final(bound, mq):  # what it waits for will not come
                self.bound, self.pinned, self.maybe_stored = None, False, False
            else:
                self.pinned = True  # the run before it is on its way
            return True
        if refused(exc) or (isinstance(exc, NotSent) and not self.maybe_stored):
            if self.maybe_stored:  # this refusal says nothing of the earlier attempt
                if _rpc.send_may_retry(exc):
                    self.pinned = True
                    return True
                self.give_up(mq)
                return False
            seq.release(bound, mq)  # the broker wrote nothing: the numbers are free
            self.bound, self.pinned = None, False
            return _rpc.send_may_retry(exc)
        if not may_retry(exc):  # the answer is lost, and it is not worth waiting for
            self.give_up(mq)
            return False
        self.maybe_stored = self.pinned = True
        return True

    def next_attempt(
        self, attempt: int, retries: int, reordered: bool, deadline: float
    ) -> tuple[int, bool]:
        """After an attempt that settled nothing: the attempt count, and whether to make
        another. A refusal for the order of runs (``reordered``) is no failed attempt,
        bounded by the deadline, not by the retries; a pinned run (it may be stored, or
        waits for the run before it) is tried past the retries until the deadline."""
        if reordered:
            return attempt, time.monotonic() < deadline
        attempt += 1
        if attempt > retries and (not self.pinned or time.monotonic() >= deadline):
            return attempt, False
        return attempt, True

    def settle(self, mq: MessageQueue) -> None:
        """Answered: the run is over."""
        if self.bound is not None and self.sequencer is not None:
            self.sequencer.settle(self.bound, mq)

    def give_up(self, mq: MessageQueue | None) -> None:
        """No more attempts: the numbers go back, or (it may be stored) a new epoch."""
        bound, seq = self.bound, self.sequencer
        if bound is None or seq is None or bound.seq_runs is None or mq is None:
            return
        if self.stored is not None:  # answered as stored: over, as an answer is
            seq.settle(bound, self.stored[0])
        elif self.maybe_stored:
            seq.abandon(bound, mq)
        else:
            seq.release(bound, mq)
        self.bound = None


class Delayed:
    """Calls made after a delay, on one thread (retries waiting out their backoff)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None], Callable[[], None]]] = []
        self._ids = itertools.count()
        self._closed = False
        self._thread: threading.Thread | None = None

    def call(self, delay: float, fn: Callable[[], None], on_closed: Callable[[], None]) -> None:
        """``fn()`` in ``delay`` seconds; ``on_closed()`` at once if closed already."""
        with self._cond:
            closed = self._closed
            if not closed:
                heapq.heappush(
                    self._heap, (time.monotonic() + delay, next(self._ids), fn, on_closed)
                )
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="raymq-producer-retry", daemon=True
                    )
                    self._thread.start()
                self._cond.notify()
        if closed:
            on_closed()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._closed:
                    left, self._heap = self._heap, []
                    break
                _, _, fn, _ = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # noqa: BLE001 - one retry must not stop the others
                log.exception("a delayed send retry failed")
        for _, _, _, on_closed in left:
            on_closed()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
