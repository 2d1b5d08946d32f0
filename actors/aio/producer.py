"""AsyncProducer: ``await producer.send(message)`` on the caller's event loop.

The synchronous :class:`~actors.client.producer.Producer`'s parts that need no
thread (the encoder, the queue selector, the latency fault tolerance, the
idempotent numbering and the judgement of each failed attempt,
:class:`~actors.client.send_outcome.Outcome`) drive sends over
:class:`~actors.aio.connection.AsyncBrokers`: each broker's socket, on the loop.
Routes and broker handles come from the process's client instance
(``actors.client.instance``); a route or handle not cached yet is looked up on a
worker thread (a NameServer call through Ray), never per message.

* ``await send(message)`` of one message without a sharding key, while nothing else
  of the producer waits for an answer, is written at once, in the caller's step;
  otherwise it joins the other single messages sent in the same turn of the loop
  (from many tasks) in one batch: one frame, one answer for all of them. A message
  of that batch refused by validation fails its own caller alone. Anything else is
  sent as it is.
* Idempotent by default, as the synchronous producer: a chunk is numbered per queue
  (producer id, epoch, sequence), and one that may be stored is sent again only as
  the same bytes to the same queue, which stores it once.
* Backpressure: at most ``async_send_max_messages`` messages (and
  ``async_send_max_bytes``) unanswered; a send beyond that awaits room.
* Cancellation: a cancelled ``await send`` either never wrote its frame (its
  sequence numbers are given back, nothing was sent) or its frame is out: then the
  send goes on to its outcome in the background (retried as the same numbered run
  where needed, so it is stored once or, given up, the producer begins a new epoch)
  and :meth:`close` waits for it. A single message cancelled before its batch left is
  taken out of the batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from actors.aio.connection import AsyncBrokers, AsyncConnection, NotWritten, master, within
from actors.client.encoder import MessageEncoder
from actors.client.idempotence import Sequencer
from actors.client.producer import ProducerCore, with_delay
from actors.client.send_outcome import NotSent, Outcome, backoff, pinned_route, stored_before
from actors.client.send_result import BatchSendResult, SendResult, _Chunk
from actors.protocol.requests.send import SEND as _SEND
from actors.protocol.route import TopicRouteData
from actors.protocol.wire import SendAck
from rebalance import MessageQueue
from storage.codec import EncodedBatch
from storage.errors import (
    BrokerUnavailableError,
    DuplicateSequenceError,
    InvalidMessageError,
    OutOfOrderSequenceError,
)
from storage.message import Message

log = logging.getLogger("raymq.actors.aio.producer")


class _Budget:
    """Messages and bytes unanswered; :meth:`acquire` awaits room (never raises)."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self.messages = self.bytes = 0
        self._room = asyncio.Event()

    async def acquire(self, n: int, nbytes: int) -> None:
        while self.messages and (
            self.messages + n > self.max_messages or self.bytes + nbytes > self.max_bytes
        ):
            self._room.clear()
            await self._room.wait()
        self.messages += n
        self.bytes += nbytes

    def release(self, n: int, nbytes: int) -> None:
        self.messages -= n
        self.bytes -= nbytes
        self._room.set()


class _Single:
    """Single messages of one topic waiting for the loop's next turn to leave as one batch."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.waiters: list[asyncio.Future[SendResult]] = []


class _Written:
    """Whether any frame of a send has left (a cancelled caller's send then goes on)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False


class AsyncProducer(ProducerCore):
    """Sends messages from asyncio code; see the module doc. ``async with`` closes it.
    Takes :class:`~actors.client.producer.Producer`'s arguments."""

    def _setup(self) -> None:
        self.sequencer = (
            Sequencer(_no_blocking_allocation) if self.config.enable_idempotence else None
        )
        self._encoder = MessageEncoder(self.config, self.sequencer)
        self._brokers = AsyncBrokers(self.config.data_tls_ca)
        self._budget: _Budget | None = None
        self._singles: dict[str, _Single] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._pid_task: asyncio.Future[None] | None = None  # the id's allocation, once
        self.closed = False

    # ------------------------------------------------------------ public API
    async def send(
        self,
        message: Message | Sequence[Message],
        *,
        sharding_key: str | None = None,
        delay_s: float | None = None,
    ) -> Any:
        """Send one message (its :class:`SendResult`) or a list (a :class:`BatchSendResult`).
        ``sharding_key``: the same key, the same queue (orderly); ``delay_s``: delivered
        that many seconds from now. Invalid messages raise before anything is sent."""
        if isinstance(message, Message):
            if sharding_key is None:
                if delay_s is not None:
                    message = with_delay([message], delay_s)[0]
                return await self._send_single(message)
            return (await self.send_batch([message], sharding_key=sharding_key, delay_s=delay_s))[0]
        return await self.send_batch(message, sharding_key=sharding_key, delay_s=delay_s)

    async def send_batch(
        self,
        messages: Sequence[Message],
        *,
        sharding_key: str | None = None,
        delay_s: float | None = None,
    ) -> BatchSendResult:
        """Send many messages: one frame per (topic, chunk), the chunks in flight together."""
        self._check_open()
        if delay_s is not None:
            messages = with_delay(messages, delay_s)
        await self._ready(messages)
        chunks = self._encoder.encode(messages)  # validation errors raise here
        return await self._send_encoded(chunks, len(messages), sharding_key)

    async def _send_encoded(
        self, chunks: list[_Chunk], n: int, sharding_key: str | None
    ) -> BatchSendResult:
        """``n`` messages encoded as ``chunks``, sent within the budget (see send_batch)."""
        nbytes = sum(len(c.batch) for c in chunks)
        budget = self._get_budget()
        await budget.acquire(n, nbytes)
        try:
            state = _Written()
            parts = await self._guarded(self._send_chunks(chunks, sharding_key, state), state)
        finally:
            budget.release(n, nbytes)
        return BatchSendResult(parts, n)

    async def close(self) -> None:
        """Wait for sends still out (cancelled callers' ones included), then give back
        the producer's share of the client instance."""
        if self.closed:
            return
        if self._background:
            await asyncio.wait(list(self._background), timeout=2 * self.config.delivery_timeout_s)
        self.closed = True
        self._brokers.close()
        self._leave()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ single messages
    async def _send_single(self, message: Message) -> SendResult:
        self._check_open()
        await self._ready([message])
        try:
            nbytes = len(message.body)
        except TypeError:
            raise InvalidMessageError(
                f"message body must be bytes, got {type(message.body).__name__}"
            ) from None
        if not isinstance(message.topic, str):
            self._encoder.encode([message])  # raises the encoder's own error
        budget = self._get_budget()
        await budget.acquire(1, nbytes)
        try:
            single = self._singles.get(message.topic)
            if single is None and budget.messages == 1:
                # nothing else unanswered: no batch to share, so its frame is written
                # now, in the caller's step, instead of a turn of the loop later
                task = self._send_now(message)
                if task is not None:
                    return await self._settled(task)
            if single is None:  # its batch leaves in the next turn, from its own task
                single = self._singles[message.topic] = _Single()
                task = asyncio.ensure_future(self._flush(message.topic, single))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
            single.messages.append(message)
            single.waiters.append(fut)
            try:
                return await fut
            except asyncio.CancelledError:
                if self._singles.get(message.topic) is single:  # not left yet: taken out
                    i = single.waiters.index(fut)
                    del single.waiters[i], single.messages[i]
                raise
        finally:
            budget.release(1, nbytes)

    async def _flush(self, topic: str, single: _Single) -> list[Any]:
        """Send the single messages of ``topic`` gathered in this turn of the loop as one
        batch, and answer their callers as soon as it is answered; its chunks' outcomes
        (none when nothing was sent). The task that sends it is the one created with the
        batch (no turn of the loop between the batch closing and its frame's write, none
        between its answer and its callers)."""
        if self._singles.get(topic) is single:
            del self._singles[topic]
        messages, waiters = single.messages, single.waiters
        if not messages:  # every caller was cancelled
            return []
        try:
            try:
                chunks = self._encoder.encode(messages)
            except InvalidMessageError:
                if len(messages) == 1:
                    raise
                # one caller's bad message must not fail the others sent in its turn:
                # each refused one hears its own error, the rest leave together
                messages, waiters = self._refuse_invalid(messages, waiters)
                if not messages:
                    return []
                chunks = self._encoder.encode(messages)
            parts = await self._send_chunks(chunks, None, _Written())
        except BaseException as exc:  # noqa: BLE001 - the batch's callers hear it
            for w in waiters:
                if not w.done():
                    w.set_exception(
                        asyncio.CancelledError() if isinstance(exc, asyncio.CancelledError) else exc
                    )
            if not isinstance(exc, Exception):
                raise
            return []
        results = BatchSendResult(parts, len(messages))
        for i, w in enumerate(waiters):
            if not w.done():
                w.set_result(results[i])
        return parts

    def _refuse_invalid(
        self, messages: list[Message], waiters: list[asyncio.Future[SendResult]]
    ) -> tuple[list[Message], list[asyncio.Future[SendResult]]]:
        """The messages of a turn's batch that encode alone (and their waiters); each
        waiter of one that does not gets its own validation error."""
        kept: list[Message] = []
        kept_waiters: list[asyncio.Future[SendResult]] = []
        for m, w in zip(messages, waiters):
            try:
                self._encoder.encode([m], numbered=False)
            except InvalidMessageError as exc:
                if not w.done():
                    w.set_exception(exc)
                continue
            kept.append(m)
            kept_waiters.append(w)
        return kept, kept_waiters

    def _send_now(self, message: Message) -> asyncio.Task[Any] | None:
        """``message`` encoded and its frame written now, when everything the write
        needs is at hand (the topic's route, the producer's id, an open connection to
        the queue's master): the task that awaits its answer (and retries as
        :meth:`_send_chunk` does), or None, nothing written and nothing numbered: it
        goes the batched way."""
        seq = self.sequencer
        if not self._cached(message.topic) or (seq is not None and seq.producer_id is None):
            return None
        [chunk] = self._encoder.encode([message])  # a bad message raises: the caller's own
        run = Outcome(self.sequencer)
        state = _Written()
        first = self._write_first(chunk, run, state)
        if first is None:
            return None
        task = asyncio.ensure_future(self._send_chunk(chunk, None, state, run=run, first=first))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _write_first(
        self, chunk: _Chunk, run: Outcome, state: _Written
    ) -> tuple[asyncio.Future[Any], MessageQueue, float] | None:
        """:meth:`_send_chunk`'s first attempt up to its write, without awaiting: the
        answer's future, the queue and the time it was written; None (nothing numbered,
        nothing written) when something is not at hand."""
        mq, route, auto_n = self._selector.select(chunk.topic, None, None)
        if auto_n:
            return None  # the topic is created by this send: the general path's case
        bd = route.broker(mq.broker_name)
        actor = bd.master_actor_name() if bd is not None else None
        conn = self._brokers.open_connection(actor) if actor is not None else None
        if conn is None:
            return None
        fut, started = self._write(conn, chunk, mq, route, 0, None, run, state)
        return fut, mq, started

    async def _settled(self, task: asyncio.Task[Any]) -> SendResult:
        """The result of a single message's :meth:`_send_now` task; a cancelled caller
        leaves it to finish in the background (its frame is out)."""
        chunk, mq, ack = await asyncio.shield(task)
        return BatchSendResult([(chunk, mq, ack)], 1)[0]

    # ------------------------------------------------------------ sending chunks
    async def _guarded(self, coro: Any, state: _Written) -> Any:
        """Run ``coro`` (a send) as a task; a caller cancelled after its frames left lets
        it finish in the background (its outcome known, see the module doc)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not state.written:
                task.cancel()  # nothing written yet: its numbers are given back
            raise

    async def _send_chunks(
        self, chunks: list[_Chunk], sharding_key: str | None, state: _Written
    ) -> list[Any]:
        if len(chunks) == 1:
            return [await self._send_chunk(chunks[0], sharding_key, state)]
        states = [_Written() for _ in chunks]
        tasks = [
            asyncio.ensure_future(self._send_chunk(c, sharding_key, s, state))
            for c, s in zip(chunks, states)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t, s in zip(tasks, states):
                if not t.done() and not s.written:
                    t.cancel()
            raise

    async def _send_chunk(
        self,
        chunk: _Chunk,
        sharding_key: str | None,
        state: _Written,
        whole: _Written | None = None,
        *,
        run: Outcome | None = None,
        first: tuple[asyncio.Future[Any], MessageQueue, float] | None = None,
    ) -> tuple[_Chunk, MessageQueue, SendAck]:
        """One chunk to its queue, with the synchronous sender's retries (see
        ``actors.client.sender``): elsewhere when it was certainly not stored, as the
        same bytes to the same queue when it may be, until ``delivery_timeout_s``."""
        config = self.config
        retries = config.retry_times_when_send_failed
        timeout = config.send_timeout_s
        deadline = time.monotonic() + max(timeout, config.delivery_timeout_s)
        if run is None:
            run = Outcome(self.sequencer)
        mq: MessageQueue | None = None
        attempt = 0
        while True:
            reordered = False
            written = False
            try:
                if first is not None:  # its frame is out already (_write_first)
                    fut, mq, started = first
                    first = None
                    written = True
                else:
                    if run.pinned and run.bound is not None and mq is not None:
                        with pinned_route():
                            route = await self._route(chunk.topic)
                        auto_n = 0
                        batch: EncodedBatch | None = run.bound
                    else:
                        avoid = mq.broker_name if mq is not None and sharding_key is None else None
                        mq, route, auto_n = await self._select(
                            chunk.topic, avoid, sharding_key, attempt > 0
                        )
                        await self._producer_id(route, mq.broker_name)
                        batch = None
                    actor, handle = await self._master(route, mq.broker_name)
                    conn = await self._brokers.connection(actor, handle)
                    fut, started = self._write(
                        conn, chunk, mq, route, auto_n, batch, run, state, whole
                    )
                    written = True
                try:
                    wire = await within(fut, timeout)
                except asyncio.TimeoutError:
                    raise BrokerUnavailableError(
                        f"no answer from {mq.broker_name} in {timeout} s"
                    ) from None
                ack = SendAck.from_wire(wire)
            except DuplicateSequenceError:
                assert mq is not None
                ack = stored_before(mq, len(chunk.batch))
            except asyncio.CancelledError:
                if not written and run.bound is not None and mq is not None:
                    run.failed(NotSent("cancelled before it was written"), mq)
                raise
            except Exception as exc:  # noqa: BLE001 - judged by the run's Outcome
                if isinstance(exc, NotWritten):
                    exc = NotSent(str(exc))
                if mq is None or not run.failed(exc, mq):
                    if run.stored is not None:
                        return (chunk, *run.stored)
                    raise exc from None
                reordered = isinstance(exc, OutOfOrderSequenceError)
                if run.moved:
                    self.fault.update(mq.broker_name, timeout, failed=True)
                    self._selector.invalidate(chunk.topic)
                log.warning(
                    "send to %s failed (%s: %s); attempt %d",
                    mq,
                    type(exc).__name__,
                    exc,
                    attempt + 1,
                )
            else:
                assert mq is not None
                if attempt < retries and run.not_durable(ack, mq):
                    log.info("send to %s stored, %s: again, as it is", mq, ack.status.value)
                else:
                    run.settle(mq)
                    self.fault.update(mq.broker_name, time.monotonic() - started)
                    return chunk, mq, ack
            attempt, again = run.next_attempt(attempt, retries, reordered, deadline)
            if not again:
                break
            if run.pinned:
                await asyncio.sleep(backoff(attempt))
        run.give_up(mq)
        if run.stored is not None:
            return (chunk, *run.stored)
        raise BrokerUnavailableError(
            f"send of {len(chunk.batch)} message(s) to topic {chunk.topic!r} failed after "
            f"{attempt} attempt(s): {run.last_exc}"
            + (" (it may have been stored, once)" if run.maybe_stored else "")
        ) from run.last_exc

    def _write(
        self,
        conn: AsyncConnection,
        chunk: _Chunk,
        mq: MessageQueue,
        route: TopicRouteData,
        auto_n: int,
        batch: EncodedBatch | None,
        run: Outcome,
        state: _Written,
        whole: _Written | None = None,
    ) -> tuple[asyncio.Future[Any], float]:
        """An attempt of :meth:`_send_chunk` written on ``conn``: ``batch`` (a pinned
        run's same bytes) or ``chunk`` numbered now (nothing awaits between the
        numbering and the write). The answer's future and when it was written."""
        if batch is None:
            batch = self._bind(chunk, mq, route)
            run.bound = batch if self.sequencer is not None else None
        # joined: the transport may keep what the socket cannot take now, and a
        # numbered run's bytes are rewritten when it is numbered again
        blob = b"".join(EncodedBatch.wire_parts([batch]))
        header, _, decode = _SEND.encode(b"", auto_n)
        started = time.monotonic()
        fut = conn.request(header, [blob], decode)
        state.written = True
        if whole is not None:
            whole.written = True
        if auto_n:
            self._selector.created(chunk.topic)
        return fut, started

    def _bind(self, chunk: _Chunk, mq: MessageQueue, route: TopicRouteData) -> EncodedBatch:
        if self.sequencer is None:
            return chunk.batch.with_queue(mq.queue_id)
        return self.sequencer.bind(chunk.batch, mq, route)

    # ------------------------------------------------------------ routes and brokers
    async def _ready(self, messages: Sequence[Message]) -> None:
        """Routes of the messages' topics cached (looked up on a worker thread if not)."""
        for topic in {getattr(m, "topic", None) for m in messages}:
            if isinstance(topic, str) and not self._cached(topic):
                await asyncio.to_thread(self._selector.route, topic)

    def _cached(self, topic: str) -> bool:
        return (
            self.ns.names.cached_route(topic) is not None
            or topic in self._selector._synthetic  # a topic the brokers will create
        )

    async def _route(self, topic: str) -> TopicRouteData:
        if not self._cached(topic):
            return (await asyncio.to_thread(self._selector.route, topic))[0]
        return self._selector.route(topic)[0]

    async def _select(
        self, topic: str, avoid: str | None, sharding_key: str | None, refresh: bool
    ) -> tuple[MessageQueue, TopicRouteData, int]:
        if refresh or not self._cached(topic):
            await asyncio.to_thread(self._selector.route, topic, refresh)
        return tuple(self._selector.select(topic, avoid, sharding_key))  # type: ignore[return-value]

    async def _master(self, route: TopicRouteData, broker_name: str) -> tuple[str, Any]:
        """The actor name and Ray handle of ``broker_name``'s master."""
        return await master(self.ns, "", broker_name, route)

    async def _producer_id(self, route: TopicRouteData, broker_name: str) -> None:
        """The idempotent producer's id from a broker, before its first send. The
        allocation is the producer's own task, which a cancelled send only stops
        waiting for: cancelled sends never leave the producer without an id."""
        seq = self.sequencer
        if seq is None or seq.producer_id is not None:
            return
        task = self._pid_task
        if task is None or (task.done() and seq.producer_id is None):  # none yet, or failed
            task = self._pid_task = asyncio.ensure_future(self._allocate_id(route, broker_name))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
        await asyncio.shield(task)

    async def _allocate_id(self, route: TopicRouteData, broker_name: str) -> None:
        seq = self.sequencer
        assert seq is not None
        _, handle = await self._master(route, broker_name)
        try:
            pid = await within(handle.allocate_producer_id.remote(), self.config.send_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the send fails over as one never sent
            raise NotSent(f"no producer id from broker {broker_name!r}: {exc}") from exc
        seq.producer_id = str(pid)
        log.info("idempotent producer id %s", seq.producer_id)

    def _get_budget(self) -> _Budget:
        if self._budget is None:
            self._budget = _Budget(
                self.config.async_send_max_messages, self.config.async_send_max_bytes
            )
        return self._budget

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the producer is closed")


def _no_blocking_allocation(route: TopicRouteData, broker_name: str) -> str:
    raise NotSent("the producer's id is allocated before its first send")
