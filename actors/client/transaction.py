"""The transactional producer: RocketMQ's ``TransactionMQProducer``.

``send_message_in_transaction(msg, arg)`` sends ``msg`` as a half message
(``TRAN_MSG=true``, ``PGROUP=<group>``: the broker keeps it out of its topic,
``actors.broker.processor.end_transaction``), runs the listener's
``execute_local_transaction(msg, arg)``, and ends the transaction with the broker that
holds the half message: COMMIT_MESSAGE makes it visible, ROLLBACK_MESSAGE drops it,
UNKNOW (or an exception in the executor) leaves it to the broker's check.

The check comes back to this process: the producer creates a small relay actor
(:class:`TransactionCheckRelay`, owned by this process, so it dies with it) and
registers its handle with every master broker, renewing it every
``check_heartbeat_s``. A broker checking a half message calls the relay, which only
queues the request; a thread of the producer holds a call on the relay until
requests arrive, runs ``check_local_transaction(msg)`` here, where the user's local
state lives (a listener shipped to an actor would check a copy of it), and ends the
transaction with the broker that asked. No polling: the held call returns as soon as
a check is queued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from actors.client.producer import Producer
from actors.client.send_result import SendResult, SendStatus
from actors.config.client import ProducerConfig
from actors.protocol import rpc
from actors.protocol.names import DEFAULT_NAMESPACE
from storage.errors import InvalidMessageError
from storage.message import Message
from storage.message_id import parse_offset_msg_id
from storage.properties import PROP_PRODUCER_GROUP, PROP_TRAN_MSG

log = logging.getLogger("raymq.actors.client.transaction")

_TAKE_WAIT_S = 5.0  # how long one held call on the relay waits for a check
_END_CHUNK = 1024  # checked transactions ended per call on the broker


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


class TransactionListener(Protocol):
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, msg: Message) -> LocalTransactionState: ...


@dataclass(frozen=True)
class TransactionSendResult:
    """The half message's send result and what the local transaction answered."""

    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        """The transaction's id: the message's id."""
        return self.send_result.msg_id


@ray.remote(num_cpus=0)
class TransactionCheckRelay:
    """Where brokers leave check requests for one producer, which takes them with a held
    call (an async actor: many brokers may call while the producer waits)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, int, str, Message]] = asyncio.Queue()

    async def check(self, broker: str, commitlog_offset: int, msg_id: str, msg: Message) -> None:
        self._queue.put_nowait((broker, commitlog_offset, msg_id, msg))

    async def check_many(self, broker: str, checks: list[tuple[int, str, Message]]) -> None:
        """A broker's check round: ``checks`` holds (CommitLog offset, message id, message)."""
        for commitlog_offset, msg_id, msg in checks:
            self._queue.put_nowait((broker, commitlog_offset, msg_id, msg))

    async def take(self, wait_s: float) -> list[tuple[str, int, str, Message]]:
        """The queued check requests, waiting up to ``wait_s`` for the first."""
        try:
            first = await asyncio.wait_for(self._queue.get(), wait_s)
        except asyncio.TimeoutError:
            return []
        out = [first]
        while not self._queue.empty():
            out.append(self._queue.get_nowait())
        return out


def half_of(msg: Message, group: str) -> Message:
    """``msg`` as the half message of a transaction of producer ``group``."""
    props = dict(msg.properties or {})
    props[PROP_TRAN_MSG] = "true"
    props[PROP_PRODUCER_GROUP] = group
    return dataclasses.replace(msg, properties=props, delay_level=0)


def local_state(state: object, what: str) -> LocalTransactionState:
    """What the local transaction (``what``) answered, as a state: anything but a
    :class:`LocalTransactionState` is UNKNOW (logged), left to the broker's check."""
    if isinstance(state, LocalTransactionState):
        return state
    log.warning("%s answered %r: UNKNOW", what, state)
    return LocalTransactionState.UNKNOW


def decision_of(state: object) -> bool | None:
    """A checked transaction's end as its local state says: commit (True), roll back
    (False), or None (UNKNOW or anything else: asked again at the next check)."""
    if state is LocalTransactionState.COMMIT_MESSAGE:
        return True
    if state is LocalTransactionState.ROLLBACK_MESSAGE:
        return False
    return None


class TransactionProducer(Producer):
    """A Producer that also sends messages in transactions (RocketMQ's semantics)."""

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        nameservers: Sequence[str] | None = None,
        config: ProducerConfig | None = None,
        check_heartbeat_s: float = 10.0,
        end_oneway: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(
            group, namespace=namespace, nameservers=nameservers, config=config, **options
        )
        if check_heartbeat_s <= 0:
            raise InvalidMessageError(f"check_heartbeat_s={check_heartbeat_s}: must be > 0")
        self.listener = listener
        # True (RocketMQ's way): the end of a transaction is sent and not waited for, so a
        # transaction costs one round trip; a lost end leaves the half message to the
        # broker's check. False: send_message_in_transaction returns once the broker
        # applied the end (a commit is visible to consumers when it returns).
        self.end_oneway = end_oneway
        self.namespace = namespace
        self.check_heartbeat_s = check_heartbeat_s
        self._relay = TransactionCheckRelay.remote()  # type: ignore[attr-defined]
        self._stopping = threading.Event()
        self._registered: dict[str, Any] = {}  # broker actor name -> handle
        self.register_with_brokers()
        # registered again every check_heartbeat_s by the instance's heartbeat thread
        self._beat_key = ("transaction-producer", self.client_id)
        self.instance.register(self._beat_key, self.register_with_brokers, check_heartbeat_s)
        self._threads = [
            threading.Thread(target=self._check_loop, name="txn-check", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------ sending
    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Send ``msg`` as a half message, run the local transaction, end it with the broker."""
        if not isinstance(msg, Message):
            raise InvalidMessageError(f"msg: must be a Message, got {type(msg).__name__}")
        result = self.send(half_of(msg, self.group))
        if result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            try:
                answered = self.listener.execute_local_transaction(msg, arg)
                state = local_state(answered, "execute_local_transaction")
            except Exception:  # noqa: BLE001 - the broker's check decides then
                log.exception("execute_local_transaction raised: UNKNOW")
                state = LocalTransactionState.UNKNOW
        if state is not LocalTransactionState.UNKNOW:
            try:
                self._end(result, state)
            except Exception as exc:  # noqa: BLE001 - the broker's check resolves it
                log.warning("ending transaction %s failed (%s): left to the check", result, exc)
        return TransactionSendResult(result, state)

    def _end(self, result: SendResult, state: LocalTransactionState) -> None:
        route, _ = self._selector.route(result.message_queue.topic)
        handle = self.ns.broker(route, result.message_queue.broker_name)
        _, offset = parse_offset_msg_id(result.offset_msg_id)
        commit = state is LocalTransactionState.COMMIT_MESSAGE
        end = handle.end_transaction
        if self.end_oneway:  # RocketMQ's endTransactionOneway: a lost end is checked back
            oneway = getattr(end, "oneway", None)
            if oneway is not None:
                oneway(self.group, offset, result.msg_id, commit)
            else:  # a Ray handle (data_path="ray"): the call made, its answer dropped
                end.remote(self.group, offset, result.msg_id, commit)
            return
        rpc.get(end.remote(self.group, offset, result.msg_id, commit), self.config.send_timeout_s)

    # ------------------------------------------------------------ checks
    def register_with_brokers(self) -> int:
        """Register the relay with every master broker now; how many took it."""
        return register_check_relay(self, self.ns, self._relay, 3 * self.check_heartbeat_s)

    def _check_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                requests = ray.get(self._relay.take.remote(_TAKE_WAIT_S))
            except Exception as exc:  # noqa: BLE001
                if self._stopping.is_set():
                    return
                log.warning("producer %s: taking checks failed: %s", self.group, exc)
                self._stopping.wait(1.0)
                continue
            answers: dict[str, list[tuple[int, str, bool]]] = {}
            for broker, offset, msg_id, msg in requests:
                commit = self._local_state(msg)
                if commit is not None:
                    answers.setdefault(broker, []).append((offset, msg_id, commit))
            for broker, ends in answers.items():
                self._end_checked(broker, ends)

    def _local_state(self, msg: Message) -> bool | None:
        """The listener's answer to a check: commit (True), roll back (False), or None
        (UNKNOW, or it raised: asked again at the next check)."""
        try:
            state = self.listener.check_local_transaction(msg)
        except Exception:  # noqa: BLE001 - asked again at the next check
            log.exception("check_local_transaction raised: UNKNOW")
            return None
        return decision_of(state)

    def _end_checked(self, broker: str, ends: list[tuple[int, str, bool]]) -> None:
        """End the checked transactions with the broker that asked: one call per
        ``_END_CHUNK`` of them (each one append there)."""
        try:
            handle = self.ns.broker_by_name(broker, self.namespace)
        except Exception as exc:  # noqa: BLE001 - asked again at the next check
            log.warning("ending %d checked transactions: no broker %s (%s)", len(ends), broker, exc)
            return
        for start in range(0, len(ends), _END_CHUNK):
            chunk = ends[start : start + _END_CHUNK]
            try:
                rpc.get(
                    handle.end_transactions.remote(self.group, chunk), self.config.send_timeout_s
                )
            except Exception as exc:  # noqa: BLE001 - asked again at the next check
                log.warning(
                    "ending %d checked transactions with %s failed: %s", len(chunk), broker, exc
                )

    def close(self, timeout_s: float | None = None) -> None:
        """Leave the brokers' lists of producers to check with, stop the threads, close."""
        self._stopping.set()
        self.instance.unregister(self._beat_key)
        unregister_check_relay(self)
        ray.kill(self._relay)  # ends the check thread's held call
        for t in self._threads:
            t.join(timeout=_TAKE_WAIT_S + 1)
        super().close(timeout_s)


class _RelayOwner(Protocol):
    """What registering a check relay needs of the producer that owns it (the threaded
    and the asyncio transaction producers both are one)."""

    group: str
    client_id: str
    config: ProducerConfig
    _registered: dict[str, Any]


def register_check_relay(owner: _RelayOwner, ns: Any, relay: Any, ttl_s: float) -> int:
    """Register ``relay`` (where brokers send their checks of ``owner``'s half messages)
    with every master broker ``ns`` knows, for ``ttl_s``; how many took it. Blocking: a
    thread's (or the client instance's heartbeat's) call."""
    try:
        masters = ns.master_brokers()
    except Exception as exc:  # noqa: BLE001 - the next beat tries again
        log.warning("producer %s: no broker list (%s)", owner.group, exc)
        return 0
    refs = [
        (name, h.register_transaction_producer.remote(owner.group, owner.client_id, relay, ttl_s))
        for name, h in masters.items()
    ]
    done = 0
    for name, ref in refs:
        try:
            rpc.get(ref, owner.config.send_timeout_s)
            owner._registered[name] = masters[name]
            done += 1
        except Exception as exc:  # noqa: BLE001 - a broker restarting: the next beat
            log.info("producer %s: registering with %s failed: %s", owner.group, name, exc)
    return done


def unregister_check_relay(owner: _RelayOwner) -> None:
    """Leave the check lists of the brokers ``owner`` registered with (blocking)."""
    for name, handle in owner._registered.items():
        try:
            rpc.get(
                handle.unregister_transaction_producer.remote(owner.group, owner.client_id),
                owner.config.send_timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - it expires there anyway
            log.info("producer %s: unregistering from %s failed: %s", owner.group, name, exc)
