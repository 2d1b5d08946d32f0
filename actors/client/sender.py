"""Sending encoded chunks with retries, waited on (sync) or answered through futures (async).

Each chunk goes to the queue the :class:`~actors.client.queue_selector.QueueSelector`
picks, as one call through the :class:`~actors.client.transport.Transport`. What
holds for every send:

* A send that failed on the way (Ray could not deliver or answer it, no live
  broker: ``actors.protocol.rpc.send_may_retry``) is retried on another broker
  with the route re-read (``retry_times_when_send_failed``, default 2, for sync
  sends; ``retry_times_when_send_async_failed`` for async ones); the failed broker
  is held unavailable by the latency fault tolerance for a while. A send the
  broker refused for what it carries raises at once and is never retried. A
  retry after a timeout may store a message twice: delivery is at least once, as
  in RocketMQ.
* Every answer's latency is reported to the fault tolerance, so slow brokers are
  avoided too.
* Sync (:meth:`Sender.send_chunks`): the chunks are in flight together, but only
  one per queue, so chunks to the same queue are stored in the caller's order.
* Async (:meth:`Sender.send_chunks_async`): chunks go through the per-broker send
  lanes (``send_lanes``), which merge what waits behind a broker's calls; retries
  run on the sender's small thread pool, never on the thread that delivered the
  failure. A call that auto-creates its topic goes alone, outside the lanes. The
  caller's future is settled once: with every chunk's result, or with the first
  error; callbacks run inside ``AsyncSendBudget.delivering`` (they may send).
"""

from __future__ import annotations

import concurrent.futures
import functools
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from actors.client.backpressure import AsyncSendBudget
from actors.client.fault import LatencyFaultTolerance
from actors.client.idempotence import Sequencer
from actors.client.queue_selector import QueueSelector
from actors.client.send_lanes import SendLanes
from actors.client.send_result import BatchSendResult, _Chunk
from actors.client.transport import Reply, Transport
from actors.config.client import ProducerConfig
from actors.protocol import rpc as _rpc
from actors.protocol.route import TopicRouteData
from actors.protocol.wire import SendAck
from rebalance import MessageQueue
from storage.codec import EncodedBatch
from storage.errors import (
    BrokerUnavailableError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    TopicNotFoundError,
)
from storage.message import PutStatus

log = logging.getLogger("raymq.actors.producer")

Sent = tuple[_Chunk, MessageQueue, SendAck]
"""One chunk's outcome: where it went and the broker's answer."""

Pinned = EncodedBatch | None
"""An idempotent chunk as bound and sent (it may be stored): only ever sent again as
is, to the same queue (``actors.client.idempotence``); None for other chunks."""


def _may_retry(exc: BaseException) -> bool:
    """A send worth making again: Ray or the broker's availability failed it, or an
    idempotent run arrived before one sent ahead of it."""
    return _rpc.send_may_retry(exc) or isinstance(exc, OutOfOrderSequenceError)


def _backoff(attempt: int) -> float:
    return float(min(0.05 * 2**attempt, 0.5))


def _stored_before(mq: MessageQueue, n: int) -> SendAck:
    """The answer to a run the broker says it stored long ago: offsets unknown (-1)."""
    unknown = np.full(n, -1, dtype=np.int64)
    return SendAck(PutStatus.PUT_OK, mq.broker_name, "0.0.0.0:0", unknown, unknown)


class Sender:
    """Sends chunks, sync or async, with retries on another broker; see the module doc."""

    def __init__(
        self,
        config: ProducerConfig,
        selector: QueueSelector,
        transport: Transport,
        fault: LatencyFaultTolerance,
        budget: AsyncSendBudget,
        sequencer: Sequencer | None = None,
    ) -> None:
        self.config = config
        self.sequencer = sequencer
        self._later = _Delayed()
        self.selector = selector
        self.transport = transport
        self.fault = fault
        self.budget = budget
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="raymq-producer")
        self._lanes = SendLanes(
            config.max_in_flight_per_broker,
            max_messages=4 * config.max_batch_messages,
            max_bytes=2 * config.max_batch_bytes,
        )

    def close(self) -> None:
        """Let the retry threads finish and stop them (answers still out are not waited)."""
        self._later.close()
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------ sync
    def send_chunks(
        self,
        chunks: list[_Chunk],
        total: int,
        sharding_key: str | None,
        timeout_s: float | None,
    ) -> BatchSendResult:
        """Send ``chunks`` (``total`` messages) and wait for every answer."""
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

    def send_oneway(self, chunks: Sequence[_Chunk]) -> None:
        """Send each chunk once; no answer is awaited and no failure is reported (nor
        numbered: a oneway send lost would leave a gap its queue waits for)."""
        for chunk in chunks:
            try:
                mq, route, auto_n = self.selector.select(chunk.topic, None, None)
                self._call(route, mq.broker_name, [chunk.batch.with_queue(mq.queue_id)], auto_n)
            except Exception as exc:  # noqa: BLE001 - oneway never reports
                log.debug("oneway send failed: %s", exc)

    def _bind(self, chunk: _Chunk, mq: MessageQueue, route: TopicRouteData) -> EncodedBatch:
        """The chunk bound for ``mq`` (numbered, for an idempotent producer)."""
        if self.sequencer is None:
            return chunk.batch.with_queue(mq.queue_id)
        return self.sequencer.bind(chunk.batch, mq, route)

    def _send(
        self, chunk: _Chunk, mq: MessageQueue, route: TopicRouteData, auto_n: int
    ) -> tuple[Reply, float, Pinned]:
        bound = self._bind(chunk, mq, route)
        try:
            ref = self._call(route, mq.broker_name, [bound], auto_n)
        except BaseException:
            if self.sequencer is not None:  # not sent: its sequences are free again
                self.sequencer.release(bound, mq)
            raise
        if auto_n:
            self.selector.created(chunk.topic)  # next time ask for the real route
        return ref, time.monotonic(), bound if self.sequencer is not None else None

    def _submit(
        self, chunk: _Chunk, avoid: str | None, sharding_key: str | None, refresh: bool = False
    ) -> tuple[MessageQueue, Reply, float, Pinned]:
        mq, route, auto_n = self.selector.select(chunk.topic, avoid, sharding_key, refresh)
        return (mq, *self._send(chunk, mq, route, auto_n))

    def _resend(self, chunk: _Chunk, mq: MessageQueue, pinned: EncodedBatch) -> Reply:
        """A pinned chunk again, as it was, to its queue's broker group (its master now).
        A topic with no route (its only broker restarting) is the broker unavailable."""
        try:
            route, _ = self.selector.route(chunk.topic)
        except TopicNotFoundError as exc:
            raise BrokerUnavailableError(str(exc)) from exc
        return self._call(route, mq.broker_name, [pinned], 0)

    def _finish(
        self,
        chunk: _Chunk,
        mq: MessageQueue | None,
        first: tuple[Any, ...] | BaseException,
        timeout: float,
        sharding_key: str | None,
    ) -> Sent:
        """Wait for a submitted chunk (``first`` is its ref, start time and pinned batch,
        or the error that kept it from being sent); when it failed on the way, send it
        again: to another broker, or, pinned, to the same queue until ``timeout``."""
        retries = self.config.retry_times_when_send_failed
        last_exc: BaseException | None = None
        ref: Reply | None = None
        pinned: Pinned = None
        started = 0.0
        if isinstance(first, BaseException):
            last_exc = first
        else:
            ref, started, pinned = first
        deadline = time.monotonic() + max(timeout, self.config.delivery_timeout_s)
        attempt = 0
        while True:
            if ref is None and pinned is not None:
                assert mq is not None
                try:
                    ref, started = self._resend(chunk, mq, pinned), time.monotonic()
                except Exception as exc:  # noqa: BLE001
                    if not _may_retry(exc):
                        self._give_up(pinned, mq)
                        raise
                    last_exc = exc
            elif ref is None:
                avoid = mq.broker_name if mq is not None and sharding_key is None else None
                try:
                    mq, ref, started, pinned = self._submit(
                        chunk, avoid, sharding_key, refresh=True
                    )
                except Exception as exc:  # noqa: BLE001
                    if not _rpc.send_may_retry(exc):
                        raise
                    last_exc = exc
            if ref is not None:
                assert mq is not None
                try:
                    ack = SendAck.from_wire(_rpc.get(ref, timeout))
                except DuplicateSequenceError:
                    ack = _stored_before(mq, len(chunk.batch))
                except Exception as exc:  # noqa: BLE001
                    if not _may_retry(exc):
                        self._give_up(pinned, mq)
                        raise
                    last_exc = exc
                    ref = None
                    if self._stale(pinned, exc):
                        pinned = None  # never stored, and its epoch is over: numbered anew
                    if not isinstance(exc, OutOfOrderSequenceError):
                        self.fault.update(mq.broker_name, timeout, failed=True)
                        self.selector.invalidate(chunk.topic)
                    log.warning(
                        "send to %s failed (%s); attempt %d of %d%s",
                        mq,
                        type(exc).__name__,
                        attempt + 1,
                        retries + 1,
                        " (to the same queue: it may be stored)" if pinned is not None else "",
                    )
                else:
                    self.fault.update(mq.broker_name, time.monotonic() - started)
                    return chunk, mq, ack
            attempt += 1
            if attempt > retries and (pinned is None or time.monotonic() >= deadline):
                break
            if pinned is not None:
                time.sleep(_backoff(attempt))  # a failover, or the run before it, to come
        self._give_up(pinned, mq)
        raise BrokerUnavailableError(
            f"send of {len(chunk.batch)} message(s) to topic {chunk.topic!r} failed after "
            f"{attempt} attempt(s): {type(last_exc).__name__}: {last_exc}"
            + (" (it may have been stored, once)" if pinned is not None else "")
        ) from last_exc

    def _stale(self, pinned: Pinned, exc: BaseException) -> bool:
        """A pinned run refused for a gap before it, from an epoch that is over (a run
        before it was given up): the gap will never fill. The refusal says it was never
        stored (a stored run is answered, or refused as a duplicate), so it is free."""
        return (
            pinned is not None
            and self.sequencer is not None
            and isinstance(exc, OutOfOrderSequenceError)
            and pinned.producer_epoch != self.sequencer.epoch
        )

    def _give_up(self, pinned: Pinned, mq: MessageQueue | None) -> None:
        if pinned is not None and mq is not None and self.sequencer is not None:
            self.sequencer.abandon(pinned, mq)

    # ------------------------------------------------------------ async
    def send_chunks_async(
        self,
        chunks: list[_Chunk],
        total: int,
        single: bool = False,
        sharding_key: str | None = None,
        budgeted: bool = False,
    ) -> concurrent.futures.Future[Any]:
        """Send ``chunks`` (``total`` messages) without waiting: a future of their
        :class:`BatchSendResult` (of its one :class:`SendResult` when ``single``).
        ``budgeted``: the caller's own send, which waits for room in the budget."""
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if budgeted:  # the caller's own send, not the coalescer's: it waits for room
            count, nbytes = total, sum(len(c.batch.data) for c in chunks)
            self.budget.acquire(count, nbytes, self.config.send_timeout_s)
            # the callback stays on the future as long as the caller keeps it: not chunks
            out.add_done_callback(lambda _: self.budget.release(count, nbytes))
        parts: list[Any] = [None] * len(chunks)
        remaining = [len(chunks)]  # parts to come; -1 once ``out`` is being settled
        lock = threading.Lock()

        def done(i: int, part: Any, exc: BaseException | None) -> None:
            with lock:
                if remaining[0] < 0:
                    return
                if exc is None:
                    parts[i] = part
                    remaining[0] -= 1
                    if remaining[0]:
                        return
                remaining[0] = -1
            with self.budget.delivering():  # callers' callbacks run here and may send
                if exc is not None:
                    out.set_exception(exc)
                else:
                    result = BatchSendResult(parts, total)
                    out.set_result(result[0] if single else result)

        for i, chunk in enumerate(chunks):
            self._send_chunk_async(chunk, 0, None, sharding_key, functools.partial(done, i))
        return out

    def _send_chunk_async(
        self,
        chunk: _Chunk,
        attempt: int,
        avoid: str | None,
        sharding_key: str | None,
        done: Callable[[Any, BaseException | None], None],
        pinned: Pinned = None,
        pinned_mq: MessageQueue | None = None,
        deadline: float = 0.0,
    ) -> None:
        retries = self.config.retry_times_when_send_async_failed
        if not deadline:
            deadline = time.monotonic() + max(
                self.config.send_timeout_s, self.config.delivery_timeout_s
            )

        def retry(exc: BaseException, mq: MessageQueue | None, sent: Pinned) -> None:
            if self._stale(sent, exc):  # never stored, and its epoch is over: anew, anywhere
                try:
                    self._pool.submit(
                        self._send_chunk_async, chunk, attempt + 1, None, sharding_key, done
                    )
                except RuntimeError:  # closed meanwhile
                    done(None, exc)
                return
            if sent is not None and mq is not None:  # it may be stored: same queue, or nothing
                if _may_retry(exc) and (attempt < retries or time.monotonic() < deadline):
                    if not isinstance(exc, OutOfOrderSequenceError):
                        self.fault.update(mq.broker_name, 0.0, failed=True)
                        self.selector.invalidate(chunk.topic)
                    self._later.call(
                        _backoff(attempt + 1),
                        functools.partial(
                            self._send_chunk_async,
                            chunk,
                            attempt + 1,
                            None,
                            sharding_key,
                            done,
                            sent,
                            mq,
                            deadline,
                        ),
                        functools.partial(done, None, exc),
                    )
                else:
                    self._give_up(sent, mq)
                    done(None, exc)
                return
            if attempt < retries and _rpc.send_may_retry(exc):
                if mq is not None:
                    self.fault.update(mq.broker_name, 0.0, failed=True)
                self.selector.invalidate(chunk.topic)
                nxt = mq.broker_name if mq is not None and sharding_key is None else avoid
                try:
                    self._pool.submit(
                        self._send_chunk_async, chunk, attempt + 1, nxt, sharding_key, done
                    )
                except RuntimeError:  # closed meanwhile: no retry, the caller hears of it
                    done(None, exc)
            else:
                done(None, exc)

        started = time.monotonic()
        if pinned is not None and pinned_mq is not None:
            mq = pinned_mq
            try:
                route, _ = self.selector.route(chunk.topic)
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, TopicNotFoundError):  # its only broker restarting
                    exc = BrokerUnavailableError(str(exc))
                retry(exc, mq, pinned)
                return
            bound, auto_n = pinned, 0
        else:
            try:
                mq, route, auto_n = self.selector.select(
                    chunk.topic, avoid, sharding_key, attempt > 0
                )
            except Exception as exc:  # noqa: BLE001
                retry(exc, None, None)
                return
            bound = None

        def answered(ack: SendAck | None, exc: BaseException | None) -> None:
            if isinstance(exc, DuplicateSequenceError):
                ack, exc = _stored_before(mq, len(chunk.batch)), None
            if exc is not None or ack is None:
                why = _rpc.cause_of(exc) if exc is not None else RuntimeError("no ack")
                sent = bound if self.sequencer is not None else None
                if isinstance(why, _NotSent) and sent is not None and pinned is None:
                    assert self.sequencer is not None
                    self.sequencer.release(sent, mq)  # never sent: free to go elsewhere
                    sent = None
                retry(why, mq, sent)
                return
            self.fault.update(mq.broker_name, time.monotonic() - started)
            done((chunk, mq, ack), None)

        if auto_n:  # this call creates the topic's queues: it goes alone
            try:
                ref, started, bound = self._send(chunk, mq, route, auto_n)
            except Exception as exc:  # noqa: BLE001 - not sent
                retry(exc, mq, None)
                return
            ref.future().add_done_callback(
                lambda fut: _answer_from(fut, answered)  # same path as a lane's answer
            )
            return
        if bound is None:
            try:
                bound = self._bind(chunk, mq, route)
            except Exception as exc:  # noqa: BLE001 - no producer id: not sent
                retry(exc, mq, None)
                return
        self._lanes.send(
            mq.broker_name,
            bound,
            functools.partial(self._send_wire, route, mq.broker_name),
            answered,
        )

    def _send_wire(self, route: TopicRouteData, broker_name: str, *batches: EncodedBatch) -> Reply:
        """A lane's call: ``batches`` (bound for their queues already) to ``broker_name``,
        through the broker's shared ring when it runs on this node. A call that could not
        be made raises :class:`_NotSent` (its batches may go elsewhere)."""
        try:
            return self._call(route, broker_name, batches, 0)
        except Exception as exc:
            raise _NotSent(str(exc)) from exc

    def _call(
        self,
        route: TopicRouteData,
        broker_name: str,
        batches: Sequence[EncodedBatch],
        auto_n: int,
    ) -> Reply:
        """The transport's call; a broker it cannot reach is marked failed first."""
        try:
            return self.transport.call(route, broker_name, batches, auto_n)
        except BrokerUnavailableError:
            self.fault.update(broker_name, 0.0, failed=True)
            raise


def _answer_from(
    fut: concurrent.futures.Future[Any],
    answered: Callable[[SendAck | None, BaseException | None], None],
) -> None:
    try:
        ack = SendAck.from_wire(fut.result())
    except Exception as exc:  # noqa: BLE001 - retried by ``answered``
        answered(None, exc)
        return
    answered(ack, None)


class _NotSent(BrokerUnavailableError):
    """A lane's call could not be made: nothing of it reached the broker."""


class _Delayed:
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
