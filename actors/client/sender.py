"""Sending encoded chunks with retries, waited on (sync) or answered through futures (async).

Each chunk goes to the queue the :class:`~actors.client.queue_selector.QueueSelector`
picks, as one call through the :class:`~actors.client.transport.Transport`. What
holds for every send:

* A send that failed on the way (Ray could not deliver or answer it, no live
  broker: ``actors.protocol.rpc.send_may_retry``) is retried on another broker
  with the route re-read (``retry_times_when_send_failed``, default 2, for sync
  sends; ``retry_times_when_send_async_failed`` for async ones); the failed broker
  is held unavailable by the latency fault tolerance for a while. A send the
  broker refused for what it carries raises at once and is never retried. An
  idempotent producer's chunk that may be stored is sent again only as it was, to
  its own queue (:class:`~actors.client.send_outcome.Outcome`); without idempotence
  a retry after a timeout may store a message twice (at least once, as in RocketMQ).
* Every answer's latency is reported to the fault tolerance, so slow brokers are
  avoided too.
* Sync (:meth:`Sender.send_chunks`): the chunks are in flight together, but only
  one per queue, so chunks to the same queue are stored in the caller's order.
* Async (:meth:`Sender.send_chunks_async`, :mod:`.send_async`): chunks go through
  the per-broker send lanes, answered through a future.

The steps both share (binding a chunk to its queue, the call, the fault tolerance's
reports) are :class:`~actors.client.send_core.SenderCore`'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from actors.client.send_async import AsyncSending
from actors.client.send_outcome import Outcome, Pinned, Sent, backoff, may_retry, stored_before
from actors.client.send_result import BatchSendResult, _Chunk
from actors.client.transport import Reply
from actors.protocol import rpc as _rpc
from actors.protocol.connection import IOLoop
from actors.protocol.wire import SendAck
from rebalance import MessageQueue
from storage.errors import (
    BrokerUnavailableError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
)

log = logging.getLogger("raymq.actors.producer")


class Sender(AsyncSending):
    """Sends chunks, sync or async, with retries on another broker; see the module doc."""

    def send_chunks(
        self,
        chunks: list[_Chunk],
        total: int,
        sharding_key: str | None,
        timeout_s: float | None,
    ) -> BatchSendResult:
        """Send ``chunks`` (``total`` messages) and wait for every answer. Refused on the
        client's I/O thread, which reads the answers: it could only wait out the timeout
        (and, idempotent, ``delivery_timeout_s``) with every connection stalled."""
        if IOLoop.on_loop_thread():
            raise RuntimeError(
                "a synchronous send waits for its answer, which the client's I/O thread "
                "reads, and this is that thread (a listener with consume_on_io_thread, or "
                "a send_async future's callback): use send_async here"
            )
        selector = self.selector
        for topic in {c.topic for c in chunks}:  # route errors before anything is sent
            selector.write_queues(selector.route(topic)[0])
        timeout = timeout_s or self.config.send_timeout_s
        parts: list[Any] = [None] * len(chunks)
        # one chunk in flight per queue, so chunks to the same queue are stored in order
        inflight: dict[MessageQueue, tuple[int, Reply, float, Pinned]] = {}
        for i, chunk in enumerate(chunks):
            try:
                mq, route, auto_n = selector.select(chunk.topic, None, sharding_key)
            except Exception as exc:  # noqa: BLE001 - retried in _finish
                if not _rpc.is_retriable(exc):
                    raise
                parts[i] = self._finish(chunk, None, exc, timeout, sharding_key)
                continue
            prev = inflight.pop(mq, None)
            if prev is not None:
                j, *sent = prev
                parts[j] = self._finish(chunks[j], mq, tuple(sent), timeout, sharding_key)
            try:
                inflight[mq] = (i, *self._send(chunk, mq, route, auto_n))
            except Exception as exc:  # noqa: BLE001
                if not _rpc.send_may_retry(exc):
                    raise
                parts[i] = self._finish(chunk, mq, exc, timeout, sharding_key)
        for mq, (j, *sent) in inflight.items():
            parts[j] = self._finish(chunks[j], mq, tuple(sent), timeout, sharding_key)
        return BatchSendResult(parts, total)

    def _finish(
        self,
        chunk: _Chunk,
        mq: MessageQueue | None,
        first: tuple[Any, ...] | BaseException,
        timeout: float,
        sharding_key: str | None,
    ) -> Sent:
        """Wait for a submitted chunk (``first`` is its ref, start time and numbered run,
        or the error that kept it from being sent); when it failed on the way, send it
        again: to another broker, or, when it may be stored, as it was to the same queue
        until ``delivery_timeout_s`` (see :class:`Outcome`)."""
        retries = self.config.retry_times_when_send_failed
        ref: Reply | None = None
        started = 0.0
        run = Outcome(self.sequencer)
        if isinstance(first, BaseException):
            run.last_exc = first
        else:
            ref, started, run.bound = first
        deadline = time.monotonic() + max(timeout, self.config.delivery_timeout_s)
        attempt = 0
        while True:
            reordered = False  # refused for the order of runs: not a failed attempt
            if ref is None and run.pinned:
                assert mq is not None and run.bound is not None
                try:
                    ref, started = self._resend(chunk, mq, run.bound), time.monotonic()
                except Exception as exc:  # noqa: BLE001
                    if not may_retry(exc):
                        run.give_up(mq)
                        raise
                    run.last_exc = exc
            elif ref is None:
                avoid = mq.broker_name if mq is not None and sharding_key is None else None
                try:
                    mq, ref, started, run.bound = self._submit(
                        chunk, avoid, sharding_key, refresh=True
                    )
                except Exception as exc:  # noqa: BLE001
                    if not _rpc.send_may_retry(exc):
                        raise
                    run.last_exc = exc
            if ref is not None:
                assert mq is not None
                ack: SendAck | None = None
                try:
                    ack = SendAck.from_wire(_rpc.get(ref, timeout))
                except DuplicateSequenceError:  # stored long ago: offsets no longer known
                    ack = stored_before(mq, len(chunk.batch))
                except Exception as exc:  # noqa: BLE001
                    ref = None
                    if not run.failed(exc, mq):
                        if run.stored is not None:  # stored already: that answer stands
                            return (chunk, *run.stored)
                        raise
                    reordered = isinstance(exc, OutOfOrderSequenceError)
                    if run.moved:  # a broker's trouble, not the order of runs
                        self.fault.update(
                            mq.broker_name,
                            timeout,
                            failed=True,
                            master=self.selector.master_of(chunk.topic, mq.broker_name),
                        )
                        self.selector.invalidate(chunk.topic)
                    log.warning(
                        "send to %s failed (%s); attempt %d %s",
                        mq,
                        type(exc).__name__,
                        attempt + 1,
                        "(it may be stored: again to the same queue, for up to "
                        f"delivery_timeout_s={self.config.delivery_timeout_s})"
                        if run.maybe_stored
                        else f"of {retries + 1}",
                    )
                if ack is not None and attempt < retries and run.not_durable(ack, mq):
                    log.info("send to %s stored, %s: again, as it is", mq, ack.status.value)
                    ref, ack = None, None
                if ack is not None:
                    run.settle(mq)
                    self._answered_in(chunk, mq, time.monotonic() - started)
                    return chunk, mq, ack
            attempt, again = run.next_attempt(attempt, retries, reordered, deadline)
            if not again:
                break
            if run.pinned:
                time.sleep(backoff(attempt))  # a failover, or the run before it, to come
        run.give_up(mq)
        if run.stored is not None:  # stored, not as durably as asked: that answer stands
            return (chunk, *run.stored)
        last_exc = run.last_exc
        raise BrokerUnavailableError(
            f"send of {len(chunk.batch)} message(s) to topic {chunk.topic!r} failed after "
            f"{attempt} attempt(s): {type(last_exc).__name__}: {last_exc}"
            + (" (it may have been stored, once)" if run.maybe_stored else "")
        ) from last_exc
