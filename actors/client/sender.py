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
from actors.client.fault import LATENCY_MAX_S, LatencyFaultTolerance
from actors.client.idempotence import Sequencer
from actors.client.queue_selector import QueueSelector
from actors.client.send_lanes import SendLanes
from actors.client.send_result import BatchSendResult, _Chunk
from actors.client.transport import Reply, Transport
from actors.config.client import ProducerConfig
from actors.protocol import rpc as _rpc
from actors.protocol.errors import refused
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
        """Wait for a submitted chunk (``first`` is its ref, start time and numbered run,
        or the error that kept it from being sent); when it failed on the way, send it
        again: to another broker, or, when it may be stored, as it was to the same queue
        until ``delivery_timeout_s`` (see :class:`_Outcome`)."""
        retries = self.config.retry_times_when_send_failed
        ref: Reply | None = None
        started = 0.0
        run = _Outcome(self.sequencer)
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
                    if not _may_retry(exc):
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
                    ack = _stored_before(mq, len(chunk.batch))
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
            if reordered:  # bounded by the deadline, not by the retries
                if time.monotonic() >= deadline:
                    break
            else:
                attempt += 1
                if attempt > retries and (not run.pinned or time.monotonic() >= deadline):
                    break
            if run.pinned:
                time.sleep(_backoff(attempt))  # a failover, or the run before it, to come
        run.give_up(mq)
        if run.stored is not None:  # stored, not as durably as asked: that answer stands
            return (chunk, *run.stored)
        last_exc = run.last_exc
        raise BrokerUnavailableError(
            f"send of {len(chunk.batch)} message(s) to topic {chunk.topic!r} failed after "
            f"{attempt} attempt(s): {type(last_exc).__name__}: {last_exc}"
            + (" (it may have been stored, once)" if run.maybe_stored else "")
        ) from last_exc

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
        if len(chunks) == 1:  # one chunk (a single message, a coalesced batch): no tally

            def alone(part: Any, exc: BaseException | None) -> None:
                if out.done():  # settled once, as the tally below guarantees for many
                    return
                with self.budget.delivering():  # callers' callbacks run here and may send
                    if exc is not None:
                        out.set_exception(exc)
                    else:
                        result = BatchSendResult([part], total)
                        out.set_result(result[0] if single else result)

            self._send_chunk_async(chunks[0], 0, None, sharding_key, alone)
            return out
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
        run: _Outcome | None = None,
        pinned_mq: MessageQueue | None = None,
        deadline: float = 0.0,
    ) -> None:
        retries = self.config.retry_times_when_send_async_failed
        if run is None:
            run = _Outcome(self.sequencer)
        if not deadline:
            deadline = time.monotonic() + max(
                self.config.send_timeout_s, self.config.delivery_timeout_s
            )
        outcome = run

        def fail(exc: BaseException) -> None:
            if outcome.stored is not None:  # stored, not as durably as asked: that stands
                done((chunk, *outcome.stored), None)
            else:
                done(None, exc)

        def again_as_is(nxt: int, mq: MessageQueue, on_closed: Callable[[], None]) -> None:
            """Attempt ``nxt``: the pinned run, as it is, to ``mq`` after a backoff."""
            self._later.call(
                _backoff(nxt),
                functools.partial(
                    self._send_chunk_async,
                    chunk,
                    nxt,
                    None,
                    sharding_key,
                    done,
                    outcome,
                    mq,
                    deadline,
                ),
                on_closed,
            )

        def retry(exc: BaseException, mq: MessageQueue | None) -> None:
            if not outcome.failed(exc, mq):
                fail(exc)
                return
            # refused for the order of runs: not a failed attempt (the deadline bounds it)
            nxt = attempt if isinstance(exc, OutOfOrderSequenceError) else attempt + 1
            if mq is not None and outcome.moved:
                master = self.selector.master_of(chunk.topic, mq.broker_name)
                self.fault.update(mq.broker_name, 0.0, failed=True, master=master)
                self.selector.invalidate(chunk.topic)
            if outcome.pinned and mq is not None:  # as it was, to its queue, or nothing
                if nxt <= retries or time.monotonic() < deadline:
                    again_as_is(nxt, mq, functools.partial(done, None, exc))
                else:
                    outcome.give_up(mq)
                    fail(exc)
                return
            if nxt <= retries or (nxt == attempt and time.monotonic() < deadline):
                away = mq.broker_name if mq is not None and sharding_key is None else avoid
                try:
                    self._pool.submit(
                        self._send_chunk_async,
                        chunk,
                        nxt,
                        away,
                        sharding_key,
                        done,
                        outcome,
                        None,
                        deadline,
                    )
                except RuntimeError:  # closed meanwhile: no retry, the caller hears of it
                    done(None, exc)
            else:
                done(None, exc)

        started = time.monotonic()
        if outcome.pinned and pinned_mq is not None:
            mq = pinned_mq
            try:
                route, _ = self.selector.route(chunk.topic)
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, TopicNotFoundError):  # its only broker restarting
                    exc = BrokerUnavailableError(str(exc))
                retry(exc, mq)
                return
            auto_n = 0
        else:
            try:
                mq, route, auto_n = self.selector.select(
                    chunk.topic, avoid, sharding_key, attempt > 0
                )
            except Exception as exc:  # noqa: BLE001
                retry(exc, None)
                return

        def answered(ack: SendAck | None, exc: BaseException | None) -> None:
            if isinstance(exc, DuplicateSequenceError):
                ack, exc = _stored_before(mq, len(chunk.batch)), None
            if exc is not None or ack is None:
                retry(_rpc.cause_of(exc) if exc is not None else RuntimeError("no ack"), mq)
                return
            if attempt < retries and outcome.not_durable(ack, mq):
                again_as_is(attempt + 1, mq, functools.partial(done, (chunk, mq, ack), None))
                return
            outcome.settle(mq)
            self._answered_in(chunk, mq, time.monotonic() - started)
            done((chunk, mq, ack), None)

        if auto_n:  # this call creates the topic's queues: it goes alone
            try:
                ref, started, outcome.bound = self._send(chunk, mq, route, auto_n)
            except Exception as exc:  # noqa: BLE001 - not sent (its numbers are back)
                retry(exc, mq)
                return
            ref.future().add_done_callback(
                lambda fut: _answer_from(fut, answered)  # same path as a lane's answer
            )
            return

        def bind() -> EncodedBatch:  # under the lane's lock: runs reach it numbered in order
            outcome.bound = self._bind(chunk, mq, route)
            return outcome.bound

        try:
            self._lanes.send(
                mq.broker_name,
                outcome.bound if outcome.pinned and outcome.bound is not None else bind,
                functools.partial(self._send_wire, route, mq.broker_name),
                answered,
            )
        except Exception as exc:  # noqa: BLE001 - not bound (no producer id): not sent
            retry(exc, mq)

    def _answered_in(self, chunk: _Chunk, mq: MessageQueue, latency_s: float) -> None:
        """The latency of an answer, to the fault tolerance: a slow one isolates the
        master it came from."""
        if latency_s < LATENCY_MAX_S[2]:  # fast enough to isolate nothing
            self.fault.update(mq.broker_name, latency_s)
        else:
            master = self.selector.master_of(chunk.topic, mq.broker_name)
            self.fault.update(mq.broker_name, latency_s, master=master)

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
            master = self.selector.master_in(route, broker_name)
            self.fault.update(broker_name, 0.0, failed=True, master=master)
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


class _Outcome:
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
        if refused(exc) or (isinstance(exc, _NotSent) and not self.maybe_stored):
            if self.maybe_stored:  # this refusal says nothing of the earlier attempt
                if _rpc.send_may_retry(exc):
                    self.pinned = True
                    return True
                self.give_up(mq)
                return False
            seq.release(bound, mq)  # the broker wrote nothing: the numbers are free
            self.bound, self.pinned = None, False
            return _rpc.send_may_retry(exc)
        if not _may_retry(exc):  # the answer is lost, and it is not worth waiting for
            self.give_up(mq)
            return False
        self.maybe_stored = self.pinned = True
        return True

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
