"""The half and op topics of a broker (RocketMQ's ``TransactionalMessageBridge``, with
the op bookkeeping of ``TransactionalMessageServiceImpl``).

The store keeps a transactional send as its half copy in ``RMQ_SYS_TRANS_HALF_TOPIC``
(``storage.transaction``); a half message with an op message in
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` is done. Here:

* **Done set.** The queue offsets of done half messages are kept in memory, read
  from the op topic (all of it after a start, then what was added since, before each
  end and each check round: a slave made master catches up). Those below the first
  half message still pending are forgotten one by one and kept as a bound.
* **Reads.** The half messages still pending (a scan of the half queue), and the
  records at given CommitLog offsets, read as runs when stored back to back.
* **Writes.** The broker's own appends (committed copies, checked-again copies, op
  messages), through its role in the group.

The end-transaction processor (``actors.broker.processor.end_transaction``) and the
check service (``actors.broker.transaction.check_service``) share one bridge and
change the done set only with :attr:`TransactionalMessageBridge.lock` held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from actors.broker.ha import Replication
from actors.broker.runtime import BrokerRuntime
from storage import codec, transaction
from storage.codec import EncodedBatch
from storage.errors import InvalidMessageError, StoreCorruptedError
from storage.message import GetStatus, Message, MessageExt, PutStatus
from storage.store import PutBatchResult

log = logging.getLogger("raymq.actors.broker.transaction.bridge")

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # RocketMQ's consumer group of the check service
_READ_BATCH = 256


def epoch_of(half: MessageExt) -> int:
    """The epoch of the transactional producer that sent ``half`` (-1: none)."""
    try:
        return int(half.properties.get(transaction.PROP_TXN_EPOCH, "-1"))
    except ValueError:
        return -1


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


class TransactionalMessageBridge:
    """One broker's half and op topics: which half messages are done, reads and writes."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = runtime
        self.role = role
        self.lock = asyncio.Lock()  # held while the done set changes
        # half queue offsets with an op message: those at or above _done_below (all below
        # it are done, and forgotten here: the set would grow with every half message)
        self._done: set[int] = set()
        self._done_below = 0  # raised on the loop with the lock held, as _done changes
        self._ops_read = 0  # op queue offset read up to
        self._scan_from = 0  # where the scan for pending half messages starts
        self._loaded = False

    # ------------------------------------------------------------ the done set
    def is_done(self, queue_offset: int) -> bool:
        return queue_offset < self._done_below or queue_offset in self._done

    def mark_done(self, queue_offsets: Iterable[int]) -> None:
        """The half messages at these half queue offsets have an op message (lock held)."""
        self._done.update(queue_offsets)

    def forget_done(self) -> None:
        """Drop from the done set the offsets below the first half message still pending
        (lock held): they stay done through ``_done_below``."""
        below = max(self._done_below, self._scan_from)
        if below > self._done_below:
            self._done = {q for q in self._done if q >= below}
            self._done_below = below

    def still_pending(self, halves: list[MessageExt]) -> list[MessageExt]:
        """Of ``halves``, those not ended yet."""
        return [h for h in halves if not self.is_done(h.queue_offset)]

    def not_done(self, queue_offsets: list[int]) -> list[int]:
        """The indexes of the half messages (by half queue offset) not ended yet, each
        once (a transaction handed the same half message twice commits it once)."""
        seen: set[int] = set()
        picked = []
        for i, q in enumerate(queue_offsets):
            if not self.is_done(q) and q not in seen:
                seen.add(q)
                picked.append(i)
        return picked

    def status(self) -> dict[str, Any]:
        """How many ended half messages are tracked one by one (above ``txn_done_below``:
        the first one still pending, as the last scan found it)."""
        return {"txn_done_tracked": len(self._done), "txn_done_below": self._done_below}

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

    # ------------------------------------------------------------ reads
    def pending_halves(self) -> list[MessageExt]:
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
                m for m in got.messages if m.queue_offset < end and not self.is_done(m.queue_offset)
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
            for h in self.pending_halves()
        ]

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

    def records_at(self, offsets: list[int]) -> transaction.HalfRecords | None:
        """The records at CommitLog ``offsets`` walked without decoding
        (``transaction.HalfRecords``); None when the walk leaves one to the decoder."""
        return transaction.HalfRecords.read(*self._read(offsets))

    def named_halves(self, txn_id: str, offsets: list[int]) -> list[MessageExt]:
        """The half messages of ``txn_id`` at CommitLog ``offsets``, decoded; refused
        when one is not."""
        halves = self.halves_at(offsets)
        for offset, half in zip(offsets, halves):
            if half.topic != transaction.HALF_TOPIC or transaction.global_txn(half) != txn_id:
                raise InvalidMessageError(
                    f"the message at {offset} is no half message of transaction {txn_id!r}"
                )
        return halves

    def halves_at(self, offsets: list[int]) -> list[MessageExt]:
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

    # ------------------------------------------------------------ writes
    @classmethod
    def committed(cls, halves: list[MessageExt], op: Message) -> EncodedBatch:
        """The committed copies of ``halves`` and then ``op``, one batch: the copies built
        from the half records' bytes (``transaction.committed_copies``) or, when that
        declines, re-encoded from ``transaction.committed``'s messages (the same bytes)."""
        copies = transaction.committed_copies(halves)
        if copies is not None:
            return EncodedBatch.concat([copies, cls.encode([op], [None])])
        batch = cls.encode([*map(transaction.committed, halves), op], [*halves, None])
        return transaction.with_transaction_type(
            batch, list(range(len(halves))), transaction.TRANSACTION_COMMIT_TYPE
        )

    @staticmethod
    def encode(messages: list[Message], born: list[MessageExt | None]) -> EncodedBatch:
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

    async def write(self, batch: EncodedBatch) -> PutBatchResult:
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
        if self.inline:  # a copy into the mapped file: cheaper than a thread hop
            return self.rt.store._put_encoded(batch)
        return await self.rt.run(self.rt.store._put_encoded, batch)

    @property
    def inline(self) -> bool:
        """ASYNC_FLUSH: a put or a read of one record stays on the event loop, as the send
        processor's puts do (``BrokerConfig.inline_async_puts``)."""
        return self.rt.config.inline_async_puts and not self.rt.store.config.sync_flush
