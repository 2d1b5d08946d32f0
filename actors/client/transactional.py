"""Multi-message transactions with consumer offsets (Kafka's transactional producer on
RocketMQ's half messages): ``TransactionalProducer(group, transactional_id=...)``.

::

    producer = TransactionalProducer("etl", transactional_id="etl-1", namespace=ns)
    with producer.begin() as txn:                 # commit on a clean exit, abort on an exception
        txn.send([Message("Out", b"..."), Message("Audit", b"...")])
        txn.send_offsets("etl-in", {mq: next_offset})  # Kafka's sendOffsetsToTransaction

A transaction's messages travel the normal data path (the producer's ``send_batch``,
in batches of ``flush_messages``) as half messages carrying the transaction's id: no
consumer sees them until the commit. One request per transaction, not per message,
goes to the transaction coordinator (``actors.coordinator.txn``), to end it (the
answered sends are the prepare; the decision names their brokers): over the
coordinator's own socket, as sends go over the brokers' (a Ray call while that
connection opens, or with ``data_path="ray"``). The coordinator logs the decision
durably, then has every broker commit (or roll back) all the transaction's half
messages it holds in one append and apply the offsets. A transaction still all
buffered at its commit, whose messages and offsets one master can hold, skips all of
that: the master stores it, committed, in one append (``Transaction.commit``,
``actors.broker.transaction.one_phase``).

Why a class of its own and not ``Producer.begin()``: a transactional producer *is* its
``transactional_id`` at one epoch. Creating it takes the id over at the coordinator
(the previous instance is fenced and what it left open is aborted), as Kafka's
``initTransactions``; a plain producer should pay no coordinator call and be fenced by
nobody.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from ray.exceptions import ActorDiedError, ActorUnavailableError

from actors.client.producer import Producer
from actors.config.client import ProducerConfig
from actors.coordinator.txn import (
    APPLY_WAIT_S,
    TXN_COORDINATOR_NAME,
    TransactionStateError,
    transaction_coordinator,
)
from actors.protocol import checks, rpc
from actors.protocol.data_path import COORDINATOR_REQUESTS
from actors.protocol.errors import OnePhaseRefusedError, refused
from actors.protocol.names import DEFAULT_NAMESPACE
from rebalance import MessageQueue
from storage.codec import EncodedBatch, validate_topic
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    ProducerFencedError,
    RayMQError,
)
from storage.message import Message
from storage.properties import PROP_PRODUCER_GROUP, PROP_TRAN_MSG
from storage.transaction import PROP_GLOBAL_TXN, PROP_TXN_EPOCH, PROP_TXN_PRODUCER

log = logging.getLogger("raymq.actors.client.transactional")

T = TypeVar("T")


class TransactionSlot(Generic[T]):
    """A producer's one transaction at a time, and the ids of its transactions
    (``<transactional id>.<epoch>.<n>.<random>``)."""

    def __init__(self) -> None:
        self.current: T | None = None
        self._counter = itertools.count()

    def begin(self, transactional_id: str, epoch: int, make: Callable[[str], T]) -> T:
        """``make(txn_id)``, now the current transaction; ``TransactionStateError``
        while the last one is still open or failed."""
        current: Any = self.current
        if current is not None and current.state in (
            TransactionState.OPEN,
            TransactionState.FAILED,
        ):
            raise TransactionStateError(
                f"transaction {current.txn_id} is still {current.state.value}: "
                "commit or abort it first"
            )
        txn_id = f"{transactional_id}.{epoch}.{next(self._counter)}.{uuid.uuid4().hex[:8]}"
        self.current = make(txn_id)
        return self.current

    def ended(self, txn: T) -> None:
        """``txn`` is over: the producer may begin another."""
        if self.current is txn:
            self.current = None


def commit_arguments(txn: TransactionCore) -> tuple[dict[str, Any], dict[str, Any]]:
    """A transaction's half messages per broker and its consumed offsets, as the
    coordinator's ``end`` takes them (``broker -> group -> [(topic, queue, offset)]``)."""
    offsets = {
        b: {g: [(t, q, o) for (t, q), o in qs.items()] for g, qs in groups.items()}
        for b, groups in txn._offsets.items()
    }
    return dict(txn._halves), offsets


@contextlib.contextmanager
def settling_commit(txn: TransactionCore, ended: Any, handle: Any) -> Iterator[None]:
    """Around a transaction's ``end`` call: COMMITTED once it returns; ABORTED (and over,
    ``ended(handle)``) when the producer was fenced, FAILED on any other error (the
    outcome unknown: the coordinator decides it)."""
    try:
        yield
    except ProducerFencedError:
        txn.state = TransactionState.ABORTED
        ended(handle)
        raise
    except BaseException:
        txn.state = TransactionState.FAILED
        raise
    txn.state = TransactionState.COMMITTED
    ended(handle)


@contextlib.contextmanager
def abort_failure_logged(txn_id: str, exc: BaseException | None) -> Iterator[None]:
    """Around the abort of a transaction that ``exc`` ended: an abort that fails is
    logged, and ``exc``, the first error, is the one raised."""
    try:
        yield
    except Exception as abort_exc:  # noqa: BLE001 - the first error is the one to see
        log.warning("aborting %s after %r failed: %s", txn_id, exc, abort_exc)


def warn_if_applied_later(txn_id: str, wait: bool, answer: Mapping[str, Any]) -> None:
    if wait and not answer["done"]:
        log.warning(
            "transaction %s committed; a broker applies it later (the coordinator retries)",
            txn_id,
        )


class Backoff:
    """The pauses between tries of one call: 0.05 s, doubling up to 1 s, for at least
    30 s (or ``limit_s``, when longer)."""

    def __init__(self, limit_s: float) -> None:
        self.deadline = time.monotonic() + max(30.0, limit_s)
        self.delay = 0.05

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def pause(self) -> float:
        pause, self.delay = self.delay, min(1.0, self.delay * 2)
        return pause


def coordinator_may_retry(method: str, exc: Exception) -> bool:
    """Ray could not deliver the call or the coordinator's socket broke (it restarts:
    its calls are idempotent), or a new instance waits for its predecessor's decision
    to reach a broker that is restarting (the coordinator retries that meanwhile); any
    other answer is final."""
    if isinstance(exc, BrokerUnavailableError):
        return method == "init_producer" or not refused(exc)
    return not isinstance(exc, RayMQError) and rpc.is_retriable(exc)


class CoordinatorTries(Backoff):
    """The tries of one call on the transaction coordinator, tried again while it
    restarts (its calls are idempotent: a repeated end answers the decision taken)."""

    def __init__(self, method: str, send_timeout_s: float, apply_wait_s: float) -> None:
        super().__init__(send_timeout_s)
        self.method = method
        # an end waits for the brokers up to the coordinator's apply_wait_s before it answers
        self.timeout = send_timeout_s + (apply_wait_s if method == "end" else 0.0)

    def again(self, exc: Exception, *, transient: bool = False) -> float:
        """The pause before the next try after ``exc`` (``transient``, or one
        :func:`coordinator_may_retry` allows); raises ``exc`` when it is final or the
        tries took too long. A restart (Ray's or a broker's) has nothing to wait on."""
        if not (transient or coordinator_may_retry(self.method, exc)) or self.expired():
            raise exc
        log.warning("transaction coordinator %s: %s; trying again", self.method, exc)
        return self.pause()


def one_phase_target(txn: TransactionCore, enabled: bool) -> tuple[str | None, Any] | None:
    """Whether an open transaction commits in one phase: None when it cannot (the
    producer's ``one_phase`` off, nothing buffered, halves sent or its context shared,
    offsets on two brokers); else (the broker holding its offsets or None, the offsets
    as ``commit_one_phase`` takes them: ``group -> [[topic, queue, offset]]``, or None)."""
    txn._require_open()
    if not (enabled and txn._buffer) or txn._halves or txn._shared:
        return None
    if len(txn._offsets) > 1:  # offsets on two brokers: two participants
        return None
    if not txn._offsets:
        return None, None
    target, groups = next(iter(txn._offsets.items()))
    return target, {g: [[t, q, o] for (t, q), o in qs.items()] for g, qs in groups.items()}


UNAVAILABLE_GRACE_S = 2.0
"""How long a broker's actor may answer ``ActorUnavailableError`` (Ray restarting it,
or its node out of reach) before a one-phase commit looks the broker up again."""


class OnePhaseTries(Backoff):
    """The tries of one transaction's one-phase commit on its broker, whoever makes the
    call (a thread or an event loop): what a failed try means, the pause before the
    next, and the end. ``txn`` is the :class:`Transaction` (its state and buffer),
    ``producer`` what counts the commits and ends it (``_ended(handle)``).

    A try that found the broker's actor dead (``ActorDiedError``, or
    ``ActorUnavailableError`` for :data:`UNAVAILABLE_GRACE_S`) sets :attr:`gone` and
    drops the actor's cached handle: a dead handle never comes back, and a broker
    started again under its name is another actor, so the next try looks the broker
    up by name again and reaches the new one as soon as it is there."""

    def __init__(self, txn: TransactionCore, producer: Any, handle: Any, broker: str) -> None:
        super().__init__(producer.config.send_timeout_s)
        self.txn, self.producer, self.handle, self.broker = txn, producer, handle, broker
        self.unknown = False  # a try may have been stored: never the two phases now
        self.gone = False  # the last try found the broker's actor dead: look it up again
        self._unavailable_since: float | None = None

    def failed(self, exc: Exception, *, transient: bool, not_written: bool = False) -> float | None:
        """After a try that raised ``exc``: None when nothing of the commit was written
        anywhere (refused before writing, a slave now, ``not_written``: the two phases
        take it over, and their sends find the master); else the pause before the same
        commit again to the same broker, which answers a repeat without writing it twice
        (``exc`` a broker unavailable, ``transient``, or a refusal once a try may have
        been stored). Raises what is final: the producer fenced (ABORTED), any other
        error or the deadline passed (FAILED)."""
        txn = self.txn
        if isinstance(exc, ProducerFencedError):
            txn.state = TransactionState.ABORTED
            self.producer._ended(self.handle)
            raise exc
        if not self.unknown and (
            isinstance(exc, OnePhaseRefusedError)
            or not_written
            or (isinstance(exc, BrokerUnavailableError) and refused(exc))
        ):
            log.debug("transaction %s: %s", txn.txn_id, exc)
            self.producer.one_phase_refused += 1
            return None
        if isinstance(exc, RayMQError) and refused(exc):
            if not isinstance(exc, OnePhaseRefusedError):
                txn.state = TransactionState.FAILED  # an answer: final
                raise exc
        elif not (isinstance(exc, BrokerUnavailableError) or transient):
            txn.state = TransactionState.FAILED
            raise exc
        self.unknown = True
        if self.expired():
            txn.state = TransactionState.FAILED
            raise BrokerUnavailableError(
                f"transaction {txn.txn_id}: broker {self.broker} did not answer its commit "
                f"({exc!r}); whether it is committed is not known"
            ) from exc
        self.gone = self._actor_gone(exc)
        log.warning(
            "transaction %s: commit on %s: %r; again%s",
            txn.txn_id,
            self.broker,
            exc,
            " (its actor looked up again)" if self.gone else "",
        )
        return self.pause()

    def _actor_gone(self, exc: Exception) -> bool:
        """Whether ``exc`` says the broker's actor is dead (or unavailable past its
        grace); if so, its cached handle is dropped (by the name the cached route of
        the transaction's first topic gives its master; no call is made)."""
        if isinstance(exc, ActorUnavailableError):
            now = time.monotonic()
            if self._unavailable_since is None:
                self._unavailable_since = now
            if now - self._unavailable_since < UNAVAILABLE_GRACE_S:
                return False
        elif not isinstance(exc, ActorDiedError):
            self._unavailable_since = None
            return False
        self._unavailable_since = None
        ns = self.producer.ns
        with contextlib.suppress(Exception):  # no cached route: nothing cached to drop
            route = ns.names.cached_route(self.txn._buffer[0].topic)
            bd = route.broker(self.broker) if route is not None else None
            actor = bd.master_actor_name() if bd is not None else None
            if actor is not None:
                ns.forget_broker(actor)
        return True

    def committed(self, answer: Mapping[str, Any]) -> None:
        """The broker answered the commit: the buffer is sent, the transaction over."""
        txn = self.txn
        txn.sent += len(txn._buffer)
        txn._buffer = []
        txn.state = TransactionState.COMMITTED
        self.producer.one_phase_commits += 1
        self.producer._ended(self.handle)
        if answer.get("again"):
            log.info("transaction %s was committed already on %s", txn.txn_id, self.broker)


ONE_PHASE_MAX_BYTES = 4 << 20
"""A transaction's messages over this many encoded bytes commit in two phases."""


def one_phase_batch(
    encoder: Any, selector: Any, messages: Sequence[Message], broker: str | None = None
) -> tuple[Any, str, bytes] | None:
    """Where ``messages`` go as one broker's one-phase commit: (the route, the broker's
    name, the encoded batch), each topic's messages to one queue of that broker
    (``broker``, the one holding the transaction's offsets; else where a send of the
    first topic would go); None when not every topic has a queue there (or the batch is
    too large for one append). The routes must be cached in ``selector``."""
    chunks = encoder.encode(messages, numbered=False)
    picked: dict[str, MessageQueue] = {}
    if broker is None:
        mq, route, _ = selector.select(chunks[0].topic, None, None)
        broker = mq.broker_name
        picked[chunks[0].topic] = mq
    else:
        route = selector.route(chunks[0].topic)[0]
    bound = []
    for chunk in chunks:
        q = picked.get(chunk.topic)
        if q is None:
            queues = [
                m
                for m in selector.write_queues(selector.route(chunk.topic)[0])
                if m.broker_name == broker
            ]
            if not queues:
                return None
            q = picked[chunk.topic] = random.choice(queues)
        bound.append(chunk.batch.with_queue(q.queue_id))
    blob = EncodedBatch.wire_of(bound)
    if len(blob) > ONE_PHASE_MAX_BYTES:
        return None
    return route, broker, blob


@dataclasses.dataclass(frozen=True)
class OnePhasePlan:
    """A transaction as one broker's one-phase commit: that broker's route and name,
    the encoded batch and the offsets, as ``commit_one_phase`` takes them."""

    route: Any
    broker: str
    blob: bytes
    offsets: Any


def one_phase_plan(
    txn: TransactionCore, enabled: bool, encoder: Any, selector: Any
) -> OnePhasePlan | None:
    """The one-phase commit of an open transaction (:func:`one_phase_target`,
    :func:`one_phase_batch`); None when it does not apply, or when the plan fails (the
    two phases meet the error again, and say so). The routes must be cached in
    ``selector``."""
    where = one_phase_target(txn, enabled)
    if where is None:
        return None
    target, offsets = where
    try:
        plan = one_phase_batch(encoder, selector, txn._buffer, target)
    except Exception as exc:  # noqa: BLE001 - the two phases meet it again
        log.debug("transaction %s: no one-phase plan: %s", txn.txn_id, exc)
        return None
    return None if plan is None else OnePhasePlan(*plan, offsets)


def route_again(ns: Any, broker: str, topic: str) -> Any:
    """``topic``'s route read again from the NameServers after ``broker``'s master's
    actor was found dead (a broker started again under its name is another actor; a
    promoted slave another name), the dead actor's handle dropped. Blocking (the
    awaited producer runs it on a thread). Raises ``BrokerUnavailableError`` while no
    NameServer gives one."""
    ns.forget_topic_broker(topic, broker)
    try:
        route = ns.route(topic)
    except Exception as exc:  # noqa: BLE001 - no NameServer answered: try again later
        raise BrokerUnavailableError(f"no route of {topic!r}: {exc!r}") from exc
    if route is None:
        raise BrokerUnavailableError(f"no route of {topic!r}")
    return route


def _master_again(ns: Any, broker: str, topic: str) -> Any:
    """The connection to ``broker``'s master after its actor was found dead, by
    ``topic``'s route read again (:func:`route_again`)."""
    return ns.broker(route_again(ns, broker, topic), broker)


__all__ = [
    "ProducerFencedError",
    "Transaction",
    "TransactionContext",
    "TransactionState",
    "TransactionStateError",
    "TransactionalProducer",
]


class TransactionState(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    FAILED = "failed"  # a send or the commit failed: abort() is what is left


@dataclasses.dataclass(frozen=True)
class TransactionContext:
    """What another process needs to send half messages *into* an open transaction
    (``Transaction.context()``; picklable): the properties that mark a message as the
    transaction's. That process sends them with a plain Producer and hands where they
    were stored back to the transaction's owner (``Transaction.add_halves``); only
    halves handed back are committed. Spark's executors write this way
    (``actors.bridge.write``)."""

    txn_id: str
    transactional_id: str
    epoch: int
    group: str

    def properties(self) -> dict[str, str]:
        return {
            PROP_TRAN_MSG: "true",
            PROP_PRODUCER_GROUP: self.group,
            PROP_GLOBAL_TXN: self.txn_id,
            PROP_TXN_PRODUCER: self.transactional_id,
            PROP_TXN_EPOCH: str(self.epoch),
        }


class TransactionCore:
    """What a multi-message transaction is, whoever makes its calls (a thread:
    :class:`Transaction`; an event loop: ``actors.aio.transaction.AsyncTransaction``):
    its id and state, the messages buffered, the half messages sent per broker, the
    offsets to commit with it, and the checks of what is added. No I/O here: the sends
    and the ends are the subclass's."""

    def __init__(self, txn_id: str, group: str, transactional_id: str, epoch: int) -> None:
        self.txn_id = txn_id
        self.state = TransactionState.OPEN
        self._owner = (group, transactional_id, epoch)
        self._buffer: list[Message] = []
        # broker -> its half messages (CommitLog offsets, or ids where not known)
        self._halves: dict[str, list[int | str] | None] = {}
        self._offsets: dict[str, dict[str, dict[tuple[str, int], int]]] = {}
        self._shared = False  # context() was handed out: others may have sent halves
        self.sent = 0
        self._marks = {  # what makes a message one of this transaction's half messages
            PROP_TRAN_MSG: "true",
            PROP_PRODUCER_GROUP: group,
            PROP_GLOBAL_TXN: txn_id,
            PROP_TXN_PRODUCER: transactional_id,
            PROP_TXN_EPOCH: str(epoch),
        }

    # ------------------------------------------------------------ building
    def _require_open(self) -> None:
        if self.state is not TransactionState.OPEN:
            raise TransactionStateError(f"transaction {self.txn_id} is {self.state.value}")

    def _add(self, messages: Message | Sequence[Message]) -> None:
        """Buffer ``messages``, each checked first: a refused one changes nothing."""
        self._require_open()
        batch = [messages] if isinstance(messages, Message) else list(messages)
        for m in batch:  # the usual mistakes refused here, before the buffer changes
            if not isinstance(m, Message):
                raise InvalidMessageError(f"a transaction sends Messages, got {type(m).__name__}")
            validate_topic(m.topic)
            if not isinstance(m.body, (bytes, bytearray, memoryview)) or not len(m.body):
                raise InvalidMessageError(f"a message to {m.topic!r}: body must be non-empty bytes")
            if m.delay_level or (m.properties and "TIMER_DELIVER_MS" in m.properties):
                raise InvalidMessageError(
                    f"a message to {m.topic!r} with a delay: transactions do not delay"
                )
        self._buffer.extend(batch)

    def _take_buffer(self) -> list[Message]:
        """What is buffered, to be sent now as half messages (the buffer empties)."""
        self._require_open()
        buffer, self._buffer = self._buffer, []
        return buffer

    def _flushed(self, halves: Mapping[str, Sequence[int | str]], count: int) -> None:
        """``count`` messages taken from the buffer were stored as ``halves``."""
        self._name_halves(halves)
        self.sent += count

    def _name_halves(self, halves: Mapping[str, Sequence[int | str]]) -> None:
        for broker, refs in halves.items():
            known = self._halves.setdefault(broker, [])
            if known is None or any(isinstance(r, int) and r < 0 for r in refs):
                # no offset and no id: the broker takes every pending half of the
                # transaction (a failed attempt's too, when the context was shared)
                self._halves[broker] = None
            else:
                known.extend(refs)

    def context(self) -> TransactionContext:
        """The transaction as other processes join it (see :class:`TransactionContext`):
        they send half messages marked with its ``properties()`` and hand where they
        were stored back through :meth:`add_halves`; only those are committed."""
        self._require_open()
        self._shared = True
        group, transactional_id, epoch = self._owner
        return TransactionContext(self.txn_id, transactional_id, epoch, group)

    def add_halves(self, halves: Mapping[str, Sequence[int | str]], count: int) -> None:
        """Take ``count`` half messages another process sent with this transaction's
        :meth:`context` (``halves``: broker -> their CommitLog offsets, or the message
        id of one whose offset a retried send did not learn, as
        ``BatchSendResult.halves_by_broker`` gives them) into the commit. Half messages
        of the transaction never handed here are not committed: the check service rolls
        them back once the transaction is done (a failed attempt's). A -1 offset (what
        ``commitlog_offsets_by_broker`` says of an unknown one) makes the commit take
        every pending half message of the transaction on that broker, a failed
        attempt's included: hand ids instead."""
        self._require_open()
        count = checks.check_int("count", count, 0)
        checked = {
            checks.check_str("broker", b): [
                checks.check_str("half message id", o)
                if isinstance(o, str)
                else checks.check_int("half offset", o, -1)
                for o in offs
            ]
            for b, offs in halves.items()
        }
        self._flushed(checked, count)

    def send_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        """Commit ``group``'s offsets (``{queue: next offset to consume}``) with the
        transaction (Kafka's ``sendOffsetsToTransaction``): moved on commit, unchanged on
        abort. A later call for the same queue replaces the offset."""
        self._require_open()
        group = checks.validate_group(group)
        checked = []
        for mq, offset in offsets.items():
            if not isinstance(mq, MessageQueue):
                raise InvalidMessageError(f"offsets: keys must be MessageQueues, got {mq!r}")
            checked.append((mq, checks.check_int("offset", offset, 0)))
        for mq, offset in checked:
            queues = self._offsets.setdefault(mq.broker_name, {}).setdefault(group, {})
            queues[(mq.topic, mq.queue_id)] = offset

    # ------------------------------------------------------------ ending
    def _nothing_to_end(self) -> bool:
        """Whether the commit has nothing for the coordinator (no halves, no offsets)."""
        return not self._halves and not self._offsets

    def _abort_needed(self) -> bool:
        """Whether an abort has anything to do (not once ABORTED; refused once
        COMMITTED); the buffer is dropped."""
        if self.state is TransactionState.COMMITTED:
            raise TransactionStateError(f"transaction {self.txn_id} is committed")
        if self.state is TransactionState.ABORTED:
            return False
        self._buffer.clear()
        return True

    def _abort_brokers(self, masters: Callable[[], Iterable[str]]) -> dict[str, None]:
        """The brokers an abort ends the transaction on: those holding its half messages
        and, once its context was handed out, every master (``masters()``): a half
        message sent there and never handed back (a failed task's) may be on any."""
        brokers: dict[str, None] = dict.fromkeys(self._halves)
        if self._shared:
            brokers.update(dict.fromkeys(masters()))
        return brokers


class Transaction(TransactionCore):
    """One multi-message transaction of a :class:`TransactionalProducer` (``begin()``)."""

    def __init__(self, producer: TransactionalProducer, txn_id: str) -> None:
        super().__init__(txn_id, producer.group, producer.transactional_id, producer.epoch)
        self.producer = producer

    def send(self, messages: Message | Sequence[Message]) -> None:
        """Add messages (any topics); they are sent in batches as the buffer fills and
        at the commit, visible to consumers only after it."""
        self._add(messages)
        if len(self._buffer) >= self.producer.flush_messages:
            self.flush()

    def flush(self) -> None:
        """Send what is buffered now (as half messages)."""
        buffer = self._take_buffer()
        if not buffer:
            return
        try:  # the marks go on every message as it is encoded: one encoding per batch
            stored = self.producer._send_marked(buffer, self._marks).halves_by_broker()
        except BaseException:
            self.state = TransactionState.FAILED
            raise
        self._flushed(stored, len(buffer))

    # ------------------------------------------------------------ ending
    def commit(self, wait: bool = True) -> None:
        """Send what is buffered, then have the coordinator decide COMMIT (durably) and
        the brokers apply it. ``wait`` False returns once the decision is logged (Kafka's
        semantics: the outcome is fixed, the messages and offsets show a moment later,
        in commit order); True (the default) once every broker shows them, or after
        the coordinator's ``apply_wait_s`` with a broker down (the commit stands, logged
        here; the coordinator retries that broker until it shows them). Raises
        ProducerFencedError when a newer instance took the ``transactional_id`` over
        (the transaction is then aborted).

        A transaction nothing of which was sent yet (its messages buffered: fewer than
        ``flush_messages``), no shared context, its offsets (if any) on one master, and
        its messages able to go to queues of that master, is committed by that master
        alone in one append with its offsets (``actors.broker.transaction.one_phase``): no half
        copies, no coordinator. Otherwise, or when that broker cannot (it answers so
        before writing), the two phases."""
        if self._commit_one_phase():
            return
        self.flush()
        if self._nothing_to_end():
            self.state = TransactionState.COMMITTED
            self.producer._ended(self)
            return
        p = self.producer
        halves, offsets = commit_arguments(self)
        with settling_commit(self, p._ended, self):
            answer = p._call(
                "end", self.txn_id, p.transactional_id, p.epoch, True, halves, offsets, wait
            )
        warn_if_applied_later(self.txn_id, wait, answer)

    def _commit_one_phase(self) -> bool:
        """The one-phase commit where it applies (see :meth:`commit`): True once done."""
        p = self.producer
        plan = one_phase_plan(self, p.one_phase, p._encoder, p._sender.selector)
        if plan is None:
            return False
        tries = OnePhaseTries(self, p, self, plan.broker)
        handle: Any = None
        while True:
            try:
                if handle is None:  # first by the plan's route; after a dead actor, anew
                    handle = (
                        _master_again(p.ns, plan.broker, self._buffer[0].topic)
                        if tries.unknown
                        else p.ns.broker(plan.route, plan.broker)
                    )
                answer = rpc.get(
                    handle.commit_one_phase.remote(
                        self.txn_id, p.transactional_id, p.epoch, plan.blob, plan.offsets
                    ),
                    p.config.send_timeout_s,
                )
                break
            except Exception as exc:  # noqa: BLE001 - sorted by the tries
                pause = tries.failed(
                    exc, transient=rpc.is_retriable(exc), not_written=handle is None
                )
                if pause is None:
                    return False
                if tries.gone:
                    handle = None  # a dead handle never comes back: look the broker up
                time.sleep(pause)  # the broker restarts or the connection reopens
        tries.committed(answer)
        return True

    def abort(self) -> None:
        """Drop what is buffered and roll back what was sent; the offsets stay."""
        if not self._abort_needed():
            return
        p = self.producer
        brokers = self._abort_brokers(p.ns.master_brokers)
        if brokers:  # each broker finds the transaction's half messages by its id
            p._call("end", self.txn_id, p.transactional_id, p.epoch, False, brokers, None)
        self.state = TransactionState.ABORTED
        p._ended(self)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
            return
        with abort_failure_logged(self.txn_id, exc):
            self.abort()


class TransactionalProducer(Producer):
    """A producer of multi-message transactions under ``transactional_id`` (see the
    module doc). Creating one fences every earlier instance with the same id."""

    def __init__(
        self,
        group: str,
        *,
        transactional_id: str,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: ProducerConfig | None = None,
        coordinator_log_dir: str | None = None,
        txn_timeout_s: float = 60.0,
        flush_messages: int = 1000,
        one_phase: bool = True,
        **options: Any,
    ) -> None:
        self.transactional_id = checks.check_str("transactional_id", transactional_id)
        if not isinstance(flush_messages, int) or flush_messages < 1:
            raise InvalidMessageError(f"flush_messages={flush_messages!r}: must be an int >= 1")
        super().__init__(
            group, namespace=namespace, nameservers=nameservers, config=config, **options
        )
        self.flush_messages = flush_messages
        self.one_phase = bool(one_phase)
        self.one_phase_commits = 0  # transactions one broker committed alone
        self.one_phase_refused = 0  # ... that a broker left to the two phases
        self.coordinator = transaction_coordinator(
            namespace,
            log_dir=coordinator_log_dir,
            nameservers=self.ns.nameservers,
            txn_timeout_s=txn_timeout_s,
        )
        # commits and aborts go over the coordinator's own socket (TXN_END) once it is
        # open, as sends go over the brokers'; init_producer stays a Ray call
        self._coordinator = self._data_path.wrap(
            TXN_COORDINATOR_NAME, self.coordinator, requests=COORDINATOR_REQUESTS
        )
        self._apply_wait_s = APPLY_WAIT_S
        # this instance's token: every try of init_producer carries it, so one that the
        # coordinator runs late (Ray keeps no order of an async actor's calls) is
        # answered this instance's epoch instead of taking the next and fencing it
        self.instance_token = uuid.uuid4().hex
        self.producer_id, self.epoch = self._call(
            "init_producer", self.transactional_id, self.instance_token
        )
        # the coordinator this call found may have been made with another wait (one
        # older than its settings keeps the default)
        with contextlib.suppress(AttributeError):
            self._apply_wait_s = float(self._call("settings")["apply_wait_s"])
        self._txns: TransactionSlot[Transaction] = TransactionSlot()
        log.info(
            "transactional producer %s: id %s epoch %d",
            self.transactional_id,
            self.producer_id,
            self.epoch,
        )

    def _call(self, method: str, *args: Any) -> Any:
        """A coordinator call, tried again while the coordinator restarts
        (:class:`CoordinatorTries`)."""
        tries = CoordinatorTries(method, self.config.send_timeout_s, self._apply_wait_s)
        while True:
            try:
                return rpc.get(getattr(self._coordinator, method).remote(*args), tries.timeout)
            except Exception as exc:  # noqa: BLE001 - sorted by the tries
                time.sleep(tries.again(exc))

    def begin(self) -> Transaction:
        """Start a transaction (one at a time per producer); no Ray call."""
        return self._txns.begin(self.transactional_id, self.epoch, self._transaction)

    def _transaction(self, txn_id: str) -> Transaction:
        return Transaction(self, txn_id)

    def _ended(self, txn: Transaction) -> None:
        self._txns.ended(txn)
