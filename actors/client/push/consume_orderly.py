"""Orderly consumption (RocketMQ's ``ConsumeMessageOrderlyService``).

Chosen with ``PushConsumerConfig(orderly=True)``. Invariants, per queue:

* the listener gets the queue's messages one batch at a time, never two batches
  at once, in queue-offset order (the pool runs queues in parallel, but each
  queue gets one consume task at a time, where the concurrent service gives a
  queue up to ``consume_threads``);
* a failed batch (RECONSUME_LATER, an exception, a call longer than
  ``consume_timeout_s``) goes back to the front of the queue with its
  ``reconsume_times`` counted up, and the whole queue is suspended for
  ``suspend_current_queue_time_s``: no later message overtakes it. A message that
  fails with ``reconsume_times >= max_reconsume_times`` goes to ``%DLQ%<group>``
  (CLUSTERING; BROADCASTING has none: it is dropped, logged) and the queue moves on.
  Until then it stays in the ProcessQueue, so the committed offset never passes it;
* once a ProcessQueue is dropped no new batch starts; the one running finishes
  (the rebalance waits for it with ``ProcessQueue.wait_idle`` before it commits
  and lets the queue go), so a queue is never consumed by two owners at once
  when the group's coordinator hands it over (unless a batch outlives the
  bound a coordinated revoke waits, see ``coordinated``; and not with
  ``coordinated=False``, where members rebalance on their own).

Unlike the concurrent service, no watchdog takes a batch from a stuck listener:
that would let the next batch run beside it. A call past ``consume_timeout_s``
is logged, and counted as failed when it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from actors.client.push.consume_concurrently import ConsumeMessageService, replaced
from actors.client.push.context import ConsumeContext
from actors.client.push.process_queue import Inflight, ProcessQueue
from actors.protocol import rpc as _rpc
from actors.protocol.wire import SENT_TO_DLQ, SENT_TO_RETRY
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.push_orderly")

DLQ_CALL_TIMEOUT_S = 10.0


class ConsumeMessageOrderlyService(ConsumeMessageService):
    """One consume task per queue at a time; failures retried in place after a pause."""

    def __init__(self, consumer: ConsumeContext) -> None:
        super().__init__(consumer)
        self._suspend_s = float(consumer.config.suspend_current_queue_time_s)
        self._suspended: set[ProcessQueue] = set()  # each entry changed under its pq.lock
        self._slow_warned: set[int] = set()
        cfg = consumer.config
        if cfg.clustering and not getattr(cfg, "coordinated", True):
            log.warning(
                "group %s: orderly without the group's coordinator: each queue is consumed in "
                "order here, but while the members' views differ two may consume one queue",
                consumer.group,
            )

    # ------------------------------------------------------------ dispatch
    def _max_tasks(self) -> int:
        return 1  # one batch of a queue at a time: the listener sees it in order

    def _max_span(self) -> int | None:
        return None  # consumed in order: the span never outgrows the buffer

    def _held(self, pq: ProcessQueue) -> bool:
        return pq in self._suspended  # a failed batch waits out its suspension first

    def _batch_done(
        self, pq: ProcessQueue, batch: list[MessageExt], inflight: Inflight, ok: bool
    ) -> bool | None:
        if ok:
            self.c.stats.add("consumed", len(batch))
            self.forget(pq, batch)  # before the queue counts as idle: commit sees it
            with pq.lock:
                pq.inflight.discard(inflight)
            return None
        if not self._failed(pq, inflight):
            return True  # suspended (or dropped): the task ends, the queue waits
        return None

    # ------------------------------------------------------------ failures
    def _failed(self, pq: ProcessQueue, inflight: Inflight) -> bool:
        """Handle a failed batch; True when the queue goes on at once (every message of
        the batch is dead-lettered), False when it is suspended or was dropped."""
        batch = inflight.batch
        self.c.stats.add("reconsume_later", len(batch))
        limit = self.c.config.max_reconsume_times
        dead = [m for m in batch if m.reconsume_times >= limit]
        if dead and not self._dead_letter(pq, dead):
            dead = []  # not stored anywhere: consumed again, counted once more
        done = {m.queue_offset for m in dead}
        if done:
            self.forget(pq, dead)
        again = [
            replaced(m, reconsume_times=m.reconsume_times + 1)
            for m in batch
            if m.queue_offset not in done
        ]
        with pq.lock:
            pq.inflight.discard(inflight)
            if not again:
                return True
            if pq.dropped:  # the next owner starts from the committed offset: before these
                return False
            for m in reversed(again):
                if m.queue_offset in pq.msgs:
                    pq.msgs[m.queue_offset] = m
                    pq.ready.appendleft(m)
            self._suspended.add(pq)
        self.c.stats.add("suspended")
        log.info(
            "group %s: %s suspended for %.2fs: %d message(s) failed (reconsume times %d)",
            self.c.group,
            pq,
            self._suspend_s,
            len(again),
            again[0].reconsume_times,
        )
        self.c.scheduler.call_later(self._suspend_s, self._resume, pq)
        return False

    def _resume(self, pq: ProcessQueue) -> None:
        with pq.lock:
            self._suspended.discard(pq)
        self.dispatch(pq)

    def _dead_letter(self, pq: ProcessQueue, dead: Sequence[MessageExt]) -> bool:
        """Past ``max_reconsume_times``: store ``dead`` in ``%DLQ%<group>`` (CLUSTERING) or
        give them up, logged (BROADCASTING); False when the broker did not take them."""
        c = self.c
        if not c.config.clustering:
            c.stats.add("given_up", len(dead))
            log.error(
                "group %s (BROADCASTING, orderly): %d message(s) of %s failed %d times and "
                "are dropped: %s",
                c.group,
                len(dead),
                pq,
                c.config.max_reconsume_times + 1,
                [m.msg_id for m in dead[:10]],
            )
            return True
        try:
            ref = c.broker_for(pq.mq).consumer_send_msg_back.remote(
                c.group,
                [m.commitlog_offset for m in dead],
                c.config.max_reconsume_times,
                [m.reconsume_times for m in dead],
            )
            outcome = _rpc.get(ref, DLQ_CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - consumed again after the pause
            if _rpc.is_retriable(exc):
                c.forget_route(pq.mq.topic, pq.mq.broker_name)
            log.warning(
                "group %s: dead-lettering %d message(s) of %s failed (%s: %s); "
                "they will be consumed again",
                c.group,
                len(dead),
                pq,
                type(exc).__name__,
                exc,
            )
            c.stats.add("send_back_failures", len(dead))
            return False
        stored = sum(1 for o in outcome if o in (SENT_TO_DLQ, SENT_TO_RETRY))
        c.stats.add("sent_to_dlq", stored)
        if stored < len(dead):  # the original left the store: nothing can hold it now
            c.stats.add("given_up", len(dead) - stored)
            log.error(
                "group %s: %d message(s) of %s are no longer in the store and could not be "
                "dead-lettered: %s",
                c.group,
                len(dead) - stored,
                pq,
                [m.msg_id for m, o in zip(dead, outcome) if o not in (SENT_TO_DLQ, SENT_TO_RETRY)],
            )
        log.warning(
            "group %s: %d message(s) of %s failed %d times and went to the DLQ; the queue goes on",
            c.group,
            stored,
            pq,
            c.config.max_reconsume_times + 1,
        )
        return True

    # ------------------------------------------------------------ watchdog
    def check_timeouts(self, now: float) -> None:
        """Log listeners running past ``consume_timeout_s``; never take their batch away
        (the queue's next batch would then run beside it)."""
        limit = self.c.config.consume_timeout_s
        for pq in self.c.process_queues():
            with pq.lock:
                slow = [i for i in pq.inflight if now - i.started > limit]
            for inflight in slow:
                if id(inflight) in self._slow_warned:
                    continue
                if len(self._slow_warned) > 1024:
                    self._slow_warned.clear()
                self._slow_warned.add(id(inflight))
                log.warning(
                    "group %s: orderly listener has run %.1fs on %s (consume_timeout_s=%s); "
                    "its batch counts as failed when it returns",
                    self.c.group,
                    now - inflight.started,
                    pq,
                    limit,
                )
