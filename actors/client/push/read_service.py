"""What the push consumer's two ways of reading its queues share: pulls
(:class:`~actors.client.push.pull_service.PullMessageService`) and subscriptions
(:class:`~actors.client.push.stream_service.StreamService`). Each runs one thread,
woken by an event queue, that takes every event waiting in one round; each pauses a
queue whose buffer passes the consumer's thresholds (``pull_threshold_for_queue``
messages or ``pull_threshold_size_for_queue_mib``, or for a concurrent consumer
buffered offsets spanning more than ``CONSUME_CONCURRENTLY_MAX_SPAN``) until
consumption brings it back under."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

from actors.client.push.context import PullContext
from actors.client.push.process_queue import (
    CONSUME_CONCURRENTLY_MAX_SPAN,
    ProcessQueue,
    PullState,
)
from actors.protocol import rpc as _rpc
from storage.errors import RayMQError

E = TypeVar("E")


class ReadService(Generic[E]):
    """A reading service's thread, its events (``E``; None stops it) and its queues'
    thresholds. Subclasses run :meth:`_loop` on the thread."""

    def __init__(self, consumer: PullContext, name: str) -> None:
        self.c = consumer
        cfg = consumer.config
        self._events: queue.SimpleQueue[E | None] = queue.SimpleQueue()
        self._stopped = False
        self._max_buffer = cfg.pull_threshold_for_queue
        self._max_bytes = cfg.pull_threshold_size_for_queue_mib << 20
        # an orderly queue is consumed in order: its span never outgrows its buffer
        self._max_span = None if cfg.orderly else CONSUME_CONCURRENTLY_MAX_SPAN
        self._thread = threading.Thread(
            target=self._loop, name=f"raymq-{name}-{consumer.group}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._events.put(None)
        self._thread.join(timeout=10.0)

    def _loop(self) -> None:
        raise NotImplementedError

    def _round(self) -> list[E | None]:
        """The next event (waited for) and every other one already waiting: what the
        thread handles in one round."""
        events = [self._events.get()]
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def _over_threshold(self, pq: ProcessQueue) -> bool:
        """``pq``'s buffer is past the thresholds (``pq.lock`` held)."""
        return pq.over_threshold(self._max_buffer, self._max_bytes, self._max_span)

    def _paused(self, pq: ProcessQueue) -> bool:
        """True, and ``pq`` PAUSED (a pause counted when it was not), when its buffer is
        past the thresholds: the consume service asks for it again once under
        (``pq.lock`` held)."""
        if not self._over_threshold(pq):
            return False
        if pq.state is not PullState.PAUSED:
            self.c.stats.add("flow_control_pauses")
        pq.state = PullState.PAUSED
        return True

    def _read_failed(self, pqs: Iterable[ProcessQueue], exc: BaseException) -> int:
        """A read of ``pqs`` failed with ``exc``: counted, and the routes it puts in
        doubt forgotten (the broker's after a failure on the way, the topic's after one
        that is no broker's answer). The level to log it at: DEBUG for a failure on the
        way, WARNING for the others."""
        c = self.c
        c.stats.add("pull_errors")
        retriable = _rpc.is_retriable(exc)
        for pq in pqs:
            if retriable:
                c.forget_route(pq.mq.topic, pq.mq.broker_name)
            elif not isinstance(exc, RayMQError):
                c.forget_route(pq.mq.topic)
        return logging.DEBUG if retriable else logging.WARNING
