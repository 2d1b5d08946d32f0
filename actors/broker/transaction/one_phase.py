"""One-phase commits: a multi-message transaction that one broker holds whole, committed
by that broker alone (``Broker.commit_one_phase``, or its socket's ``TXN_COMMIT_ONE_PHASE``).

A :class:`~actors.client.transactional.Transaction` buffers its messages until the
commit. When at the commit nothing of it was sent yet, it carries no consumer offsets,
its context was never handed out, and every message can go to a queue of one master, that
master is its only participant: its append *is* the decision, and the transaction
coordinator is not asked (no logged decision, no half copies, no second append). The
broker writes the messages as committed ones and, last, a marker on
``RMQ_SYS_TXN_COMMIT`` naming the transaction, in one append (``MessageStore.put_group``):
recovery keeps the group whole or drops it, a slave dispatches it once its marker
arrived, and under SYNC_MASTER the answer waits for the slave to hold the marker.

What keeps it safe without the coordinator:

* **Fencing.** The producer's epoch must equal this broker's fence for its
  ``transactional_id``. The fences are in memory, so before its first one-phase commit a
  broker (a fresh process, a slave made master) takes every fence from the coordinator;
  after that the coordinator's ``init_producer`` raises the fence here, and fails when a
  live master did not take it, so a newer instance never starts while a broker could
  still take its predecessor's commit. An epoch above the fence (an id first used since,
  or its raise still on the way) makes the broker take the fences again; still above,
  or the coordinator not reached, the commit is refused and the producer commits in two
  phases (:class:`OnePhaseRefusedError`, nothing written).
* **Once.** A commit whose answer was lost is sent again with the same transaction id:
  the broker answers the first one's count and writes nothing (the ids of the commits
  it holds are read back from the marker queue at the first one-phase commit); a repeat
  that arrives while the first is being stored waits for it.
* **Concurrency.** The lock covers the checks and counting a commit in flight, not its
  append, fsync or replication: commits of several producers share fsyncs as sends do.
  A fence raise returns once every commit that passed the old fence is done, and the
  offset table's marker watermark stays below the lowest marker a commit in flight may
  get.
* **DLedger** groups keep the two phases (their entries are compared byte for byte; the
  group append is not one of their entries' shapes yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import ray

from actors.broker.ha import Replication
from actors.broker.runtime import BrokerRuntime
from actors.protocol import checks
from actors.protocol.errors import OnePhaseRefusedError
from actors.protocol.names import TXN_COORDINATOR_NAME
from storage import transaction
from storage.codec import EncodedBatch
from storage.errors import InvalidMessageError, ProducerFencedError
from storage.message import GetStatus, Message
from storage.store import PutBatchResult

log = logging.getLogger("raymq.actors.broker.transaction.one_phase")

REMEMBERED = 100_000
"""Transaction ids of one-phase commits kept to answer a repeated commit."""
_SYNC_TIMEOUT_S = 10.0


class OnePhaseCommits:
    """A master's one-phase commits (see the module doc)."""

    def __init__(self, runtime: BrokerRuntime, role: Replication) -> None:
        self.rt = runtime
        self.role = role
        self.groups: Any = None  # the broker's ConsumerManageProcessor (attach)
        self._lock = asyncio.Lock()
        self._synced = False
        self._done: OrderedDict[str, int] = OrderedDict()  # txn id -> its message count
        self._inflight: dict[str, asyncio.Future[int]] = {}  # txn id -> its count, once stored
        # marker queue offsets below which no commit in flight has its marker -> how many
        self._unsettled: dict[int, int] = {}
        # ASYNC_FLUSH puts stay on the loop, SYNC_FLUSH ones wait for fsync in a thread
        self._inline = runtime.config.inline_async_puts and not runtime.store.config.sync_flush

    def attach(self, groups: Any) -> None:
        """Take the broker's offset commits (``ConsumerManageProcessor``), then re-apply
        what one-phase commits stored and the offset table lacks (a crash between a
        commit's append and the table's save): before the broker serves an offset."""
        self.groups = groups
        self.rt.replay_txn_offsets = self.replay_offsets
        self.replay_offsets()

    def replay_offsets(self) -> int:
        """The offsets of every commit marker from the table's watermark on, where ahead
        of the table (a later reset or commit is not moved back); how many queues moved."""
        store, table = self.rt.store, self.rt.offsets
        cq = store.find_consume_queue(transaction.COMMIT_TOPIC, 0)
        if cq is None or cq.max_offset <= table.txn_markers:
            return 0
        offset = max(table.txn_markers, store.min_offset(transaction.COMMIT_TOPIC, 0))
        moved = markers = 0
        read_to = [offset]
        for fields in self._markers(offset, read_to):
            try:
                for group, rows in (fields.get("offsets") or {}).items():
                    for topic, qid, off in rows:
                        if int(off) > table.query(group, topic, int(qid)):
                            table.commit(group, topic, int(qid), int(off))
                            moved += 1
                markers += 1
            except (ValueError, TypeError, AttributeError):
                log.warning("a commit marker's offsets do not read: %.200r", fields)
        table.mark_markers(read_to[0])
        table.persist()
        if moved:
            log.warning(
                "broker %s: %d queue offsets of %d one-phase commits re-applied (saved after "
                "the table was)",
                self.rt.config.actor_name,
                moved,
                markers,
            )
        return moved

    async def commit(
        self,
        txn_id: str,
        transactional_id: str,
        epoch: int,
        blob: Any,
        offsets: dict[str, list[list[Any]]] | None = None,
    ) -> dict[str, Any]:
        """Store ``blob`` (an encoded batch of plain messages) as transaction ``txn_id``
        of ``transactional_id`` at ``epoch``, committed, with ``offsets`` (group ->
        [[topic, queue id, next offset]], queues of this broker) committed with it:
        ``{"count", "again"}`` (again: committed before, nothing written now).
        ProducerFencedError for an older epoch; OnePhaseRefusedError when this broker
        cannot decide alone (nothing written)."""
        txn_id = checks.check_str("txn_id", txn_id)
        tid = checks.check_str("transactional_id", transactional_id)
        epoch = checks.check_int("epoch", epoch, 0)
        by_group = self._checked_offsets(offsets)
        if not getattr(self.role, "one_phase", True):
            raise OnePhaseRefusedError(
                f"broker {self.rt.config.actor_name} ({self.role.role}): commit in two phases"
            )
        batch = EncodedBatch.from_bytes(blob)
        batch.check_structure()
        rt = self.rt
        async with self._lock:  # the checks, and the commit counted in flight, together
            if not self._synced:
                await self._sync()
            first = self._inflight.get(txn_id)
            if txn_id not in self._done and first is None:
                self._check_epoch(tid, epoch)
                if epoch > rt.store.txn_fences.epoch_of(tid):
                    # an id first used since the sync, or its raise still on the way
                    await self._take_fences()
                    self._check_epoch(tid, epoch)
                if epoch > rt.store.txn_fences.epoch_of(tid):
                    raise OnePhaseRefusedError(
                        f"transactional id {tid!r}: epoch {epoch} not known here yet (fence "
                        f"{rt.store.txn_fences.epoch_of(tid)}): commit in two phases"
                    )
                mine: asyncio.Future[int] = rt.loop.create_future()
                self._inflight[txn_id] = mine
                # its marker's queue offset will be at least this: the watermark stays below
                cq = rt.store.find_consume_queue(transaction.COMMIT_TOPIC, 0)
                bound = cq.max_offset if cq is not None else 0
                self._unsettled[bound] = self._unsettled.get(bound, 0) + 1
        if txn_id in self._done:
            rt.stats["txn_one_phase_repeated"] += 1
            return {"count": self._done[txn_id], "again": True}
        if first is not None:  # the same commit, sent again while the first is stored
            count = await asyncio.shield(first)
            rt.stats["txn_one_phase_repeated"] += 1
            return {"count": count, "again": True}
        # to its end even if this request is cancelled: what was appended is counted
        return await asyncio.shield(self._commit(txn_id, tid, epoch, batch, by_group, mine, bound))

    async def _commit(
        self,
        txn_id: str,
        tid: str,
        epoch: int,
        batch: EncodedBatch,
        by_group: dict[str, dict[tuple[str, int], int]],
        mine: asyncio.Future[int],
        bound: int,
    ) -> dict[str, Any]:
        """The commit counted in flight (:meth:`commit`), stored and settled."""
        rt = self.rt
        marker = transaction.commit_marker(
            txn_id,
            tid,
            epoch,
            len(batch),
            {g: [[t, q, o] for (t, q), o in qs.items()] for g, qs in by_group.items()},
        )
        appended: list[bool] = []
        try:
            created = await self._store(batch, marker, by_group, appended)
        except BaseException as exc:
            if not appended:  # refused before its append (a slave, a full disk): no marker
                self._settle(bound)
            # else its marker is stored: the watermark stays below it (a restart
            # re-applies its offsets), for as long as this process runs
            self._inflight.pop(txn_id, None)
            mine.set_exception(exc)
            mine.exception()  # retrieved: a repeat that never came is no error
            raise
        self._settle(bound)
        if by_group:  # saved before the answer, as a two-phase decision's offsets are
            await rt.run(rt.offsets.persist)
        self._done[txn_id] = len(batch)
        while len(self._done) > REMEMBERED:
            self._done.popitem(last=False)
        self._inflight.pop(txn_id, None)
        mine.set_result(len(batch))
        if created:
            await rt.register_all()
        rt.stats["txn_one_phase"] += 1
        rt.stats["put_msgs"] += len(batch)
        rt.stats["put_batches"] += 1
        return {"count": len(batch), "again": False}

    def _check_epoch(self, tid: str, epoch: int) -> None:
        fence = self.rt.store.txn_fences.epoch_of(tid)
        if epoch < fence:
            raise ProducerFencedError(
                f"transactional id {tid!r}: epoch {epoch} is fenced by epoch {fence}"
            )

    async def _store(
        self,
        batch: EncodedBatch,
        marker: Message,
        by_group: dict[str, dict[tuple[str, int], int]],
        appended: list[bool],
    ) -> bool:
        """The group (``batch`` and its ``marker``) appended (and durable, replicated, as
        the role wants: ``appended`` gets True once it is in the log), then its offsets
        committed; whether a topic was created for it."""
        rt = self.rt
        created = False
        for i, topic in enumerate(batch.topics):
            ids = (
                batch.queue_ids if len(batch.topics) == 1 else batch.queue_ids[batch.topic_idx == i]
            )
            _, new = rt.topics.for_write(topic, int(ids.max()), 0)
            created |= new

        async def local_put(b: EncodedBatch) -> PutBatchResult:
            if self._inline:  # a copy into the mapped file: as a send's put
                result = rt.store.put_group(b, marker)
            else:  # SYNC_FLUSH: its fsync shared with the puts of others meanwhile
                result = await rt.run(rt.store.put_group, b, marker)
            appended.append(True)
            return result

        rt.check_writable()
        await self.role.put(batch, local_put)
        if rt.faults.take("crash_after_one_phase"):
            rt.faults.crash()  # stored, the offsets not saved, nothing answered
        for group, queues in by_group.items():
            await self.groups.commit_offsets(group, queues)
        return created

    def _settle(self, bound: int) -> None:
        """A commit counted in flight from ``bound`` is done: raise the table's watermark
        to the lowest marker a commit still in flight may have (or past every marker)."""
        left = self._unsettled[bound] - 1
        if left:
            self._unsettled[bound] = left
        else:
            del self._unsettled[bound]
        rt = self.rt
        if self._unsettled:
            below = min(self._unsettled)
        else:
            cq = rt.store.find_consume_queue(transaction.COMMIT_TOPIC, 0)
            below = cq.max_offset if cq is not None else 0
        rt.offsets.mark_markers(below)

    async def raise_fence(self, transactional_id: str, epoch: int) -> None:
        """Raise a fence; return once every one-phase commit that passed the old one is
        done (stored or failed): what the new instance reads next includes them."""
        async with self._lock:
            self.rt.store.txn_fences.raise_fence(transactional_id, epoch)
            passed = list(self._inflight.values())
        if passed:
            await asyncio.gather(*(asyncio.shield(f) for f in passed), return_exceptions=True)

    def _checked_offsets(
        self, offsets: dict[str, list[list[Any]]] | None
    ) -> dict[str, dict[tuple[str, int], int]]:
        """``offsets`` from the wire as group -> {(topic, queue id): offset}, each checked
        as a commit of them would be (refused before anything is written)."""
        if offsets is None:
            return {}
        if not isinstance(offsets, dict):
            raise InvalidMessageError(f"offsets: must be a dict by group, got {offsets!r:.80}")
        by_group = {}
        for group, rows in offsets.items():
            if not isinstance(rows, (list, tuple)) or not all(
                isinstance(r, (list, tuple)) and len(r) == 3 for r in rows
            ):
                raise InvalidMessageError(f"offsets of {group!r}: [[topic, queue id, offset]]")
            queues = {(t, q): o for t, q, o in rows}
            by_group[group] = self.groups.check_offsets(group, queues)
        return by_group

    async def _sync(self) -> None:
        """Before the first one-phase commit (lock held): every fence from the
        coordinator, and the ids of the one-phase commits this store holds."""
        rt = self.rt
        fences = await self._take_fences()
        done = await rt.run(self._committed_here)
        for txn_id, count in done.items():
            self._done[txn_id] = count
        self._synced = True
        log.info(
            "broker %s: one-phase commits on (%d producers' epochs, %d commits held)",
            rt.config.actor_name,
            fences,
            len(done),
        )

    async def _take_fences(self) -> int:
        """Raise every fence to the coordinator's epochs; how many producers it knows."""
        rt = self.rt
        try:
            coordinator = await rt.run(ray.get_actor, TXN_COORDINATOR_NAME, rt.config.namespace)
            fences: dict[str, int] = await asyncio.wait_for(
                coordinator.fences.remote(), _SYNC_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - whatever it was: not known here
            raise OnePhaseRefusedError(
                f"broker {rt.config.actor_name}: the producers' epochs are not known here "
                f"({type(exc).__name__}: {exc}): commit in two phases"
            ) from None
        for tid, epoch in fences.items():
            rt.store.txn_fences.raise_fence(tid, int(epoch))
        return len(fences)

    def _committed_here(self) -> dict[str, int]:
        """The latest :data:`REMEMBERED` one-phase commits of the marker queue."""
        store = self.rt.store
        cq = store.find_consume_queue(transaction.COMMIT_TOPIC, 0)
        if cq is None:
            return {}
        offset = max(store.min_offset(transaction.COMMIT_TOPIC, 0), cq.max_offset - REMEMBERED)
        return {f["txn"]: int(f.get("count", 0)) for f in self._markers(offset)}

    def _markers(self, offset: int, read_to: list[int] | None = None) -> Iterator[dict[str, Any]]:
        """The commit markers' fields from marker queue ``offset`` to its end (a record
        that is no marker logged and skipped); ``read_to[0]`` follows where reading got."""
        store = self.rt.store
        cq = store.find_consume_queue(transaction.COMMIT_TOPIC, 0)
        end = cq.max_offset if cq is not None else 0
        while offset < end:
            got = store.get("CID_RMQ_SYS_TXN_COMMIT", transaction.COMMIT_TOPIC, 0, offset, 1024)
            if got.status is not GetStatus.FOUND or not got.messages:
                break
            for m in got.messages:
                try:
                    fields = transaction.marker_fields(m.body)
                except (ValueError, TypeError):
                    log.warning("a record of %s is no commit marker", transaction.COMMIT_TOPIC)
                    continue
                yield fields
            offset = got.next_offset
            if read_to is not None:
                read_to[0] = offset

    def status(self) -> dict[str, Any]:
        return {"txn_one_phase_synced": self._synced, "txn_one_phase_tracked": len(self._done)}
