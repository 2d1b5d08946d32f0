"""AsyncTransactionalProducer: transactions awaited on the caller's event loop.

Both kinds the synchronous clients have (``docs/how-to/transactions.md``):

* **One message with a local transaction** (RocketMQ's, as
  :class:`~actors.client.transaction.TransactionProducer`): ``half = await
  producer.send_half(message)`` stores the message as a half message no consumer
  sees; ``await half.commit()`` makes it visible, ``await half.rollback()`` drops it.
  ``await producer.send_message_in_transaction(message, execute)`` awaits
  ``execute(message)`` between the two and ends the transaction as it answers
  (UNKNOW, or an exception, leaves it to the broker's check).
* **The check-back**: a half message left without an end (its producer went away,
  or answered UNKNOW) is checked by its broker once older than the broker's
  ``transaction_timeout_s``; the broker asks a live producer of the group. This
  producer answers with ``await checker(message)`` (a coroutine function returning a
  :class:`~actors.client.transaction.LocalTransactionState`) on the loop that started
  it, and ends the checked transactions with the broker that asked, over its socket.
  The brokers reach the producer through a relay actor of its own (as the
  synchronous producer's), which a task of the loop holds a call on.
* **Several messages, topics and brokers with a group's offsets** (given
  ``transactional_id``, as :class:`~actors.client.transactional.TransactionalProducer`):
  ``async with producer.begin() as txn: await txn.send([...])`` sends the messages as
  half messages carrying the transaction's id (any broker), ``txn.send_offsets(group,
  {queue: offset})`` adds a consumer group's offsets, and the commit goes to the
  namespace's transaction coordinator, which logs the decision durably and has every
  broker holding a part apply it; an abort (or an exception in the ``async with``)
  rolls every part back and leaves the offsets. Starting the producer takes
  ``transactional_id`` over at the coordinator: an older instance is fenced and what
  it left open is rolled back. A transaction still all buffered at its commit (fewer
  than ``flush_messages``, its context never handed out), whose messages and offsets
  one master can hold, is committed by that master alone in one append, over its
  socket (``one_phase``, as the synchronous producer's:
  ``actors.broker.transaction.one_phase``): no half copies, no coordinator.

Half messages travel the producer's data path (:class:`~actors.aio.producer.AsyncProducer`):
idempotent, over each broker's socket on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

from actors.aio.connection import NotWritten, within
from actors.aio.producer import AsyncProducer
from actors.client.send_result import SendResult, SendStatus
from actors.client.transaction import (
    LocalTransactionState,
    TransactionCheckRelay,
    TransactionSendResult,
    decision_of,
    half_of,
    local_state,
    register_check_relay,
    unregister_check_relay,
)
from actors.client.transactional import (
    CoordinatorTries,
    OnePhaseTries,
    TransactionCore,
    TransactionSlot,
    TransactionState,
    TransactionStateError,
    abort_failure_logged,
    commit_arguments,
    one_phase_plan,
    one_phase_target,
    route_again,
    settling_commit,
    warn_if_applied_later,
)
from actors.config.client import ProducerConfig
from actors.coordinator.txn import APPLY_WAIT_S, transaction_coordinator
from actors.protocol import checks
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.errors import InvalidMessageError
from storage.message import Message
from storage.message_id import parse_offset_msg_id

log = logging.getLogger("raymq.actors.aio.transaction")

Checker = Callable[[Message], Awaitable[LocalTransactionState]]
Executor = Callable[[Message], Awaitable[LocalTransactionState]]

_TAKE_WAIT_S = 5.0  # how long one held call on the relay waits for a check
_END_CHUNK = 1024  # checked transactions ended per call on the broker


class AsyncHalf:
    """A half message sent by :meth:`AsyncTransactionalProducer.send_half`: end it."""

    def __init__(self, producer: AsyncTransactionalProducer, send_result: SendResult) -> None:
        self.producer, self.send_result = producer, send_result

    @property
    def msg_id(self) -> str:
        """The transaction's id: the message's id."""
        return self.send_result.msg_id

    async def commit(self) -> bool:
        """Make the message visible; False when the transaction was ended before (by
        a check), and this changed nothing."""
        return await self.producer._end(self.send_result, True)

    async def rollback(self) -> bool:
        """Drop the message; False when the transaction was ended before."""
        return await self.producer._end(self.send_result, False)


class AsyncTransaction(TransactionCore):
    """One multi-message transaction of an :class:`AsyncTransactionalProducer`
    (``begin()``); ``async with`` commits on a clean exit and aborts on an exception.
    What it is and what may be added to it is the synchronous transaction's
    (:class:`~actors.client.transactional.TransactionCore`); its sends and ends are
    awaited here."""

    def __init__(self, producer: AsyncTransactionalProducer, txn_id: str) -> None:
        tid = producer.transactional_id
        assert tid is not None
        super().__init__(txn_id, producer.group, tid, producer.epoch)
        self.producer = producer

    async def send(self, messages: Message | Sequence[Message]) -> None:
        """Add messages (any topics): sent as half messages as the buffer fills and at
        the commit, visible to consumers only after it."""
        self._add(messages)
        if len(self._buffer) >= self.producer.flush_messages:
            await self.flush()

    async def flush(self) -> None:
        """Send what is buffered now (as half messages)."""
        buffer = self._take_buffer()
        if not buffer:
            return
        p = self.producer
        try:
            await p._ready(buffer)
            chunks = p._encoder.encode(buffer, shared=self._marks)
            result = await p._send_encoded(chunks, len(buffer), None)
            halves = result.halves_by_broker()
        except BaseException:
            self.state = TransactionState.FAILED
            raise
        self._flushed(halves, len(buffer))

    async def commit(self, wait: bool = True) -> None:
        """Send what is buffered, then have the coordinator decide COMMIT (durably) and
        the brokers apply it; ``wait`` as the synchronous ``Transaction.commit``.
        Raises ProducerFencedError when a newer instance took the transactional id
        over (the transaction is then aborted).

        A transaction nothing of which was sent yet, its context never handed out, its
        offsets (if any) on one master and its messages able to go to queues of that
        master, is committed by that master alone (see the module doc); when that
        broker cannot (it answers so before writing), the two phases."""
        if await self._commit_one_phase():
            return
        await self.flush()
        p = self.producer
        if self._nothing_to_end():
            self.state = TransactionState.COMMITTED
            p._ended(self)
            return
        halves, offsets = commit_arguments(self)
        with settling_commit(self, p._ended, self):
            answer = await p._call(
                "end", self.txn_id, p.transactional_id, p.epoch, True, halves, offsets, wait
            )
        warn_if_applied_later(self.txn_id, wait, answer)

    async def _commit_one_phase(self) -> bool:
        """The one-phase commit where it applies (see :meth:`commit`): True once done.
        A commit whose answer is lost goes again to the same broker, which stores it
        once; never elsewhere."""
        p = self.producer
        if one_phase_target(self, p.one_phase) is None:
            return False
        try:  # the routes the plan reads, cached off the loop
            await p._ready(self._buffer)
        except Exception as exc:  # noqa: BLE001 - the two phases meet it again, and say so
            log.debug("transaction %s: no routes for a one-phase commit: %s", self.txn_id, exc)
            return False
        plan = one_phase_plan(self, p.one_phase, p._encoder, p._selector)
        if plan is None:
            return False
        tries = OnePhaseTries(self, p, self, plan.broker)
        route: Any = plan.route
        while True:
            try:
                if route is None:  # after a failed try: the master the route names now
                    topic = self._buffer[0].topic
                    route = await asyncio.to_thread(route_again, p.ns, plan.broker, topic)
                actor, handle = await p._master(route, plan.broker)
                answer = await within(
                    p._brokers.call(
                        actor,
                        handle,
                        "commit_one_phase",
                        self.txn_id,
                        p.transactional_id,
                        p.epoch,
                        plan.blob,
                        plan.offsets,
                    ),
                    p.config.send_timeout_s,
                )
                break
            except Exception as exc:  # noqa: BLE001 - sorted by the tries
                pause = tries.failed(
                    exc,
                    transient=isinstance(exc, asyncio.TimeoutError),
                    not_written=isinstance(exc, NotWritten),
                )
                if pause is None:
                    return False
                # the broker's actor may be dead (the data path says so as NotWritten,
                # not as ActorDiedError), and a promoted slave is another actor: the
                # route is read again, and the master's handle looked up again
                route = None
            except BaseException:  # cancelled: whether it is committed is not known
                self.state = TransactionState.FAILED
                raise
            await asyncio.sleep(pause)  # the broker restarts or the connection reopens
        tries.committed(answer)
        return True

    async def abort(self) -> None:
        """Drop what is buffered and roll back what was sent; the offsets stay."""
        if not self._abort_needed():
            return
        p = self.producer
        masters: Iterable[str] = ()
        if self._shared:  # the masters read off the loop (a NameServer call)
            masters = await asyncio.to_thread(p.ns.master_brokers)
        brokers = self._abort_brokers(lambda: masters)
        if brokers:  # each broker finds the transaction's half messages by its id
            await p._call("end", self.txn_id, p.transactional_id, p.epoch, False, brokers, None)
        self.state = TransactionState.ABORTED
        p._ended(self)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.commit()
            return
        with abort_failure_logged(self.txn_id, exc):
            await self.abort()


class AsyncTransactionalProducer(AsyncProducer):
    """Transactions from asyncio code (see the module doc). ``async with`` starts it
    (registers it for checks, takes ``transactional_id`` over) and closes it."""

    def __init__(
        self,
        group: str,
        checker: Checker | None = None,
        *,
        transactional_id: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: ProducerConfig | None = None,
        check_heartbeat_s: float = 10.0,
        coordinator_log_dir: str | None = None,
        txn_timeout_s: float = 60.0,
        flush_messages: int = 1000,
        one_phase: bool = True,
        **options: Any,
    ) -> None:
        if checker is not None and not callable(checker):
            raise InvalidMessageError(f"checker={checker!r}: must be a coroutine function")
        if transactional_id is not None:
            transactional_id = checks.check_str("transactional_id", transactional_id)
        if not isinstance(flush_messages, int) or flush_messages < 1:
            raise InvalidMessageError(f"flush_messages={flush_messages!r}: must be an int >= 1")
        check_heartbeat_s = checks.check_number("check_heartbeat_s", check_heartbeat_s)
        if check_heartbeat_s <= 0:
            raise InvalidMessageError(f"check_heartbeat_s={check_heartbeat_s}: must be > 0")
        super().__init__(
            group, namespace=namespace, nameservers=nameservers, config=config, **options
        )
        self.checker = checker
        self.transactional_id = transactional_id
        self.namespace = namespace
        self.check_heartbeat_s = check_heartbeat_s
        self.flush_messages = flush_messages
        self.one_phase = bool(one_phase)
        self.one_phase_commits = 0  # transactions one broker committed alone
        self.one_phase_refused = 0  # ... that a broker left to the two phases
        self._coordinator_options = {"log_dir": coordinator_log_dir, "txn_timeout_s": txn_timeout_s}
        self.coordinator: Any = None
        self.producer_id: str | None = None
        self.epoch = -1
        # every try of init_producer carries this token: a try the coordinator runs late
        # is answered this instance's epoch instead of taking the next and fencing it
        self.instance_token = uuid.uuid4().hex
        self._apply_wait_s = APPLY_WAIT_S
        self._txns: TransactionSlot[AsyncTransaction] = TransactionSlot()
        self._relay: Any = None
        self._registered: dict[str, Any] = {}  # broker actor name -> handle
        self._beat_key = ("aio-transaction-producer", self.client_id)
        self._check_task: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None

    # ------------------------------------------------------------ life
    async def start(self) -> None:
        """Register for checks (given a checker) and take ``transactional_id`` over
        (given one); the first send does it when ``async with`` did not."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        if self.checker is not None:
            self._relay = TransactionCheckRelay.remote()  # type: ignore[attr-defined]
            await asyncio.to_thread(self.register_with_brokers)
            self.instance.register(
                self._beat_key, self.register_with_brokers, self.check_heartbeat_s
            )
            self._check_task = asyncio.ensure_future(self._check_loop())
        if self.transactional_id is not None:
            self.coordinator = await asyncio.to_thread(
                transaction_coordinator,
                self.namespace,
                nameservers=self.ns.nameservers,
                **self._coordinator_options,  # type: ignore[arg-type]
            )
            self.producer_id, self.epoch = await self._call(
                "init_producer", self.transactional_id, self.instance_token
            )
            # a coordinator older than its settings keeps the default
            with contextlib.suppress(AttributeError):
                self._apply_wait_s = float((await self._call("settings"))["apply_wait_s"])
            log.info(
                "transactional producer %s: id %s epoch %d",
                self.transactional_id,
                self.producer_id,
                self.epoch,
            )

    async def close(self) -> None:
        """Leave the brokers' lists of producers to check with, stop answering checks,
        then close as :meth:`AsyncProducer.close`."""
        if self.closed:
            return
        self.instance.unregister(self._beat_key)
        if self._check_task is not None:
            self._check_task.cancel()
            await asyncio.gather(self._check_task, return_exceptions=True)
        if self._registered:
            await asyncio.to_thread(self._unregister)
        if self._relay is not None:
            import ray

            ray.kill(self._relay)
        await super().close()

    async def __aenter__(self) -> AsyncTransactionalProducer:
        await self.start()
        return self

    # ------------------------------------------------------------ one message
    async def send_half(self, message: Message) -> AsyncHalf:
        """Store ``message`` as a half message (no consumer sees it) and return it to
        be committed or rolled back. Raises what the send raised."""
        if not isinstance(message, Message):
            raise InvalidMessageError(f"message: must be a Message, got {type(message).__name__}")
        await self.start()
        result = (await self.send_batch([half_of(message, self.group)]))[0]
        return AsyncHalf(self, result)

    async def send_message_in_transaction(
        self, message: Message, execute: Executor
    ) -> TransactionSendResult:
        """Send ``message`` as a half message, await ``execute(message)`` (the local
        transaction) and end the transaction as it answers: COMMIT_MESSAGE,
        ROLLBACK_MESSAGE, or UNKNOW (and an exception) left to the check."""
        half = await self.send_half(message)
        if half.send_result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            try:
                state = local_state(await execute(message), "the local transaction")
            except Exception:  # noqa: BLE001 - the broker's check decides then
                log.exception("the local transaction raised: UNKNOW")
                state = LocalTransactionState.UNKNOW
        if state is not LocalTransactionState.UNKNOW:
            try:
                await self._end(half.send_result, state is LocalTransactionState.COMMIT_MESSAGE)
            except Exception as exc:  # noqa: BLE001 - the broker's check resolves it
                log.warning(
                    "ending transaction %s failed (%s): left to the check", half.msg_id, exc
                )
        return TransactionSendResult(half.send_result, state)

    async def _end(self, result: SendResult, commit: bool) -> bool:
        route = await self._route(result.message_queue.topic)
        actor, handle = await self._master(route, result.message_queue.broker_name)
        _, offset = parse_offset_msg_id(result.offset_msg_id)
        return bool(
            await within(
                self._brokers.call(
                    actor, handle, "end_transaction", self.group, offset, result.msg_id, commit
                ),
                self.config.send_timeout_s,
            )
        )

    # ------------------------------------------------------------ checks
    def register_with_brokers(self) -> int:
        """Register the relay with every master broker now (a worker thread's or the
        instance's heartbeat's call); how many took it."""
        return register_check_relay(self, self.ns, self._relay, 3 * self.check_heartbeat_s)

    def _unregister(self) -> None:
        unregister_check_relay(self)

    async def _check_loop(self) -> None:
        """Take the brokers' checks from the relay, answer each with the checker, end
        those it decided with the broker that asked."""
        while not self.closed:
            try:
                requests = await self._relay.take.remote(_TAKE_WAIT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - taken again after a pause
                log.warning("producer %s: taking checks failed: %s", self.group, exc)
                await asyncio.sleep(1.0)
                continue
            answers: dict[str, list[tuple[int, str, bool]]] = {}
            for broker, offset, msg_id, msg in requests:
                commit = await self._local_state(msg)
                if commit is not None:
                    answers.setdefault(broker, []).append((offset, msg_id, commit))
            for broker, ends in answers.items():
                await self._end_checked(broker, ends)

    async def _local_state(self, msg: Message) -> bool | None:
        """The checker's answer: commit (True), roll back (False), or None (UNKNOW, or
        it raised: asked again at the next check)."""
        assert self.checker is not None
        try:
            state = await self.checker(msg)
        except Exception:  # noqa: BLE001 - asked again at the next check
            log.exception("the checker raised: UNKNOW")
            return None
        return decision_of(state)

    async def _end_checked(self, broker: str, ends: list[tuple[int, str, bool]]) -> None:
        try:
            stub = await asyncio.to_thread(self.ns.broker_by_name, broker, self.namespace)
        except Exception as exc:  # noqa: BLE001 - asked again at the next check
            log.warning("ending %d checked transactions: no broker %s (%s)", len(ends), broker, exc)
            return
        handle = getattr(stub, "handle", stub)
        for start in range(0, len(ends), _END_CHUNK):
            chunk = ends[start : start + _END_CHUNK]
            try:
                await within(
                    self._brokers.call(broker, handle, "end_transactions", self.group, chunk),
                    self.config.send_timeout_s,
                )
            except Exception as exc:  # noqa: BLE001 - asked again at the next check
                log.warning(
                    "ending %d checked transactions with %s failed: %s", len(chunk), broker, exc
                )

    # ------------------------------------------------------------ several messages
    def begin(self) -> AsyncTransaction:
        """Start a transaction (one at a time per producer; needs ``transactional_id``
        and a started producer)."""
        if self.transactional_id is None or self.coordinator is None:
            raise TransactionStateError(
                "begin() needs a transactional_id and a started producer (async with, start())"
            )
        return self._txns.begin(self.transactional_id, self.epoch, self._transaction)

    def _transaction(self, txn_id: str) -> AsyncTransaction:
        return AsyncTransaction(self, txn_id)

    def _ended(self, txn: AsyncTransaction) -> None:
        self._txns.ended(txn)

    async def _call(self, method: str, *args: Any) -> Any:
        """A coordinator call through Ray, tried again while the coordinator restarts
        (:class:`~actors.client.transactional.CoordinatorTries`)."""
        tries = CoordinatorTries(method, self.config.send_timeout_s, self._apply_wait_s)
        while True:
            try:
                call = getattr(self.coordinator, method).remote(*args)
                return await within(call, tries.timeout)
            except Exception as exc:  # noqa: BLE001 - sorted by the tries
                timed_out = isinstance(exc, asyncio.TimeoutError)
                await asyncio.sleep(tries.again(exc, transient=timed_out))
