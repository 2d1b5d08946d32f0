"""Async sends: each chunk through the per-broker send lanes (``send_lanes``), which
merge what waits behind a broker's calls, its retries on the sender's small thread pool
(never on the thread that delivered the failure) or, for a run that may be stored,
after a backoff on the timer thread. A call that auto-creates its topic goes alone,
outside the lanes. The caller's future is settled once: with every chunk's result, or
with the first error; callbacks run inside ``AsyncSendBudget.delivering`` (they may
send). See :mod:`actors.client.sender` for what holds for every send."""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from actors.client.send_core import SenderCore
from actors.client.send_outcome import Outcome, answer_from, backoff, stored_before
from actors.client.send_result import BatchSendResult, SendResult, _Chunk, single_result
from actors.protocol import rpc as _rpc
from actors.protocol.shared_future import SharedFuture
from actors.protocol.wire import SendAck
from rebalance import MessageQueue
from storage.codec import EncodedBatch
from storage.errors import (
    BrokerUnavailableError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    TopicNotFoundError,
)


class AsyncSending(SenderCore):
    """Sends chunks without waiting: a future of their results."""

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
        out = SharedFuture(self._futures)
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

    def send_one_async(
        self, chunk: _Chunk, on_done: Callable[[SendResult | None, BaseException | None], None]
    ) -> None:
        """A one-message chunk sent without a future (the coalescer's single message):
        ``on_done(result, error)`` once, when answered (retries as
        :meth:`send_chunks_async`'s), run where callers' callbacks run."""
        settled = [False]

        def finished(part: Any, exc: BaseException | None) -> None:
            if settled[0]:  # once, as ``send_chunks_async``'s future is settled once
                return
            settled[0] = True
            with self.budget.delivering():  # callers' callbacks run here and may send
                if exc is not None:
                    on_done(None, exc)
                else:
                    on_done(single_result(*part), None)

        self._send_chunk_async(chunk, 0, None, None, finished)

    def _send_chunk_async(
        self,
        chunk: _Chunk,
        attempt: int,
        avoid: str | None,
        sharding_key: str | None,
        done: Callable[[Any, BaseException | None], None],
        run: Outcome | None = None,
        pinned_mq: MessageQueue | None = None,
        deadline: float = 0.0,
    ) -> None:
        retries = self.config.retry_times_when_send_async_failed
        if run is None:
            run = Outcome(self.sequencer)
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
                backoff(nxt),
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
                ack, exc = stored_before(mq, len(chunk.batch)), None
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
                lambda fut: answer_from(fut, answered)  # same path as a lane's answer
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
