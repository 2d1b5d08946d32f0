"""The transaction coordinator: multi-message transactions over several brokers, with
consumer offsets, decided once and durably (two-phase commit), and fencing of zombie
producers (Kafka's ``TransactionCoordinator`` on RocketMQ's half messages).

One detached actor per cluster (``txn-coordinator`` in the cluster's namespace, on the
head node, restarted by Ray), its state in a :class:`~storage.txn_log.TransactionLog`
on that node. What it does:

* **Producers.** :meth:`init_producer` gives a new instance of a ``transactional_id``
  its next epoch (logged, fsynced, with the instance's token) and raises every master's
  fence (``Broker.fence_transactional``): the old instance's half messages are refused
  there from then on, and those it left pending are rolled back; its commits here are
  refused too (ProducerFencedError). The same instance asking again (a retried call,
  one that ran late: Ray runs an async actor's calls in any order) is answered the
  epoch it was given, never the next one: an instance is fenced only by another.
* **Participants.** Not named ahead: a producer's half messages are durable on their
  brokers once its sends are answered (that is the *prepare* of this two-phase commit),
  and the decision names where they are. A transaction this coordinator has not
  decided is unknown here until then (no call before its sends, unlike Kafka's
  ``AddPartitionsToTxn``): a broker's check of an old half message asks
  :meth:`resolve`, which answers ``abort`` for one whose producer was fenced, aborts
  (logged, so a late commit is refused) one whose first half message is older than
  ``txn_timeout_s``, and answers ``open`` otherwise.
* **Decision.** :meth:`end` logs COMMIT (with each broker's half messages and the
  consumer offsets to commit) or ABORT, fsynced: from then the outcome is fixed. Then it
  tells each participant (``Broker.end_transaction_batch``: every half message of the
  transaction there committed or rolled back in one append, and on commit the offsets
  applied) and logs ``done`` when all have answered.
* **Recovery.** After its own restart it replays the log and applies every decision not
  done (a crash between logging COMMIT and telling the brokers ends committed). After a
  broker's restart, the broker's check service finds the half messages still pending
  and asks :meth:`resolve` (a logged decision, or the rule above), not a producer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray

from actors.coordinator.coordinator import HEAD_NODE_RESOURCE, quiet_blocking_get_warning
from actors.coordinator.txn_apply import DecisionApplier
from actors.namesrv.brokers import BrokerHandles
from actors.protocol import checks, frames, requests
from actors.protocol.data_path import DataPath
from actors.protocol.errors import TransactionStateError
from actors.protocol.frame_server import FrameServer
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.names import TXN_COORDINATOR_NAME as TXN_COORDINATOR_NAME
from storage.errors import (
    BrokerUnavailableError,
    InvalidConfigError,
    InvalidMessageError,
    ProducerFencedError,
)
from storage.txn_log import ABORT, COMMIT, OPEN, Offsets, TransactionLog, TxnRecord

_DECIDED = {COMMIT: "committed", ABORT: "aborted"}

log = logging.getLogger("raymq.actors.coordinator.txn")

APPLY_WAIT_S = 10.0
"""How long a waiting ``end`` waits for the brokers (the coordinator's ``apply_wait_s``
by default) before it answers ``done: False``."""
MAX_REQUESTS_PER_CONN = 1024  # a producer's requests in flight on its connection


def _node_ip() -> str:
    return str(ray.util.get_node_ip_address())


def default_log_dir(namespace: str) -> str:
    return str(Path("~/.raymq/txn").expanduser() / namespace)


def transaction_coordinator(
    namespace: str = DEFAULT_NAMESPACE,
    *,
    log_dir: str | None = None,
    nameservers: Sequence[str] | None = None,
    txn_timeout_s: float = 60.0,
    retry_interval_s: float = 1.0,
    keep_done_s: float = 3600.0,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    apply_wait_s: float = APPLY_WAIT_S,
) -> Any:
    """The handle of the namespace's transaction coordinator, created (detached, on the
    head node, where its log lives: ``log_dir``, default ``~/.raymq/txn/<namespace>``)
    if it does not run yet; the options count only when this call creates it.
    ``tls_cert``/``tls_key`` (files on the head node, both or neither): its socket
    serves TLS, as a broker's data path does with ``data_tls_cert``/``data_tls_key``
    (``start_cluster`` passes the brokers' pair), and it checks the brokers' TLS
    sockets against ``tls_cert``. ``apply_wait_s``: how long a waiting commit or abort
    waits for its brokers (a broker that did not answer is retried every
    ``retry_interval_s`` meanwhile) before it answers ``done: False``."""
    if txn_timeout_s <= 0 or retry_interval_s <= 0 or keep_done_s < 0 or apply_wait_s <= 0:
        raise InvalidMessageError(
            f"txn_timeout_s={txn_timeout_s}, retry_interval_s={retry_interval_s}, "
            f"keep_done_s={keep_done_s}, apply_wait_s={apply_wait_s}: timeouts must be > 0"
        )
    if (tls_cert is None) != (tls_key is None):
        raise InvalidConfigError(
            "transaction coordinator tls_cert and tls_key: give both or neither"
        )
    return (
        ray.remote(TransactionCoordinator)
        .options(
            name=TXN_COORDINATOR_NAME,
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources={HEAD_NODE_RESOURCE: 0.001},
            max_restarts=-1,
            max_concurrency=1000,
        )
        .remote(
            namespace,
            log_dir or default_log_dir(namespace),
            list(nameservers) if nameservers else None,
            txn_timeout_s,
            retry_interval_s,
            keep_done_s,
            (tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None,
            apply_wait_s,
        )
    )


class CoordinatorListener(FrameServer):
    """The coordinator's own socket: producers' commits and aborts (``TXN_END``,
    ``requests.COORDINATOR``: served by :meth:`TransactionCoordinator.end`, which checks
    each field) come here instead of Ray calls, proved as a broker's data path is
    (``actors.protocol.frame_server``); anything else stays a Ray method."""

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        host: str,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(
            TXN_COORDINATOR_NAME,
            requests.Dispatch(coordinator, requests.COORDINATOR),
            host,
            0,
            frames.DEFAULT_MAX_FRAME_BYTES,
            MAX_REQUESTS_PER_CONN,
            ssl_context,
        )
        self.coordinator = coordinator

    @property
    def closing(self) -> bool:
        return self.coordinator._closing


class TransactionCoordinator(DecisionApplier):
    """Ray actor class; use :func:`transaction_coordinator` to find or create it."""

    def __init__(
        self,
        namespace: str,
        log_dir: str,
        nameservers: Sequence[str] | None,
        txn_timeout_s: float,
        retry_interval_s: float,
        keep_done_s: float,
        tls: tuple[str, str] | None = None,
        apply_wait_s: float = APPLY_WAIT_S,
    ) -> None:
        quiet_blocking_get_warning()
        self.namespace = namespace
        self.txn_timeout_ms = int(txn_timeout_s * 1000)
        self.retry_interval_s = retry_interval_s
        self.apply_wait_s = apply_wait_s
        self.keep_done_ms = int(keep_done_s * 1000)
        self._nameservers = list(nameservers) if nameservers else None
        self._loop = asyncio.get_event_loop()  # an async actor runs __init__ in its loop
        self._io = ThreadPoolExecutor(1, thread_name_prefix="txn-log")
        self.log = TransactionLog(log_dir)
        self.log.compact(self.keep_done_ms)
        self._lock = asyncio.Lock()
        self._brokers: BrokerHandles | None = None
        # the brokers' sockets carry the decisions (a Ray call costs ~4x a socket round
        # trip here); fencing and anything else stay Ray calls on the same handles
        self._data_path = DataPath(tls_ca=tls[0] if tls else None)
        self._tls: ssl.SSLContext | None = None
        if tls is not None:  # read now: a file that cannot be read fails the start
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls.load_cert_chain(*tls)
        self._master_cache: dict[str, Any] = {}
        # decisions taken by this incarnation and not applied yet, and the brokers told
        # of them: any other telling is a retry (the broker may have died mid-append)
        self._fresh: set[str] = set()
        self._told: set[tuple[str, str]] = set()
        # commits and aborts waiting for their decision to be applied, by whichever loop
        # applies it: the apply loop's first try or a retry of the drive loop
        self._applied: dict[str, asyncio.Event] = {}
        self._fault: str | None = None
        self._closing = False
        self.stats: Counter[str] = Counter()
        self.recovered = sum(t.state != OPEN and not t.done for t in self.log.txns.values())
        self._wake = asyncio.Event()
        if self.recovered:
            log.warning("%d decided transactions to apply after a restart", self.recovered)
            self._wake.set()
        self._queue: asyncio.Queue[TxnRecord] = asyncio.Queue()
        self._task = self._loop.create_task(self._drive_loop())
        self._listener = CoordinatorListener(self, _node_ip(), self._tls)
        self._listening = self._loop.create_task(
            self._listener.start(_node_ip(), local_socket=True)
        )
        self._apply_task = self._loop.create_task(self._apply_loop())
        log.info("transaction coordinator of %s started, log in %s", namespace, log_dir)

    async def _io_call(self, fn: Any, *args: Any) -> Any:
        return await self._loop.run_in_executor(self._io, fn, *args)

    # ------------------------------------------------------------ producers' calls
    def _check_epoch(self, tid: str, epoch: int) -> None:
        current = self.log.producers.get(tid)
        if current is None:
            raise InvalidMessageError(f"transactional id {tid!r} is unknown: init_producer first")
        if epoch < current.epoch:
            self.stats["fenced"] += 1
            raise ProducerFencedError(
                f"transactional id {tid!r}: epoch {epoch} is fenced by epoch {current.epoch}"
            )
        if epoch > current.epoch:
            raise InvalidMessageError(f"transactional id {tid!r}: epoch {epoch} was never given")

    async def init_producer(
        self, transactional_id: str, instance: str | None = None
    ) -> tuple[str, int]:
        """``transactional_id``'s producer id and the epoch of ``instance`` (the token a
        producer instance asks with every time; None: a new instance at each call).

        A new instance is given the next epoch (logged, fsynced, with its token): earlier
        epochs are fenced from now on, here and at every master broker, which also rolls
        back their half messages still pending (what the previous instance left open).
        An instance that asks again is answered the epoch it was given, and what a
        failed ask left undone (a broker down) is done again; one whose epoch a later
        instance took over is refused (ProducerFencedError)."""
        tid = checks.check_str("transactional_id", transactional_id)
        token = uuid.uuid4().hex if instance is None else checks.check_str("instance", instance)
        async with self._lock:
            current = self.log.producers.get(tid)
            given = self.log.epoch_of_instance(tid, token)
            if current is not None and given is not None:
                if given < current.epoch:
                    self.stats["fenced"] += 1
                    raise ProducerFencedError(
                        f"transactional id {tid!r}: instance {token} was given epoch {given}, "
                        f"fenced by epoch {current.epoch}"
                    )
                pid, epoch = current.producer_id, given  # asked again: its own epoch
                self.stats["init_repeated"] += 1
            else:
                pid = current.producer_id if current else f"{tid}@{time.time_ns() // 1000}"
                epoch = current.epoch + 1 if current else 0
                await self._io_call(self.log.set_epoch, tid, pid, epoch, token)
                if self._fault == "crash_after_epoch":
                    log.warning("fault: exiting after logging epoch %d of %s", epoch, tid)
                    os._exit(1)
        # what the predecessor decided is applied before the new instance reads offsets:
        # a consume-transform-produce loop must not start from offsets a commit has
        # yet to move (Kafka's consumers wait for pending transactional offsets alike).
        # And before the fence: raising it rolls back every half message of an earlier
        # epoch still pending, which would drop a commit decided but not yet applied.
        # Both steps are done again when the instance asks again (they may have failed)
        for t in [t for t in self.log.txns.values() if t.tid == tid and not t.done]:
            if t.epoch < epoch and not await self._apply(t):
                raise BrokerUnavailableError(
                    f"transaction {t.txn_id} of {tid!r} is {_DECIDED[t.state]} but not applied yet "
                    "(a broker is down): try again"
                )
        if epoch > 0:  # an earlier epoch exists: fence it
            await self._fence_brokers(tid, epoch)
        return pid, epoch

    async def settings(self) -> dict[str, float]:
        """What this coordinator was created with: a producer times its ``end`` calls by
        ``apply_wait_s``."""
        return {
            "txn_timeout_s": self.txn_timeout_ms / 1000,
            "retry_interval_s": self.retry_interval_s,
            "keep_done_s": self.keep_done_ms / 1000,
            "apply_wait_s": self.apply_wait_s,
        }

    async def fences(self) -> dict[str, int]:
        """Every ``transactional_id``'s current epoch: what a broker takes before its first
        one-phase commit (``actors.broker.transaction.one_phase``)."""
        return {tid: p.epoch for tid, p in self.log.producers.items()}

    async def end(
        self,
        txn_id: str,
        transactional_id: str,
        epoch: int,
        commit: bool,
        halves: Mapping[str, Sequence[int | str] | None] | None = None,
        offsets: Mapping[str, Mapping[str, Sequence[tuple[str, int, int]]]] | None = None,
        wait: bool = True,
    ) -> dict[str, Any]:
        """Decide ``txn_id`` (logged, fsynced), then tell its brokers. ``halves``: broker ->
        its half messages' CommitLog offsets, or message ids where an offset is not
        known (None: every pending half of the transaction there);
        ``offsets``: broker -> group -> [(topic, queue id, offset)] committed with it.
        A repeated call answers the decision taken. Returns ``{"state", "done"}`` once
        every broker applied it, or (``wait`` False) once it is logged, as Kafka's
        ``EndTxn`` answers before its markers are written: ``done`` False means a broker
        has yet to apply it (retried here until it has). A broker that did not take it
        is retried every ``retry_interval_s`` while the call waits: it answers ``done``
        True as soon as a retry applied it, False after ``apply_wait_s``."""
        txn_id = checks.check_str("txn_id", txn_id)
        transactional_id = checks.check_str("transactional_id", transactional_id)
        epoch = checks.check_int("epoch", epoch, 0)
        if not isinstance(commit, bool) or not isinstance(wait, bool):
            raise InvalidMessageError(f"commit={commit!r}, wait={wait!r}: must be True or False")
        for name, value in (("halves", halves), ("offsets", offsets)):
            if value is not None and not isinstance(value, Mapping):
                raise InvalidMessageError(f"{name}: must be a dict by broker, got {value!r:.80}")
        for groups in (offsets or {}).values():
            if not isinstance(groups, Mapping):
                raise InvalidMessageError(f"offsets: must be dicts by group, got {groups!r:.80}")
        halves_ = {
            checks.check_str("broker", b): (
                None if h is None else [checks.check_half_ref(o) for o in h]
            )
            for b, h in (halves or {}).items()
        }
        offsets_: Offsets = {
            checks.check_str("broker", b): {
                checks.validate_group(g): [
                    (
                        checks.check_str("topic", t),
                        checks.check_int("queue id", q, 0),
                        checks.check_int("offset", o, 0),
                    )
                    for t, q, o in qs
                ]
                for g, qs in groups.items()
            }
            for b, groups in (offsets or {}).items()
        }
        async with self._lock:
            txn = self.log.txns.get(txn_id)
            if txn is not None and txn.state != OPEN:
                if (txn.state == COMMIT) != commit:
                    raise TransactionStateError(f"transaction {txn_id!r} was {_DECIDED[txn.state]}")
            else:
                current = self.log.producers.get(transactional_id)
                if not commit and current is not None and epoch < current.epoch:
                    # a fenced producer's abort: the fence rolled its half messages back
                    # already (and a straggler's check is answered ABORT): nothing to log
                    return {"state": ABORT, "done": True}
                self._check_epoch(transactional_id, epoch)
                if txn is None:
                    txn = TxnRecord(txn_id, transactional_id, epoch, started_ms=self.log.now_ms())
                elif txn.tid != transactional_id or txn.epoch != epoch:
                    raise TransactionStateError(
                        f"transaction {txn_id!r} belongs to another producer"
                    )
                await self._io_call(self.log.decide, txn, commit, halves_, offsets_)
                txn = self.log.txns[txn_id]
                self._fresh.add(txn_id)
                self.stats["committed" if commit else "aborted"] += 1
                if self._fault == "crash_after_decision":
                    log.warning("fault: exiting after logging %s of %s", txn.state, txn_id)
                    os._exit(1)
        if txn.done:  # a repeated call
            return {"state": txn.state, "done": True}
        self._queue.put_nowait(txn)
        if not wait:
            return {"state": txn.state, "done": False}
        # set by the first try of the apply loop or, where a broker did not take it, by
        # the drive loop's retry that does (a restarted broker, a new master)
        applied = self._applied.setdefault(txn_id, asyncio.Event())
        try:
            await asyncio.wait_for(applied.wait(), self.apply_wait_s)
            done = True
        except asyncio.TimeoutError:  # a broker is slow or down: applied later
            done = False
        return {"state": txn.state, "done": done}

    async def resolve(
        self, txn_id: str, transactional_id: str = "", epoch: int = -1, born_ms: int = 0
    ) -> str:
        """A broker's check of an old half message of ``txn_id`` (sent by
        ``transactional_id`` at ``epoch``, the first born at ``born_ms``): ``commit``,
        ``abort`` or ``open``. Undecided, it is aborted (and that logged, so a late commit
        is refused) when its producer is fenced or it is older than ``txn_timeout_s``.

        A committed transaction is applied by this coordinator alone, to exactly the half
        messages its decision names (``open`` until then); once it is done, it is applied
        once more (a broker that lost its commit in a crash gets it again), and half
        messages of it still pending after that were never part of the commit (a failed
        Spark task attempt's, sent with ``Transaction.context()`` and not handed back):
        ``abort``. An aborted one is ``abort`` at once (every half message of it goes)."""
        txn = self.log.txns.get(txn_id)
        if txn is not None and txn.state != OPEN:
            if txn.state == COMMIT:
                if not txn.done:
                    self._wake.set()
                    return OPEN
                # done, and yet a half message of it is pending: one that was never in
                # the commit, or one a broker lost the commit of (a crash before its
                # flush). Applying the decision again settles the second kind (the named
                # half messages, or all of the id where they were not named); what is
                # left pending is then the first kind: abort.
                if not await self._apply(txn, again=True):
                    return OPEN
                self.stats["stray_halves_aborted"] += 1
                return ABORT
            if not txn.done:
                self._wake.set()
            return txn.state
        current = self.log.producers.get(transactional_id)
        if current is None or epoch < current.epoch:
            return ABORT  # fenced (or never initialised here): can never commit
        if self.log.now_ms() - born_ms <= self.txn_timeout_ms:
            return OPEN
        async with self._lock:
            txn = self.log.txns.get(txn_id)
            if txn is not None and txn.state != OPEN:
                # decided while this check waited for the lock: a commit is this
                # coordinator's to apply, to the half messages it names (a broker told
                # "commit" would end every pending half of the id, a failed attempt's too)
                self._wake.set()
                return OPEN if txn.state == COMMIT else txn.state
            txn = TxnRecord(txn_id, transactional_id, epoch, started_ms=born_ms)
            await self._io_call(self.log.decide, txn, False)
            self.stats["aborted_timeout"] += 1
        log.warning("transaction %s timed out undecided: aborted", txn_id)
        return ABORT

    # ------------------------------------------------------------ admin
    async def inject_fault(self, kind: str | None) -> None:
        """Test hook: ``crash_after_decision`` exits the process right after the next
        decision is logged, before any broker hears of it; ``crash_after_epoch`` right
        after the next new instance's epoch is logged, before its answer and its fence."""
        if kind not in (None, "crash_after_decision", "crash_after_epoch"):
            raise InvalidMessageError(f"fault kind={kind!r}: unknown")
        self._fault = kind

    async def status(self) -> dict[str, Any]:
        txns = self.log.txns.values()
        return {
            "log": str(self.log.path),
            "producers": {t: (p.producer_id, p.epoch) for t, p in self.log.producers.items()},
            "pending": sorted(t.txn_id for t in txns if t.state != OPEN and not t.done),
            "recovered": self.recovered,
            "pid": os.getpid(),
            "stats": dict(self.stats),
            "door": {"addr": self._listener.addr, **self._listener.stats},  # its socket
        }

    async def transaction(self, txn_id: str) -> dict[str, Any] | None:
        t = self.log.txns.get(txn_id)
        if t is None:
            return None
        return {
            "state": t.state,
            "done": t.done,
            "tid": t.tid,
            "epoch": t.epoch,
            "brokers": sorted(t.participants()),
        }

    async def ping(self) -> str:
        return "ok"

    async def data_path(self) -> dict[str, Any] | None:
        """Where producers reach this incarnation's socket, and its secret (through Ray,
        to callers Ray let in); None when it could not open one (Ray calls then)."""
        try:
            await asyncio.shield(self._listening)
        except Exception as exc:  # noqa: BLE001 - the producers call through Ray
            log.warning("transaction coordinator: no socket (%s)", exc)
            return None
        return {
            "addr": self._listener.addr,
            "secret": self._listener.secret,
            "tls": self._tls is not None,
            "unix": self._listener.unix_path,  # for clients on this node (``node``)
            "node": ray.get_runtime_context().get_node_id(),
        }

    async def shutdown(self) -> None:
        """Stop the loop and close the log (``Cluster.shutdown`` calls this)."""
        self._closing = True
        self._task.cancel()
        self._apply_task.cancel()
        await self._listener.stop()
        self._io.shutdown(wait=True)
        self._data_path.close()
        self.log.close()
