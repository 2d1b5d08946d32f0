"""Transactional messages on the broker: RocketMQ's ``EndTransactionProcessor``,
``TransactionalMessageServiceImpl`` and ``TransactionalMessageCheckService``.

The store keeps a transactional send as its half copy in ``RMQ_SYS_TRANS_HALF_TOPIC``
(``storage.transaction``). Here:

* **End.** :meth:`TransactionProcessor.end_transaction` (the producer's answer, or a
  check's) commits or rolls back the half message at a CommitLog offset. A commit
  writes the message to its real topic and queue (SYSFLAG ``TRANSACTION_COMMIT_TYPE``,
  the transaction properties cleared) *and* the op message that marks the half message
  done, in one append: both are stored or neither. A rollback writes only the op
  message. A half message with an op message is done: a second end changes nothing.
* **Done set.** The queue offsets of done half messages are kept in memory, read
  from ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (all of it after a start, then what was added
  since, before each end and each check round: a slave made master catches up).
* **Check.** Every ``transaction_check_interval_s`` the half messages older than
  ``transaction_timeout_s`` (by born time, as RocketMQ) that are not done are checked:
  the half message is put back to the half queue with ``TRANSACTION_CHECK_TIMES`` one
  higher and the old one marked done, in one append (RocketMQ's
  ``putBackHalfMsgQueue``: the check count lives in the CommitLog, so it survives a
  restart), then a live producer of its group is asked about the new copy. After
  ``transaction_check_max`` checks the half message is discarded: marked done and
  copied to ``TRANS_CHECK_MAX_TIME_TOPIC``. A round is batched: up to ``_CHECK_CHUNK``
  half messages share one append (their copies and one op message naming them all)
  and one call per producer group, so a backlog of 10,000 is a handful of appends.
* **Producers.** A transactional producer registers a Ray handle of its own
  (``actors.client.transaction``: a small relay actor its process takes checks from)
  with :meth:`register_producer` and renews it; the check calls it without waiting
  for the answers, which come back batched, as :meth:`end_transactions` (each call
  one append).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from actors.broker.ha import Replication
from actors.broker.runtime import BrokerRuntime
from actors.broker.transaction.one_phase import OnePhaseCommits
from actors.protocol import checks
from actors.protocol.names import TXN_COORDINATOR_NAME
from storage import codec, transaction
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError, InvalidMessageError, StoreCorruptedError
from storage.message import GetStatus, Message, MessageExt, PutStatus
from storage.properties import PROP_UNIQ_KEY
from storage.store import PutBatchResult

log = logging.getLogger("raymq.actors.broker.transaction.service")


def _epoch_of(half: MessageExt) -> int:
    try:
        return int(half.properties.get(transaction.PROP_TXN_EPOCH, "-1"))
    except ValueError:
        return -1


def _chunks(halves: list[MessageExt]) -> list[list[MessageExt]]:
    """``halves`` in runs of at most ``_CHECK_CHUNK`` messages and ``_CHECK_CHUNK_BYTES`` of
    bodies: one append and one relay call each."""
    out: list[list[MessageExt]] = []
    size = 0
    for half in halves:
        if not out or len(out[-1]) >= _CHECK_CHUNK or size + len(half.body) > _CHECK_CHUNK_BYTES:
            out.append([])
            size = 0
        out[-1].append(half)
        size += len(half.body)
    return out


def _chained_sizes(cl: Any, offsets: list[int]) -> list[int] | None:
    """The sizes of the records at ``offsets`` when each one starts where the one before
    ends (read from one copy of the run); None when they do not (read one by one)."""
    if len(offsets) < 2:
        return None
    first, last = offsets[0], offsets[-1]
    if last <= first:
        return None
    try:
        run = cl.view(first, last - first + 4)  # no copy; fails across files: one by one
    except (StoreCorruptedError, ValueError, IndexError):
        return None
    sizes = []
    for a, b in zip(offsets, offsets[1:]):
        at = a - first
        size = int.from_bytes(run[at : at + 4], "big", signed=True)
        if size <= 0 or a + size != b:
            return None
        sizes.append(size)
    sizes.append(cl.size_at(last))
    return sizes


def _copy_key(half: MessageExt) -> tuple[str, str]:
    return half.properties.get("REAL_TOPIC", ""), half.properties.get(PROP_UNIQ_KEY, "")


def _ask(relay: Any, broker: str, checks_: list[tuple[int, str, Message]]) -> None:
    """Leave ``checks_`` ((new half copy's CommitLog offset, message id, message)) with a
    producer: one call with all of them where its handle takes a batch (a producer's
    relay actor), else one each (a gRPC client's Telemetry stream, no Ray call)."""
    many = getattr(relay, "check_many", None)
    if many is not None:
        many.remote(broker, checks_)
        return
    for offset, msg_id, message in checks_:
        relay.check.remote(broker, offset, msg_id, message)


async def apply_decision(
    transactions: TransactionProcessor,
    groups: Any,
    txn_id: str,
    commit: bool,
    half_offsets: list[int | str] | None,
    offsets: dict[str, dict[tuple[str, int], int]] | None,
    transactional_id: str | None,
    epoch: int | None,
    retry: bool = False,
) -> int:
    """The transaction coordinator's decision on multi-message transaction ``txn_id``
    here (``Broker.end_transaction_batch``, or its socket's END_TRANSACTION_BATCH):
    its half messages ended in one append, and on commit ``offsets`` (group ->
    {(topic, queue id): offset}) committed through ``groups`` (the broker's
    ``ConsumerManageProcessor``) and saved; on a ``retry`` only those ahead of where the
    group is. How many half messages it ended."""
    if offsets is not None:  # refused before anything ends
        if not isinstance(offsets, dict):
            raise InvalidMessageError(f"offsets: must be a dict, got {type(offsets).__name__}")
        offsets = {group: groups.check_offsets(group, queues) for group, queues in offsets.items()}
    ended = await transactions.end_transaction_batch(
        txn_id, commit, half_offsets, transactional_id, epoch, retry
    )
    if commit and offsets:
        rt = transactions.rt
        for group, queues in offsets.items():
            if retry:
                # applied again (the coordinator restarted, or heard no answer): the
                # group may have moved on since, through this producer's later
                # transactions or otherwise; the old decision does not move it back
                queues = {q: o for q, o in queues.items() if o > rt.offsets.query(group, *q)}
            if queues:
                await groups.commit_offsets(group, queues)
        await rt.run(rt.offsets.persist)
    return ended


CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # RocketMQ's consumer group of the check service
_READ_BATCH = 256
_CHECK_CHUNK = 1024  # half messages per check append and relay call
_CHECK_CHUNK_BYTES = 8 << 20  # and their bodies


class TransactionProcessor:
    """End of transactions, the check service and the transactional producers of one broker."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = runtime
        self.role = role
        self._lock = asyncio.Lock()
        # half queue offsets with an op message: those at or above _done_below (all below
        # it are done, and forgotten here: the set would grow with every half message)
        self._done: set[int] = set()
        self._done_below = 0  # raised on the loop with _lock held, as _done changes
        self._ops_read = 0  # op queue offset read up to
        self._scan_from = 0  # where the scan for pending half messages starts
        # producer group -> client id -> (relay handle, when it expires, monotonic)
        self._producers: dict[str, dict[str, tuple[Any, float]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._loaded = False
        self.one_phase = OnePhaseCommits(runtime, role)

    def _is_done(self, queue_offset: int) -> bool:
        return queue_offset < self._done_below or queue_offset in self._done

    def _forget_done(self) -> None:
        """Drop from ``_done`` the offsets below the first half message still pending
        (lock held): they stay done through ``_done_below``."""
        below = max(self._done_below, self._scan_from)
        if below > self._done_below:
            self._done = {q for q in self._done if q >= below}
            self._done_below = below

    def status(self) -> dict[str, Any]:
        """How many ended half messages are tracked one by one (above ``txn_done_below``:
        the first one still pending, as the last scan found it)."""
        return {
            "txn_done_tracked": len(self._done),
            "txn_done_below": self._done_below,
            **self.one_phase.status(),
        }

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = self.rt.loop.create_task(self._check_loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def ensure_loaded(self) -> None:
        """Read the op messages stored since the last call (all of them at the first): this
        broker's own, and on a slave that became master those its master wrote. None
        stored since (this broker's own are counted as it writes them): no read."""
        if self._loaded:
            cq = self.rt.store.find_consume_queue(transaction.OP_HALF_TOPIC, 0)
            if cq is None or cq.max_offset <= self._ops_read:
                return
        await self.rt.run(self._read_ops)

    def _read_ops(self) -> None:
        before = len(self._done)
        store = self.rt.store
        while True:
            got = store.get(CHECK_GROUP, transaction.OP_HALF_TOPIC, 0, self._ops_read, _READ_BATCH)
            if got.status is GetStatus.OFFSET_TOO_SMALL:
                self._ops_read = got.next_offset
                continue
            if got.status is not GetStatus.FOUND:
                break
            for m in got.messages:
                try:  # one offset, or a multi-message transaction's offsets, comma separated
                    self._done.update(transaction.op_offsets(m.body))
                except ValueError:
                    log.error("op message at %d: body %r is no offset", m.queue_offset, m.body)
            self._ops_read = got.next_offset
        if not self._loaded:
            log.info("%d half messages are done (op messages read)", len(self._done))
            self._loaded = True
        elif len(self._done) != before:
            log.debug("%d more half messages are done", len(self._done) - before)

    # ------------------------------------------------------------ producers
    def register_producer(self, group: str, client_id: str, handle: Any, ttl_s: float) -> None:
        ttl = min(ttl_s, self.rt.config.channel_expired_s)
        self._producers.setdefault(group, {})[client_id] = (handle, time.monotonic() + ttl)

    def unregister_producer(self, group: str, client_id: str) -> None:
        self._producers.get(group, {}).pop(client_id, None)

    def _live_producer(self, group: str) -> Any | None:
        members = self._producers.get(group)
        if not members:
            return None
        now = time.monotonic()
        for client_id, (_, expires) in list(members.items()):
            if expires < now:
                log.info("transactional producer %s of %s expired", client_id, group)
                del members[client_id]
        if not members:
            return None
        return random.choice(list(members.values()))[0]

    # ------------------------------------------------------------ end
    async def end_transaction(
        self, group: str, half_offset: int, transaction_id: str, commit: bool
    ) -> bool:
        """Commit or roll back the half message at CommitLog offset ``half_offset``; False
        when it was ended (or discarded) before: nothing is written then."""
        return await self.end_transactions(group, [(half_offset, transaction_id, commit)]) == 1

    async def end_transactions(self, group: str, ends: list[tuple[int, str, bool]]) -> int:
        """End many single-message transactions of ``group`` in one append (a producer's
        answers to a check round): ``ends`` holds (half message's CommitLog offset, its
        message id, commit). The committed copies and one op message naming every half
        message ended are stored together, or nothing is. Those ended before are skipped;
        returns how many were ended. One end that names no half message of ``group``
        refuses the whole call and writes nothing."""
        group = checks.validate_group(group, "producer group")
        if not isinstance(ends, (list, tuple)):
            raise InvalidMessageError(f"ends: must be a list, got {type(ends).__name__}")
        parsed: list[tuple[int, str, bool]] = []
        for end in ends:
            if not isinstance(end, (list, tuple)) or len(end) != 3:
                raise InvalidMessageError(f"end {end!r}: must be (offset, transaction id, commit)")
            offset, transaction_id, commit = end
            if not isinstance(commit, bool):
                raise InvalidMessageError(f"commit={commit!r}: must be True or False")
            parsed.append(
                (
                    checks.check_int("half_offset", offset, 0),
                    checks.check_str("transaction_id", transaction_id),
                    commit,
                )
            )
        if not parsed:
            return 0
        async with self._lock:
            await self.ensure_loaded()
            offsets = [offset for offset, _, _ in parsed]
            halves = (
                self._halves_at(offsets)
                if self._inline or len(offsets) == 1
                else await self.rt.run(self._halves_at, offsets)
            )
            for (offset, transaction_id, _), half in zip(parsed, halves):
                if (
                    half.topic != transaction.HALF_TOPIC
                    or transaction.producer_group(half) != group
                    or half.msg_id != transaction_id
                ):
                    raise InvalidMessageError(
                        f"the message at commitlog offset {offset} is not transaction "
                        f"{transaction_id!r}'s half message of producer group {group!r}"
                    )
            todo: dict[int, MessageExt] = {}  # queue offset -> half: a repeated end counts once
            commits: list[MessageExt] = []
            for (_, transaction_id, commit), half in zip(parsed, halves):
                if self._is_done(half.queue_offset) or half.queue_offset in todo:
                    log.info(
                        "transaction %s of %s was ended before: ignored", transaction_id, group
                    )
                    continue
                todo[half.queue_offset] = half
                if commit:
                    commits.append(half)
            if not todo:
                return 0
            op = transaction.op_message(list(todo))
            batch = self._committed(commits, op) if commits else self._encode([op], [None])
            await self._write(batch)
            self._done.update(todo)
            self.rt.stats["txn_committed"] += len(commits)
            self.rt.stats["txn_rolled_back"] += len(todo) - len(commits)
            return len(todo)

    async def end_transaction_batch(
        self,
        txn_id: str,
        commit: bool,
        half_offsets: list[int | str] | None,
        transactional_id: str | None = None,
        epoch: int | None = None,
        retry: bool = False,
    ) -> int:
        """Commit or roll back every half message of multi-message transaction ``txn_id``
        held here: those at ``half_offsets`` (CommitLog offsets, or the message ids of
        halves whose offset the sender did not learn; None: every pending one carrying
        the transaction's id), in one append (the committed copies and one op message naming
        them all). Half messages ended before are skipped; returns how many were ended.
        ``transactional_id``/``epoch``: the owner, whose fence rises to it here.

        ``retry``: the coordinator told this broker before and heard no answer. If the
        broker died in the middle of that append, the copies written before the crash
        are kept by recovery while the op message is not: a half message whose committed
        copy is found in its real topic (by its unique key) is then marked done, not
        copied again."""
        txn_id = checks.check_str("txn_id", txn_id)
        if not isinstance(commit, bool) or not isinstance(retry, bool):
            raise InvalidMessageError(f"commit={commit!r}, retry={retry!r}: must be True or False")
        if transactional_id is not None and epoch is not None:
            self.rt.store.txn_fences.raise_fence(
                checks.check_str("transactional_id", transactional_id),
                checks.check_int("epoch", epoch, 0),
            )
        async with self._lock:
            await self.ensure_loaded()
            if half_offsets is not None and not isinstance(half_offsets, (list, tuple)):
                raise InvalidMessageError(f"half_offsets: must be a list, got {half_offsets!r:.80}")
            refs = (
                None if half_offsets is None else [checks.check_half_ref(o) for o in half_offsets]
            )
            by_id = None if refs is None else {r for r in refs if isinstance(r, str)}
            if refs is None or by_id:
                # by the transaction's id, and (by_id) of those only the ones named: a
                # failed attempt's halves of the same transaction are never named
                pending = await self.rt.run(self._pending_halves)
                halves = [
                    h
                    for h in pending
                    if transaction.global_txn(h) == txn_id
                    and (by_id is None or h.properties.get(PROP_UNIQ_KEY) in by_id)
                ]
                at = [r for r in refs or () if isinstance(r, int)]
                if at:
                    halves += await self.rt.run(self._named_halves, txn_id, at)
            else:
                offsets = [r for r in refs if isinstance(r, int)]
                records = (
                    self._records_at(offsets)
                    if self._inline
                    else await self.rt.run(self._records_at, offsets)
                )
                if records is not None:  # the usual case: no record decoded
                    for offset, owner in zip(offsets, records.txn_ids):
                        if owner != txn_id:
                            raise InvalidMessageError(
                                f"the message at {offset} is no half message of transaction "
                                f"{txn_id!r}"
                            )
                    picked = self._not_done(records.queue_offsets)
                    if not picked:
                        return 0
                    done = [records.queue_offsets[i] for i in picked]
                    op = self._encode([transaction.op_message(done)], [None])
                    if commit and retry:
                        picked = await self._not_copied(picked, records.copy_key)
                    copies = records.committed(picked) if commit and picked else None
                    if copies is not None or not commit or not picked:
                        batch = op if copies is None else EncodedBatch.concat([copies, op])
                        return await self._ended(txn_id, commit, done, batch)
                # a record the byte-level walk leaves to the decoder
                halves = (
                    self._named_halves(txn_id, offsets)
                    if self._inline
                    else await self.rt.run(self._named_halves, txn_id, offsets)
                )
            todo = [halves[i] for i in self._not_done([h.queue_offset for h in halves])]
            if not todo:
                return 0
            done = [h.queue_offset for h in todo]
            op_message = transaction.op_message(done)
            if commit and retry:
                keep = await self._not_copied(list(range(len(todo))), lambda i: _copy_key(todo[i]))
                todo = [todo[i] for i in keep]
            if commit and todo:
                batch = self._committed(todo, op_message)
            else:
                batch = self._encode([op_message], [None])
            return await self._ended(txn_id, commit, done, batch)

    async def _not_copied(
        self, picked: list[int], key_of: Callable[[int], tuple[str, str]]
    ) -> list[int]:
        """Of ``picked``, those whose committed copy (real topic, unique key: ``key_of``)
        is not in the store yet. Refused (BrokerUnavailableError: the coordinator asks
        again) while the index has yet to take in the whole CommitLog."""
        store = self.rt.store
        if store.dispatched_offset < store.commitlog.max_offset:
            raise BrokerUnavailableError("the index is catching up with the commitlog: try again")

        def absent() -> list[int]:
            out = []
            for i in picked:
                topic, uk = key_of(i)
                if not any(
                    m.properties.get(PROP_UNIQ_KEY) == uk
                    and transaction.transaction_type(m.sys_flag)
                    == transaction.TRANSACTION_COMMIT_TYPE
                    for m in store.query_by_key(topic, uk, max_count=8)
                ):
                    out.append(i)
            return out

        keep = await self.rt.run(absent)
        if len(keep) < len(picked):
            log.warning(
                "%d committed copies were written before a crash cut their commit short: "
                "not written again",
                len(picked) - len(keep),
            )
        return keep

    def _not_done(self, queue_offsets: list[int]) -> list[int]:
        """The indexes of the half messages (by half queue offset) not ended yet, each
        once (a transaction handed the same half message twice commits it once)."""
        seen: set[int] = set()
        picked = []
        for i, q in enumerate(queue_offsets):
            if not self._is_done(q) and q not in seen:
                seen.add(q)
                picked.append(i)
        return picked

    async def _ended(self, txn_id: str, commit: bool, done: list[int], batch: EncodedBatch) -> int:
        """Write a transaction's end (lock held) and mark its half messages done."""
        if commit and len(batch) > 1 and self.rt.faults.take("crash_mid_commit"):
            await self._write(batch.select([(0, max(1, (len(batch) - 1) // 2))]))
            self.rt.faults.crash()  # a SIGKILL in the middle of the append
        await self._write(batch)
        self._done.update(done)
        self.rt.stats["txn_committed" if commit else "txn_rolled_back"] += len(done)
        log.debug(
            "transaction %s: %d half messages %s",
            txn_id,
            len(done),
            "committed" if commit else "rolled back",
        )
        return len(done)

    def _read(self, offsets: list[int]) -> tuple[bytes, list[int]]:
        """The records at CommitLog ``offsets``, back to back, and their sizes. Offsets of
        records stored back to back (a flush's half messages) are read as one run, found
        by following the records' sizes from the first: one size read per run."""
        cl = self.rt.store.commitlog
        try:
            sizes = _chained_sizes(cl, offsets)
            if sizes is None:
                sizes = [cl.size_at(o) for o in offsets]
            data = cl.read_runs(np.asarray(offsets, np.int64), np.asarray(sizes, np.int64))
        except (StoreCorruptedError, ValueError, IndexError) as exc:
            raise InvalidMessageError(f"no half messages at commitlog offsets {offsets}") from exc
        return data, sizes

    def _records_at(self, offsets: list[int]) -> transaction.HalfRecords | None:
        """The records at CommitLog ``offsets`` walked without decoding
        (``transaction.HalfRecords``); None when the walk leaves one to the decoder."""
        return transaction.HalfRecords.read(*self._read(offsets))

    def _named_halves(self, txn_id: str, offsets: list[int]) -> list[MessageExt]:
        """The half messages of ``txn_id`` at CommitLog ``offsets``, decoded; refused
        when one is not."""
        halves = self._halves_at(offsets)
        for offset, half in zip(offsets, halves):
            if half.topic != transaction.HALF_TOPIC or transaction.global_txn(half) != txn_id:
                raise InvalidMessageError(
                    f"the message at {offset} is no half message of transaction {txn_id!r}"
                )
        return halves

    def _halves_at(self, offsets: list[int]) -> list[MessageExt]:
        """The records at CommitLog ``offsets``, decoded together."""
        if not offsets:
            return []
        data, _ = self._read(offsets)
        try:
            out = codec.decode_records(data, check_crc=False)
        except (StoreCorruptedError, ValueError, IndexError) as exc:
            raise InvalidMessageError(f"no half messages at commitlog offsets {offsets}") from exc
        if len(out) != len(offsets):
            raise InvalidMessageError(f"no half messages at commitlog offsets {offsets}")
        return out

    async def abort_fenced(self, transactional_id: str, epoch: int) -> int:
        """Roll back every pending half message of ``transactional_id`` from an epoch
        below ``epoch`` (its new instance fenced them), in one append; how many."""
        async with self._lock:
            await self.ensure_loaded()
            stale = [
                h
                for h in await self.rt.run(self._pending_halves)
                if h.properties.get(transaction.PROP_TXN_PRODUCER) == transactional_id
                and _epoch_of(h) < epoch
            ]
            if not stale:
                return 0
            await self._write(
                self._encode([transaction.op_message([h.queue_offset for h in stale])], [None])
            )
            self._done.update(h.queue_offset for h in stale)
            self.rt.stats["txn_rolled_back"] += len(stale)
        log.info(
            "%d half messages of %s below epoch %d rolled back (fenced)",
            len(stale),
            transactional_id,
            epoch,
        )
        return len(stale)

    @classmethod
    def _committed(cls, halves: list[MessageExt], op: Message) -> EncodedBatch:
        """The committed copies of ``halves`` and then ``op``, one batch: the copies built
        from the half records' bytes (``transaction.committed_copies``) or, when that
        declines, re-encoded from ``transaction.committed``'s messages (the same bytes)."""
        copies = transaction.committed_copies(halves)
        if copies is not None:
            return EncodedBatch.concat([copies, cls._encode([op], [None])])
        batch = cls._encode([*map(transaction.committed, halves), op], [*halves, None])
        return transaction.with_transaction_type(
            batch, list(range(len(halves))), transaction.TRANSACTION_COMMIT_TYPE
        )

    @staticmethod
    def _encode(messages: list[Message], born: list[MessageExt | None]) -> EncodedBatch:
        now = int(time.time() * 1000)
        return codec.encode_batch(
            messages,
            born=[
                (now, "127.0.0.1:0", 0)
                if b is None
                else (b.born_timestamp, b.born_host, b.reconsume_times)
                for b in born
            ],
        )

    async def _write(self, batch: EncodedBatch) -> PutBatchResult:
        """The broker's own write (system topics, already shaped): through its role. Its
        last record is an op message whose half messages the caller marks done: when it
        is the next op message to read, it counts as read (the next end reads nothing)."""
        self.rt.check_writable()
        internal = getattr(self.role, "put_internal", None)  # DLedger: through the Raft log
        if internal is not None:
            result: PutBatchResult = await internal(batch)
        else:
            result = await self.role.put(batch, self._local_put)
        last = batch.topics[int(batch.topic_idx[-1])] if len(batch) else None
        if (  # stored here for good (a Raft entry not yet committed may be cut back)
            self._loaded
            and result.status is PutStatus.PUT_OK
            and last == transaction.OP_HALF_TOPIC
            and len(result.queue_offsets)
            and int(result.queue_offsets[-1]) == self._ops_read
        ):
            self._ops_read += 1
        return result

    async def _local_put(self, batch: EncodedBatch) -> PutBatchResult:
        if self._inline:  # a copy into the mapped file: cheaper than a thread hop
            return self.rt.store._put_encoded(batch)
        return await self.rt.run(self.rt.store._put_encoded, batch)

    @property
    def _inline(self) -> bool:
        """ASYNC_FLUSH: a put or a read of one record stays on the event loop, as the send
        processor's puts do (``BrokerConfig.inline_async_puts``)."""
        return self.rt.config.inline_async_puts and not self.rt.store.config.sync_flush

    # ------------------------------------------------------------ check
    async def _check_loop(self) -> None:
        interval = self.rt.config.transaction_check_interval_s
        while not self.rt.closing:
            await asyncio.sleep(interval)
            try:
                await self.check_once()
            except BrokerUnavailableError as exc:  # a slave, or shutting down
                log.debug("transaction check skipped: %s", exc)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("transaction check failed")

    async def check_once(self) -> int:
        """One round of the check service; returns how many half messages it checked or
        discarded.

        The round is batched: the due half messages go in chunks, each chunk's new half
        copies (or discarded copies) and one op message naming all of it in one append;
        then each producer group gets one call per chunk on a live producer's relay, with
        every check of that chunk (its answers come back batched too,
        :meth:`end_transactions`)."""
        async with self._lock:  # _done changes only with the lock held
            await self.ensure_loaded()
        config = self.rt.config
        timeout_ms = int(config.transaction_timeout_s * 1000)
        handled = 0
        pending = await self.rt.run(self._pending_halves)
        async with self._lock:
            self._forget_done()
        now_ms = int(time.time() * 1000)
        global_txns: dict[str, tuple[str, int, int]] = {}  # id -> owner, epoch, first born
        halves_of: dict[str, list[MessageExt]] = {}  # id -> its pending halves, due or not
        due: list[MessageExt] = []
        for half in pending:
            gtxn = transaction.global_txn(half)
            if gtxn is not None:
                halves_of.setdefault(gtxn, []).append(half)
            if now_ms - half.born_timestamp < transaction.check_after_ms(half, timeout_ms):
                continue  # not yet: the broker's timeout, or the producer's immunity
            if gtxn is not None:  # a multi-message transaction's: its coordinator decides
                owner = half.properties.get(transaction.PROP_TXN_PRODUCER, "")
                prev = global_txns.get(gtxn)
                born = half.born_timestamp if prev is None else min(prev[2], half.born_timestamp)
                global_txns[gtxn] = (owner, _epoch_of(half), born)
                continue
            due.append(half)
        for chunk in _chunks(due):
            handled += await self._check_chunk(chunk)
        if global_txns:
            handled += await self._resolve_global(global_txns, halves_of)
        return handled

    async def _check_chunk(self, halves: list[MessageExt]) -> int:
        """Check (or discard, past ``transaction_check_max``) ``halves``: one append, then
        one relay call per producer group."""
        check_max = self.rt.config.transaction_check_max
        async with self._lock:
            todo = [h for h in halves if not self._is_done(h.queue_offset)]  # not ended meanwhile
            if not todo:
                return 0
            again = [h for h in todo if transaction.check_times(h) < check_max]
            maxed = [h for h in todo if transaction.check_times(h) >= check_max]
            op = transaction.op_message([h.queue_offset for h in todo])
            batch = self._encode(
                [
                    *map(transaction.checked_again, again),
                    *map(transaction.discarded, maxed),
                    op,
                ],
                [*again, *maxed, None],
            )
            batch = transaction.with_transaction_type(
                batch, list(range(len(again))), transaction.TRANSACTION_PREPARED_TYPE
            )
            put = await self._write(batch)
            self._done.update(h.queue_offset for h in todo)
        self.rt.stats["txn_checks"] += len(again)
        self.rt.stats["txn_discarded"] += len(maxed)
        for half in maxed:
            log.warning(
                "half message %s of %s checked %d times without an answer: discarded to %s",
                half.msg_id,
                transaction.producer_group(half),
                check_max,
                transaction.CHECK_MAX_TOPIC,
            )
        by_group: dict[str, list[tuple[int, str, Message]]] = {}
        for half, offset in zip(again, put.commitlog_offsets.tolist()):
            by_group.setdefault(transaction.producer_group(half), []).append(
                (int(offset), half.msg_id, transaction.committed(half))
            )
        for group, checks_ in by_group.items():
            relay = self._live_producer(group)
            if relay is None:
                log.info(
                    "no live producer of %s to check %d half messages with", group, len(checks_)
                )
                continue
            try:  # the answers come back as end_transactions; not waited for here
                _ask(relay, self.rt.config.actor_name, checks_)
            except Exception as exc:  # noqa: BLE001 - a dead relay: checked again later
                log.warning(
                    "checking %d half messages with a producer of %s failed: %s",
                    len(checks_),
                    group,
                    exc,
                )
        return len(todo)

    async def _resolve_global(
        self, txn_ids: dict[str, tuple[str, int, int]], halves_of: dict[str, list[MessageExt]]
    ) -> int:
        """Ask the transaction coordinator about old half messages of multi-message
        transactions and apply what it decided (an open one is left for later).
        ``halves_of``: each one's pending half messages as the round's scan found them;
        one ended since (the scan is seconds old under a backlog) is not asked about, and
        an abort ends those still pending by their offsets, with no scan of its own."""
        try:
            coordinator = await self.rt.run(
                ray.get_actor, TXN_COORDINATOR_NAME, self.rt.config.namespace
            )
        except ValueError:
            log.info("%d transactions pending and no transaction coordinator", len(txn_ids))
            return 0
        ended = 0
        for txn_id, (owner, epoch, born_ms) in sorted(txn_ids.items()):
            if not self._still_pending(halves_of[txn_id]):
                continue  # ended since the scan
            try:
                state: str = await asyncio.wait_for(
                    coordinator.resolve.remote(txn_id, owner, epoch, born_ms), 10.0
                )
            except Exception as exc:  # noqa: BLE001 - the next round asks again
                log.warning("transaction %s: the coordinator did not answer: %s", txn_id, exc)
                continue
            if state == "abort":  # a commit is applied by the coordinator alone
                left = self._still_pending(halves_of[txn_id])
                if left:
                    offsets: list[int | str] = [h.commitlog_offset for h in left]
                    ended += await self.end_transaction_batch(txn_id, False, offsets)
                self.rt.stats["txn_resolved"] += 1
        return ended

    def _still_pending(self, halves: list[MessageExt]) -> list[MessageExt]:
        """Of ``halves``, those not ended yet."""
        return [h for h in halves if not self._is_done(h.queue_offset)]

    def _pending_halves(self) -> list[MessageExt]:
        """The half messages not done, from the first one that is not."""
        store = self.rt.store
        cq = store.find_consume_queue(transaction.HALF_TOPIC, 0)
        if cq is None:
            return []
        end = cq.max_offset
        offset = max(self._scan_from, self._done_below, cq.min_offset)
        while offset < end and offset in self._done:
            offset += 1
        self._scan_from = offset
        self.rt.stats["txn_scans"] += 1
        out: list[MessageExt] = []
        while offset < end:
            got = store.get(CHECK_GROUP, transaction.HALF_TOPIC, 0, offset, _READ_BATCH)
            if got.status is not GetStatus.FOUND:
                break
            out.extend(
                m
                for m in got.messages
                if m.queue_offset < end and not self._is_done(m.queue_offset)
            )
            offset = got.next_offset
        return out

    def pending(self) -> list[dict[str, Any]]:
        """The half messages not ended yet: id, group, real topic, age and check count."""
        now_ms = int(time.time() * 1000)
        return [
            {
                "msg_id": h.msg_id,
                "group": transaction.producer_group(h),
                "topic": h.properties.get("REAL_TOPIC", ""),
                "commitlog_offset": h.commitlog_offset,
                "queue_offset": h.queue_offset,
                "age_s": (now_ms - h.born_timestamp) / 1000,
                "check_times": transaction.check_times(h),
            }
            for h in self._pending_halves()
        ]
