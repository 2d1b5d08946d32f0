"""An idempotent producer's numbering: a producer id, an epoch, a sequence per queue.

With ``ProducerConfig.enable_idempotence`` (the default) every chunk is bound to its
queue with the next sequence numbers of that queue (``EncodedBatch.with_sequence``),
and the broker stores a run of sequences once however often it arrives
(``storage.producer_state``). What the :class:`~actors.client.sender.Sender` does
with it:

* a bound chunk that may have reached its broker is only ever sent again, as the
  same bytes, to the same queue (its broker group's master of the moment, which
  after a failover is the promoted slave): never to another broker, where it would
  be stored a second time;
* a bound chunk that was certainly not sent (the call could not be made) gives its
  sequences back (:meth:`Sequencer.release`) and may go elsewhere;
* a bound chunk the broker refused (it answered with an error: a broker raises before
  it writes) was not stored either, unless an earlier attempt may have been;
* a bound chunk given up after it may have been sent leaves a gap the broker
  would wait for forever: the producer starts a new epoch (:meth:`abandon`), its
  queues numbered from 0 again, as Kafka's producer bumps its epoch. So does a gap
  the broker reports when nothing before it is still on its way
  (:meth:`gap_is_final`: an answered write a failover cut off, FLUSH_SLAVE_TIMEOUT).

The id comes from a broker (``Broker.allocate_producer_id``, one Ray call at the
first send), unique in the cluster and never handed out twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from actors.protocol.route import TopicRouteData
from rebalance import MessageQueue
from storage.codec import EncodedBatch

log = logging.getLogger("raymq.actors.producer")


class Sequencer:
    """See the module doc. Thread-safe."""

    def __init__(self, allocate: Callable[[TopicRouteData, str], str]) -> None:
        self._allocate = allocate  # a producer id from a broker (by name) of a route
        self._lock = threading.Lock()
        self.producer_id: str | None = None
        self.epoch = 0
        self._next: dict[tuple[str, str, int], int] = {}
        # runs of this epoch bound and not yet settled, per queue: their first sequences
        self._open: dict[tuple[str, str, int], set[int]] = {}

    def bind(self, batch: EncodedBatch, mq: MessageQueue, route: TopicRouteData) -> EncodedBatch:
        """``batch`` bound for ``mq`` (of ``route``) with that queue's next sequences."""
        with self._lock:
            if self.producer_id is None:  # the first send: one Ray call
                self.producer_id = self._allocate(route, mq.broker_name)
                log.info("idempotent producer id %s", self.producer_id)
            key = (mq.topic, mq.broker_name, mq.queue_id)
            seq = self._next.get(key, 0)
            self._next[key] = seq + len(batch)
            self._open.setdefault(key, set()).add(seq)
            pid, epoch = self.producer_id, self.epoch
        return batch.with_sequence(pid, epoch, seq, mq.queue_id)

    def settle(self, bound: EncodedBatch, mq: MessageQueue) -> None:
        """``bound`` is over: answered, or given up."""
        with self._lock:
            self._settle(bound, mq)

    def _settle(self, bound: EncodedBatch, mq: MessageQueue) -> None:
        if bound.producer_epoch == self.epoch and bound.seq_runs is not None:
            self._open.get((mq.topic, mq.broker_name, mq.queue_id), set()).discard(
                int(bound.seq_runs[0, 1])
            )

    def gap_is_final(self, bound: EncodedBatch, mq: MessageQueue) -> bool:
        """The broker refused ``bound`` for a gap before it (OutOfOrderSequenceError) and
        no run before it on its queue is still on its way: what is missing was answered
        and then lost (an uncommitted write cut off by a failover) or never stored, and
        will not come. A new epoch begins, so the caller numbers ``bound`` anew."""
        assert bound.seq_runs is not None
        seq = int(bound.seq_runs[0, 1])
        with self._lock:
            if bound.producer_epoch != self.epoch:
                return True  # the epoch is over already
            key = (mq.topic, mq.broker_name, mq.queue_id)
            if any(s < seq for s in self._open.get(key, ())):
                return False
            self._new_epoch(f"sequences before {seq} on {mq} will not arrive")
            return True

    def release(self, bound: EncodedBatch, mq: MessageQueue) -> None:
        """``bound`` was never sent: its sequences are free again (or, when later ones
        were handed out meanwhile, a new epoch begins)."""
        assert bound.seq_runs is not None
        with self._lock:
            if bound.producer_epoch != self.epoch:
                return
            key = (mq.topic, mq.broker_name, mq.queue_id)
            seq = int(bound.seq_runs[0, 1])
            self._settle(bound, mq)
            if self._next.get(key) == seq + len(bound):
                self._next[key] = seq
            else:
                self._new_epoch(f"sequences {seq}.. of {mq} were never sent")

    def abandon(self, bound: EncodedBatch, mq: MessageQueue) -> None:
        """``bound`` may have been sent and will not be sent again."""
        with self._lock:
            if bound.producer_epoch == self.epoch:
                self._settle(bound, mq)
                self._new_epoch(f"a send to {mq} was given up")

    def _new_epoch(self, why: str) -> None:
        self.epoch += 1
        self._next.clear()
        self._open.clear()
        log.warning("producer %s: %s: epoch %d begins", self.producer_id, why, self.epoch)
