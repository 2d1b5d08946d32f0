"""One assigned queue's buffer on a push consumer (RocketMQ's ``ProcessQueue``).

Invariants, all under ``lock``:

* ``msgs`` holds, in queue-offset order, every pulled message not yet consumed:
  buffered, being consumed, or failed and waiting for its send-back or its
  local retry. A message leaves it only once consumed (SUCCESS) or handed to
  the broker (send-back acknowledged) or given up (broadcasting, past the
  reconsume limit, logged). So :meth:`commit_offset`, the first key of
  ``msgs`` (or the pull position when it is empty), is the lowest offset not
  yet consumed: a slow message holds it back and a restart skips nothing.
* ``ready`` holds the messages to hand to the listener next, in offset order
  (local retries are appended when due). ``tasks`` consume tasks run for the
  queue (``takers`` of them not yet at their first batch), each taking its
  batches from ``ready``, one batch at a time, under ``lock``: the
  concurrent service runs up to ``consume_threads`` of them, so a hot queue's
  batches run side by side (and finish out of order, which ``msgs`` absorbs);
  the orderly service runs one, so its listener sees the queue in offset order.
  ``inflight`` holds the batches in the listener now, for the watchdog.
* :meth:`span` (``next_offset`` minus the first key of ``msgs``) is how far
  pulling ran ahead of the lowest message not yet consumed: a concurrent
  consumer stops pulling a queue past ``CONSUME_CONCURRENTLY_MAX_SPAN``
  (RocketMQ's ``consumeConcurrentlyMaxSpan``), so one stuck message bounds what
  a restart consumes again. RocketMQ measures the buffer's last key instead,
  which lets pulling creep on once the messages after a stuck one are consumed.
* one pull per queue is in flight at a time; ``next_offset`` moves only when a
  pull's answer has been buffered.
* once ``dropped`` is set (under ``lock``) no pull is issued and no consume
  batch starts; ``busy`` means a consume task runs, so after dropping,
  :meth:`wait_idle` returns once the batches in flight are done and the queue
  stays idle (a rebalance then commits and hands the queue over).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from actors.client.pull_consumer import PullResult, PullStatus
from rebalance import MessageQueue
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.push_consumer")


class PullState(enum.Enum):
    IDLE = "IDLE"  # nothing in flight: a pull may be issued
    PULLING = "PULLING"  # a pull is in flight
    WAITING = "WAITING"  # a retry of a failed pull is scheduled
    PAUSED = "PAUSED"  # flow control: the buffer is over its threshold


CONSUME_CONCURRENTLY_MAX_SPAN = 2000
"""RocketMQ's ``consumeConcurrentlyMaxSpan``: a concurrent consumer pauses pulling a
queue that ran this far ahead of its lowest unconsumed message (:meth:`ProcessQueue.span`)."""


@dataclass(eq=False)  # hashed by identity: a queue's set of batches in the listener
class Inflight:
    """A batch a consume task is running, so a watchdog can time it out."""

    batch: list[MessageExt]
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False


class ProcessQueue:
    def __init__(self, mq: MessageQueue, offset: int, *, retry: bool = False) -> None:
        self.mq = mq
        self.retry = retry  # a %RETRY% queue: listeners see the original topic
        self.lock = threading.Lock()
        self.msgs: dict[int, MessageExt] = {}
        self.size_bytes = 0
        self.ready: deque[MessageExt] = deque()
        self.next_offset = offset
        self.state = PullState.IDLE
        self.pull_gen = 0
        self.pull_started = 0.0
        # wait_idle's waiters (rare: a rebalance dropping the queue); a task's end wakes the
        # condition only while one waits, not on every message
        self._idle = threading.Condition(self.lock)
        self._idle_waiters = 0
        self.tasks = 0  # consume tasks submitted for this queue and not yet ended
        self.takers = 0  # of them, those that have not taken their first batch yet
        self.inflight: set[Inflight] = set()
        self.dropped = False
        self.committed = -1  # last offset the offset store acknowledged
        self.last_pull = time.monotonic()

    def __repr__(self) -> str:
        return (
            f"ProcessQueue({self.mq.topic}:{self.mq.broker_name}:{self.mq.queue_id} "
            f"next={self.next_offset} buffered={len(self.msgs)} {self.state.value})"
        )

    # ------------------------------------------------------------ under lock
    def add(self, messages: Iterable[MessageExt], next_offset: int) -> int:
        """Buffer a pull's messages (lock held by the caller); return how many were new."""
        added = 0
        msgs, ready = self.msgs, self.ready
        for m in messages:
            off = m.queue_offset
            if off in msgs or off < self.next_offset:
                continue
            msgs[off] = m
            ready.append(m)
            self.size_bytes += m.store_size
            added += 1
        if next_offset > self.next_offset:
            self.next_offset = next_offset
        return added

    def take_result(self, result: PullResult, messages: Iterable[MessageExt]) -> int:
        """A read of this queue answered (lock held by the caller): its ``messages``
        (``result.messages``, decoded before the lock was taken) buffered, or the offset
        to go on from taken (an illegal offset is logged); return how many were new."""
        status = result.status
        if status is PullStatus.FOUND:
            return self.add(messages, result.next_offset)
        if status is PullStatus.NO_MATCHED_MSG:
            self.next_offset = max(self.next_offset, result.next_offset)
        elif status is PullStatus.OFFSET_ILLEGAL:
            log.warning(
                "%s: offset %d is illegal (queue holds [%d, %d]); going on from %d",
                self,
                self.next_offset,
                result.min_offset,
                result.max_offset,
                result.next_offset,
            )
            self.next_offset = result.next_offset
        return 0

    def remove(self, messages: Iterable[MessageExt]) -> int:
        """Forget consumed messages (lock held by the caller); return how many were here."""
        removed = 0
        msgs = self.msgs
        for m in messages:
            if msgs.pop(m.queue_offset, None) is not None:
                self.size_bytes -= m.store_size
                removed += 1
        return removed

    def span(self) -> int:
        """How far pulling ran ahead of the lowest message not yet consumed (0 when
        every pulled message is done)."""
        for first in self.msgs:
            return self.next_offset - first
        return 0

    def over_threshold(self, count: int, size_bytes: int, max_span: int | None = None) -> bool:
        """Over a flow-control limit: buffered messages, bytes, or (concurrent) span."""
        return (
            len(self.msgs) > count
            or self.size_bytes > size_bytes
            or (max_span is not None and self.span() > max_span)
        )

    # ------------------------------------------------------------ the consume tasks
    def tasks_started(self, n: int) -> None:
        """``n`` consume tasks were submitted for this queue (lock held)."""
        self.tasks += n
        self.takers += n

    def task_ended(self) -> None:
        """A consume task of this queue is over, or was taken from its stuck listener
        (lock held)."""
        self.tasks -= 1
        if not self.tasks and self._idle_waiters:
            self._idle.notify_all()

    @property
    def busy(self) -> bool:
        """A consume task runs for this queue."""
        return self.tasks > 0

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` until no consume task runs; True when idle. Meant for a
        dropped queue, where no new task can start once the running ones end."""
        with self.lock:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(lambda: not self.tasks, timeout)
            finally:
                self._idle_waiters -= 1

    # ------------------------------------------------------------ snapshots
    def commit_offset(self) -> int:
        """The lowest offset not yet consumed."""
        with self.lock:
            for first in self.msgs:
                return first
            return self.next_offset

    @property
    def buffered(self) -> int:
        return len(self.msgs)
