"""Handing messages to the listener (RocketMQ's ``ConsumeMessageConcurrentlyService``).

A thread pool of ``consume_threads`` runs the listener. As in RocketMQ, every
batch of a queue may go to the pool: a queue gets as many consume tasks as its
ready messages fill batches of ``consume_batch_size``, up to ``consume_threads``,
so one hot queue keeps every thread busy. Each task takes a batch at a time, in
offset order, and keeps going for a short time slice before yielding its thread
so that other queues get their turn. Batches of one queue thus run side by side
and finish in any order: the ProcessQueue keeps every message not yet done, and
the offset committed is the lowest of them, never past an unfinished message;
pulling a queue pauses past its thresholds (messages, bytes, and the span of
offsets buffered, RocketMQ's ``consumeConcurrentlyMaxSpan``).

Outcomes: SUCCESS forgets the batch (its offsets may be committed). Anything
else (RECONSUME_LATER, an exception, a call that ran past
``consume_timeout_s``) sends the batch back to the broker in CLUSTERING (the
retry topic redelivers it later; until the broker acknowledges, the messages
hold the committed offset back) and retries it locally in BROADCASTING, up to
``max_reconsume_times``. A watchdog takes a batch away from a listener stuck
past ``consume_timeout_s`` and lets its queue go on.

With ``consume_on_io_thread``, the first batch of records that arrive on the client's
I/O thread is consumed there, as they arrive, with no task handed to the pool: the
same bookkeeping (the batch counts as a task of its queue), the same outcomes; what
else is ready then goes to the pool.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from actors.client.push.config import ConsumeStatus
from actors.client.push.consume_pool import ConsumePool
from actors.client.push.context import ConsumeContext
from actors.client.push.dedup import DedupWindow
from actors.client.push.process_queue import (
    CONSUME_CONCURRENTLY_MAX_SPAN,
    Inflight,
    ProcessQueue,
    PullState,
)
from actors.protocol.connection import IOLoop
from actors.protocol.topic import origin_topic
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.push_consumer")

TIME_SLICE_S = 0.05


def replaced(m: MessageExt, **changes: Any) -> MessageExt:
    """A copy of ``m`` with some fields changed (works whether MessageExt is a named
    tuple or a slotted class)."""
    replace = getattr(m, "_replace", None)
    if replace is not None:
        return replace(**changes)  # type: ignore[no-any-return]
    out = copy.copy(m)
    for name, value in changes.items():
        setattr(out, name, value)
    return out


class ConsumeMessageService:
    def __init__(self, consumer: ConsumeContext) -> None:
        self.c = consumer
        cfg = consumer.config
        self._pool = ConsumePool(cfg.consume_threads, f"raymq-consume-{consumer.group}")
        self._stopping = False
        self._running = 0
        self._running_lock = threading.Lock()
        # shutdown's wait for the running tasks; a task's end wakes it only while it waits
        self._idle = threading.Condition(self._running_lock)
        self._idle_waiters = 0
        self._inline = cfg.consume_on_io_thread  # one batch per arrival on the I/O thread
        self._max_buffer = cfg.pull_threshold_for_queue
        self._max_bytes = cfg.pull_threshold_size_for_queue_mib << 20
        self._warned_status = False
        self._dedup = (
            DedupWindow(cfg.dedup_window_s, cfg.dedup_max_ids) if cfg.dedup_window_s else None
        )

    # ------------------------------------------------------------ dispatch
    def _max_tasks(self) -> int:
        """How many consume tasks one queue may run at once."""
        return self.c.config.consume_threads

    def _max_span(self) -> int | None:
        """The span of buffered offsets past which pulling a queue pauses."""
        return CONSUME_CONCURRENTLY_MAX_SPAN

    def dispatch(self, pq: ProcessQueue) -> None:
        """Start consume tasks for ``pq``: one per batch its ready messages fill that no
        task is about to take, within :meth:`_max_tasks`. With ``consume_on_io_thread``,
        called on the client's I/O thread, the first of them runs here and now."""
        self._dispatch(pq, self._inline and IOLoop.on_loop_thread())

    def _dispatch(self, pq: ProcessQueue, here: bool) -> None:
        size = self.c.config.consume_batch_size
        with pq.lock:
            if pq.dropped or not pq.ready or self._stopping or self._held(pq):
                return
            wanted = -(-len(pq.ready) // size) - pq.takers
            n = min(wanted, self._max_tasks() - pq.tasks)
            if n <= 0:
                return
            pq.tasks_started(n)
        with self._running_lock:
            self._running += n
        if here:  # the first batch here and now; the pool's tasks, counted, start after it
            n -= 1
            self._run(pq, once=True)
        for submitted in range(n):
            try:
                self._pool.submit(self._run, pq)
            except RuntimeError:  # the pool shut down under us
                with pq.lock:
                    for _ in range(n - submitted):
                        pq.takers -= 1
                        pq.task_ended()
                for _ in range(n - submitted):
                    self._task_done()
                return

    def _held(self, pq: ProcessQueue) -> bool:
        """True while ``pq`` must not start a batch for a reason of the subclass's."""
        return False

    def _task_done(self) -> None:
        with self._running_lock:
            self._running -= 1
            if not self._running and self._idle_waiters:
                self._idle.notify_all()

    def _run(self, pq: ProcessQueue, once: bool = False) -> None:
        """A consume task of ``pq``: its batches for a time slice (``once``: one batch),
        then what is still ready to the pool."""
        with pq.lock:
            pq.takers -= 1
        owned = True
        try:
            owned = self._consume(pq, once)
        except Exception:  # noqa: BLE001 - the queue must not stay busy forever
            log.exception("consume task of %s failed", pq)
        finally:
            if owned:
                with pq.lock:
                    pq.task_ended()
            self._task_done()
        self._dispatch(pq, False)

    def _consume(self, pq: ProcessQueue, once: bool = False) -> bool:
        """Run batches of ``pq`` until none is ready or the time slice is over (``once``:
        after one batch); False when the task ended without the queue (see
        :meth:`_batch_done`)."""
        size = self.c.config.consume_batch_size
        slice_end = time.monotonic() + TIME_SLICE_S
        while True:
            with pq.lock:
                if pq.dropped or not pq.ready or self._stopping or self._held(pq):
                    return True
                ready = pq.ready
                batch = [ready.popleft() for _ in range(min(size, len(ready)))]
                inflight = Inflight(batch)
                pq.inflight.add(inflight)
            ended = self._batch_done(pq, batch, inflight, self._call_listener(pq, batch))
            if ended is not None:
                return ended
            if once or time.monotonic() > slice_end:
                return True

    def _batch_done(
        self, pq: ProcessQueue, batch: list[MessageExt], inflight: Inflight, ok: bool
    ) -> bool | None:
        """After the listener answered ``ok`` for ``batch``: None when the task goes on
        with the next batch; else it ends, True with the queue still its own, False
        when the watchdog took the batch (and ended the task for it)."""
        with pq.lock:
            if inflight.abandoned:  # the watchdog settled it and ended this task
                return False
            pq.inflight.discard(inflight)
        self.settle(pq, batch, ok)
        return None

    def _call_listener(self, pq: ProcessQueue, batch: list[MessageExt]) -> bool:
        dedup = self._dedup
        if dedup is not None:  # redeliveries acknowledged a moment ago: consumed already
            fresh = [m for m in batch if not dedup.seen(m.msg_id)]
            if len(fresh) < len(batch):
                self.c.stats.add("deduplicated", len(batch) - len(fresh))
                if not fresh:
                    return True
                batch = fresh
        if pq.retry:  # listeners see the topic the message was first sent to
            views = [replaced(m, topic=origin_topic(m)) for m in batch]
        else:
            views = list(batch)
        listener = self.c.listener
        assert listener is not None  # start() checks it
        started = time.monotonic()
        try:
            status = listener(views)
        except Exception as exc:  # noqa: BLE001 - an exception means RECONSUME_LATER
            self.c.stats.add("listener_errors")
            log.warning(
                "group %s: listener raised %s: %s (%d message(s) will be retried)",
                self.c.group,
                type(exc).__name__,
                exc,
                len(batch),
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            return False
        if time.monotonic() - started > self.c.config.consume_timeout_s:
            log.warning(
                "group %s: listener took %.1fs, over consume_timeout_s=%s: retrying the batch",
                self.c.group,
                time.monotonic() - started,
                self.c.config.consume_timeout_s,
            )
            return False
        if status is ConsumeStatus.SUCCESS:
            if dedup is not None:
                dedup.acked(m.msg_id for m in batch)
            return True
        if status is not ConsumeStatus.RECONSUME_LATER and not self._warned_status:
            self._warned_status = True
            log.warning(
                "group %s: listener returned %r, not a ConsumeStatus: treated as RECONSUME_LATER",
                self.c.group,
                status,
            )
        return False

    # ------------------------------------------------------------ outcomes
    def settle(self, pq: ProcessQueue, batch: Sequence[MessageExt], ok: bool) -> None:
        if ok:
            self.c.stats.add("consumed", len(batch))
            self.forget(pq, batch)
            return
        self.c.stats.add("reconsume_later", len(batch))
        if self.c.config.clustering:
            self.c.send_back.submit(pq, batch)
        else:
            self._retry_broadcast(pq, batch)

    def forget(self, pq: ProcessQueue, batch: Sequence[MessageExt]) -> None:
        """The batch is done with (consumed, or handed to the broker): release its offsets
        and resume pulling a paused queue that is back under its threshold."""
        with pq.lock:
            pq.remove(batch)
            resume = pq.state is PullState.PAUSED and not pq.over_threshold(
                self._max_buffer, self._max_bytes, self._max_span()
            )
        if resume:
            self.c.pull.request(pq)

    def retry_locally(self, pq: ProcessQueue, batch: Sequence[MessageExt], delay_s: float) -> None:
        """Consume ``batch`` again after ``delay_s`` (its offsets stay held meanwhile)."""
        self.c.stats.add("local_retries", len(batch))
        self.c.scheduler.call_later(delay_s, self._requeue, pq, list(batch))

    def _requeue(self, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        with pq.lock:
            if pq.dropped:
                return
            for m in batch:
                if m.queue_offset in pq.msgs:
                    pq.msgs[m.queue_offset] = m
                    pq.ready.append(m)
        self.dispatch(pq)

    def _retry_broadcast(self, pq: ProcessQueue, batch: Sequence[MessageExt]) -> None:
        """Broadcasting has no retry topic: retry here, give up (logged) past the limit."""
        limit = self.c.config.max_reconsume_times
        again = [replaced(m, reconsume_times=m.reconsume_times + 1) for m in batch]
        give_up = [m for m in again if m.reconsume_times > limit]
        if give_up:
            self.c.stats.add("given_up", len(give_up))
            log.error(
                "group %s (BROADCASTING): %d message(s) failed %d times and are dropped: %s",
                self.c.group,
                len(give_up),
                limit + 1,
                [m.msg_id for m in give_up[:10]],
            )
            self.forget(pq, give_up)
        rest = [m for m in again if m.reconsume_times <= limit]
        if rest:
            self.retry_locally(pq, rest, self.c.config.local_retry_delay_s)

    # ------------------------------------------------------------ watchdog and stop
    def check_timeouts(self, now: float) -> None:
        """Take batches away from listeners stuck past ``consume_timeout_s``."""
        limit = self.c.config.consume_timeout_s
        for pq in self.c.process_queues():
            with pq.lock:
                stuck = [i for i in pq.inflight if now - i.started > limit]
                for inflight in stuck:
                    inflight.abandoned = True
                    pq.inflight.discard(inflight)
                    pq.task_ended()  # its thread stays with the listener; the queue goes on
            for inflight in stuck:
                log.warning(
                    "group %s: listener stuck for over %ss on %s: retrying its batch of %d",
                    self.c.group,
                    limit,
                    pq,
                    len(inflight.batch),
                )
                self.c.stats.add("consume_timeouts", len(inflight.batch))
                self.settle(pq, inflight.batch, ok=False)
            if stuck:
                self.dispatch(pq)

    def shutdown(self, timeout_s: float) -> bool:
        """Start no new batch; wait up to ``timeout_s`` for the running ones."""
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        with self._idle:
            self._idle_waiters += 1
            while self._running and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            self._idle_waiters -= 1
            clean = not self._running
        self._pool.shutdown()
        if not clean:
            log.warning(
                "group %s: %d consume task(s) still running after %ss",
                self.c.group,
                self._running,
                timeout_s,
            )
        return clean
