"""Ends of transactions on the broker (RocketMQ's ``EndTransactionProcessor``).

:meth:`EndTransactionProcessor.end_transaction` (the producer's answer, or a check's)
commits or rolls back the half message at a CommitLog offset. A commit writes the
message to its real topic and queue (SYSFLAG ``TRANSACTION_COMMIT_TYPE``, the
transaction properties cleared) *and* the op message that marks the half message
done, in one append: both are stored or neither. A rollback writes only the op
message. A half message with an op message is done: a second end changes nothing.

The answers to a check round come back batched (:meth:`end_transactions`, one
append per call); the transaction coordinator's decision on a multi-message
transaction ends every half message of it held here in one append
(:meth:`end_transaction_batch`). The half and op topics are the bridge's
(``actors.broker.transaction.bridge``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from actors.broker.processor.consumer_manage import ConsumerManageProcessor
from actors.broker.runtime import BrokerRuntime
from actors.broker.transaction.bridge import TransactionalMessageBridge, epoch_of
from actors.protocol import checks
from storage import transaction
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError, InvalidMessageError
from storage.message import MessageExt
from storage.properties import PROP_UNIQ_KEY

log = logging.getLogger("raymq.actors.broker.processor.end_transaction")


def _copy_key(half: MessageExt) -> tuple[str, str]:
    return half.properties.get("REAL_TOPIC", ""), half.properties.get(PROP_UNIQ_KEY, "")


class EndTransactionProcessor:
    """Commits and rollbacks of half messages, by producers, checks and the coordinator."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        bridge: TransactionalMessageBridge,
        groups: ConsumerManageProcessor,
    ) -> None:
        self.rt = runtime
        self.bridge = bridge
        self.groups = groups

    async def end_transaction(
        self, producer_group: str, half_offset: int, transaction_id: str, commit: bool
    ) -> bool:
        """Commit (or roll back) the half message at CommitLog offset ``half_offset``,
        whose message id is ``transaction_id``; False when it was ended (or discarded)
        before: nothing is written then."""
        ends = [(half_offset, transaction_id, commit)]
        return await self.end_transactions(producer_group, ends) == 1

    async def end_transactions(self, producer_group: str, ends: list[tuple[int, str, bool]]) -> int:
        """End many single-message transactions of ``producer_group`` in one append (a
        producer's answers to a check round): ``ends`` holds (half message's CommitLog
        offset, its message id, commit). The committed copies and one op message naming
        every half message ended are stored together, or nothing is. Those ended before
        are skipped; returns how many were ended. One end that names no half message of
        ``producer_group`` refuses the whole call and writes nothing."""
        group = checks.validate_group(producer_group, "producer group")
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
        bridge = self.bridge
        async with bridge.lock:
            await bridge.ensure_loaded()
            offsets = [offset for offset, _, _ in parsed]
            halves = (
                bridge.halves_at(offsets)
                if bridge.inline or len(offsets) == 1
                else await self.rt.run(bridge.halves_at, offsets)
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
                if bridge.is_done(half.queue_offset) or half.queue_offset in todo:
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
            batch = bridge.committed(commits, op) if commits else bridge.encode([op], [None])
            await bridge.write(batch)
            bridge.mark_done(todo)
            self.rt.stats["txn_committed"] += len(commits)
            self.rt.stats["txn_rolled_back"] += len(todo) - len(commits)
            return len(todo)

    async def end_transaction_batch(
        self,
        txn_id: str,
        commit: bool,
        half_offsets: list[int | str] | None = None,
        offsets: dict[str, dict[tuple[str, int], int]] | None = None,
        transactional_id: str | None = None,
        epoch: int | None = None,
        retry: bool = False,
    ) -> int:
        """The transaction coordinator's decision on multi-message transaction ``txn_id``:
        every half message of it held here committed or rolled back in one append
        (:meth:`end_halves`), and on commit ``offsets`` (group -> {(topic, queue id):
        offset}) committed and saved; on a ``retry`` only those ahead of where the group
        is. How many half messages it ended (0 when all were ended before)."""
        groups = self.groups
        if offsets is not None:  # refused before anything ends
            if not isinstance(offsets, dict):
                raise InvalidMessageError(f"offsets: must be a dict, got {type(offsets).__name__}")
            offsets = {g: groups.check_offsets(g, queues) for g, queues in offsets.items()}
        ended = await self.end_halves(txn_id, commit, half_offsets, transactional_id, epoch, retry)
        if commit and offsets:
            rt = self.rt
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

    async def end_halves(
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
        bridge = self.bridge
        async with bridge.lock:
            await bridge.ensure_loaded()
            if half_offsets is not None and not isinstance(half_offsets, (list, tuple)):
                raise InvalidMessageError(f"half_offsets: must be a list, got {half_offsets!r:.80}")
            refs = (
                None if half_offsets is None else [checks.check_half_ref(o) for o in half_offsets]
            )
            by_id = None if refs is None else {r for r in refs if isinstance(r, str)}
            if refs is None or by_id:
                # by the transaction's id, and (by_id) of those only the ones named: a
                # failed attempt's halves of the same transaction are never named
                pending = await self.rt.run(bridge.pending_halves)
                halves = [
                    h
                    for h in pending
                    if transaction.global_txn(h) == txn_id
                    and (by_id is None or h.properties.get(PROP_UNIQ_KEY) in by_id)
                ]
                at = [r for r in refs or () if isinstance(r, int)]
                if at:
                    halves += await self.rt.run(bridge.named_halves, txn_id, at)
            else:
                offsets = [r for r in refs if isinstance(r, int)]
                records = (
                    bridge.records_at(offsets)
                    if bridge.inline
                    else await self.rt.run(bridge.records_at, offsets)
                )
                if records is not None:  # the usual case: no record decoded
                    for offset, owner in zip(offsets, records.txn_ids):
                        if owner != txn_id:
                            raise InvalidMessageError(
                                f"the message at {offset} is no half message of transaction "
                                f"{txn_id!r}"
                            )
                    picked = bridge.not_done(records.queue_offsets)
                    if not picked:
                        return 0
                    done = [records.queue_offsets[i] for i in picked]
                    op = bridge.encode([transaction.op_message(done)], [None])
                    if commit and retry:
                        picked = await self._not_copied(picked, records.copy_key)
                    copies = records.committed(picked) if commit and picked else None
                    if copies is not None or not commit or not picked:
                        batch = op if copies is None else EncodedBatch.concat([copies, op])
                        return await self._ended(txn_id, commit, done, batch)
                # a record the byte-level walk leaves to the decoder
                halves = (
                    bridge.named_halves(txn_id, offsets)
                    if bridge.inline
                    else await self.rt.run(bridge.named_halves, txn_id, offsets)
                )
            todo = [halves[i] for i in bridge.not_done([h.queue_offset for h in halves])]
            if not todo:
                return 0
            done = [h.queue_offset for h in todo]
            op_message = transaction.op_message(done)
            if commit and retry:
                keep = await self._not_copied(list(range(len(todo))), lambda i: _copy_key(todo[i]))
                todo = [todo[i] for i in keep]
            if commit and todo:
                batch = bridge.committed(todo, op_message)
            else:
                batch = bridge.encode([op_message], [None])
            return await self._ended(txn_id, commit, done, batch)

    async def abort_fenced(self, transactional_id: str, epoch: int) -> int:
        """Roll back every pending half message of ``transactional_id`` from an epoch
        below ``epoch`` (its new instance fenced them), in one append; how many."""
        bridge = self.bridge
        async with bridge.lock:
            await bridge.ensure_loaded()
            stale = [
                h
                for h in await self.rt.run(bridge.pending_halves)
                if h.properties.get(transaction.PROP_TXN_PRODUCER) == transactional_id
                and epoch_of(h) < epoch
            ]
            if not stale:
                return 0
            await bridge.write(
                bridge.encode([transaction.op_message([h.queue_offset for h in stale])], [None])
            )
            bridge.mark_done(h.queue_offset for h in stale)
            self.rt.stats["txn_rolled_back"] += len(stale)
        log.info(
            "%d half messages of %s below epoch %d rolled back (fenced)",
            len(stale),
            transactional_id,
            epoch,
        )
        return len(stale)

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

    async def _ended(self, txn_id: str, commit: bool, done: list[int], batch: EncodedBatch) -> int:
        """Write a transaction's end (lock held) and mark its half messages done."""
        if commit and len(batch) > 1 and self.rt.faults.take("crash_mid_commit"):
            await self.bridge.write(batch.select([(0, max(1, (len(batch) - 1) // 2))]))
            self.rt.faults.crash()  # a SIGKILL in the middle of the append
        await self.bridge.write(batch)
        self.bridge.mark_done(done)
        self.rt.stats["txn_committed" if commit else "txn_rolled_back"] += len(done)
        log.debug(
            "transaction %s: %d half messages %s",
            txn_id,
            len(done),
            "committed" if commit else "rolled back",
        )
        return len(done)
