"""The push consumer's pulling (RocketMQ's ``PullMessageService``).

One thread drives every assigned queue: it keeps one long-polling pull in
flight per queue and is woken by an event queue, never by polling: a pull's
answer arrives through its ObjectRef's future, a rebalance or a consume task
asks for a pull by putting an event. A queue whose buffer passes the
threshold (``pull_threshold_for_queue`` messages or
``pull_threshold_size_for_queue_mib``) is paused until consumption brings it
back under; a failed pull is retried after ``pull_retry_delay_s``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from storage.errors import RayMQError

from . import _rpc
from ._push_process_queue import ProcessQueue, PullState
from .consumer import PullResult, PullStatus
from .protocol import pull_from_wire

if TYPE_CHECKING:
    from .push_consumer import PushConsumer

log = logging.getLogger("raymq.actors.push_consumer")

_PULL, _RETRY, _DONE, _EXPIRE = range(4)
_SPIN_GUARD_S = 0.1  # a pull that comes back empty this fast was not held: wait a little


class PullMessageService:
    def __init__(self, consumer: PushConsumer) -> None:
        self.c = consumer
        cfg = consumer.config
        self._events: queue.SimpleQueue[tuple[int, ProcessQueue, Any] | None] = queue.SimpleQueue()
        self._stopped = False
        self._max_buffer = cfg.pull_threshold_for_queue
        self._max_bytes = cfg.pull_threshold_size_for_queue_mib << 20
        self._thread = threading.Thread(
            target=self._loop, name=f"raymq-pull-{consumer.group}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._events.put(None)
        self._thread.join(timeout=10.0)

    def request(self, pq: ProcessQueue) -> None:
        """Pull ``pq`` now if it is idle or paused (any thread)."""
        self._events.put((_PULL, pq, None))

    def check_stuck(self, now: float) -> None:
        """Give up pulls that outlived the long-polling time plus the timeout."""
        limit = self.c.config.pull_suspend_s + self.c.config.pull_timeout_s
        for pq in self.c.process_queues():
            if pq.state is PullState.PULLING and now - pq.pull_started > limit:
                self._events.put((_EXPIRE, pq, pq.pull_gen))

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            ev = self._events.get()
            if ev is None or self._stopped:
                return
            kind, pq, payload = ev
            try:
                if kind == _DONE:
                    self._on_done(pq, *payload)
                elif kind == _PULL:
                    self._issue(pq, (PullState.IDLE, PullState.PAUSED))
                elif kind == _RETRY:
                    self._issue(pq, (PullState.WAITING,))
                elif kind == _EXPIRE:
                    with pq.lock:
                        if pq.pull_gen != payload or pq.state is not PullState.PULLING:
                            continue
                        pq.state = PullState.IDLE
                        pq.pull_gen += 1
                    log.warning("%s: a pull got no answer in time; pulling again", pq)
                    self._issue(pq, (PullState.IDLE,))
            except Exception:  # noqa: BLE001 - keep pulling the other queues
                log.exception("pull service: handling %s of %s failed", kind, pq)
                self._retry_later(pq, None)

    def _issue(self, pq: ProcessQueue, from_states: tuple[PullState, ...]) -> None:
        c = self.c
        with pq.lock:
            if pq.dropped or self._stopped or pq.state not in from_states:
                return
            if pq.over_threshold(self._max_buffer, self._max_bytes):
                if pq.state is not PullState.PAUSED:
                    c.stats.add("flow_control_pauses")
                pq.state = PullState.PAUSED
                return
            pq.state = PullState.PULLING
            pq.pull_gen += 1
            gen, offset = pq.pull_gen, pq.next_offset
        mq = pq.mq
        expression, tags = c.subscription_of(mq.topic)
        try:
            ref = c.broker_for(mq).pull.remote(
                c.group,
                mq.topic,
                mq.queue_id,
                offset,
                c.config.pull_batch_size,
                None if tags is None else expression,
                c.config.pull_suspend_s,
                c.client_id,
            )
        except Exception as exc:  # noqa: BLE001 - no route or handle now
            self._failed(pq, gen, exc)
            return
        pq.pull_started = time.monotonic()
        c.stats.add("pulls")
        ref.future().add_done_callback(
            lambda fut, pq=pq, gen=gen: self._events.put((_DONE, pq, (gen, fut)))
        )

    def _on_done(self, pq: ProcessQueue, gen: int, fut: Future[Any]) -> None:
        with pq.lock:
            if pq.dropped or gen != pq.pull_gen or pq.state is not PullState.PULLING:
                return
        try:
            raw = pull_from_wire(fut.result())
        except Exception as exc:  # noqa: BLE001
            self._failed(pq, gen, _rpc.cause_of(exc))
            return
        _, tags = self.c.subscription_of(pq.mq.topic)
        result = PullResult(pq.mq, raw, tags, self.c.config.check_crc)
        status = result.status
        messages = result.messages if status is PullStatus.FOUND else []
        elapsed = time.monotonic() - pq.pull_started
        added = 0
        with pq.lock:
            if pq.dropped or gen != pq.pull_gen:
                return
            pq.state = PullState.IDLE
            pq.last_pull = time.monotonic()
            if status is PullStatus.FOUND:
                added = pq.add(messages, result.next_offset)
            elif status is PullStatus.NO_MATCHED_MSG:
                pq.next_offset = max(pq.next_offset, result.next_offset)
            elif status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "%s: offset %d is illegal (queue holds [%d, %d]); going on from %d",
                    pq,
                    pq.next_offset,
                    result.min_offset,
                    result.max_offset,
                    result.next_offset,
                )
                pq.next_offset = result.next_offset
        if added:
            self.c.stats.add("pulled", added)
            self.c.consume.dispatch(pq)
        if status is PullStatus.NO_NEW_MSG and elapsed < _SPIN_GUARD_S:
            with pq.lock:
                if pq.state is PullState.IDLE:
                    pq.state = PullState.WAITING
            self.c.scheduler.call_later(_SPIN_GUARD_S, self._events.put, (_RETRY, pq, None))
            return
        self._issue(pq, (PullState.IDLE,))

    def _failed(self, pq: ProcessQueue, gen: int, exc: BaseException) -> None:
        c = self.c
        c.stats.add("pull_errors")
        if _rpc.is_retriable(exc):
            c.forget_route(pq.mq.topic, pq.mq.broker_name)
        elif not isinstance(exc, RayMQError):
            c.forget_route(pq.mq.topic)
        log.log(
            logging.DEBUG if _rpc.is_retriable(exc) else logging.WARNING,
            "%s: pull failed (%s: %s); again in %.1fs",
            pq,
            type(exc).__name__,
            exc,
            c.config.pull_retry_delay_s,
        )
        with pq.lock:
            if pq.dropped or gen != pq.pull_gen:
                return
        self._retry_later(pq, gen)

    def _retry_later(self, pq: ProcessQueue, gen: int | None) -> None:
        with pq.lock:
            if pq.dropped or (gen is not None and gen != pq.pull_gen):
                return
            pq.state = PullState.WAITING
        self.c.scheduler.call_later(
            self.c.config.pull_retry_delay_s, self._events.put, (_RETRY, pq, None)
        )
