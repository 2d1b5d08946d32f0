"""The transaction check service (RocketMQ's ``TransactionalMessageCheckService``).

Every ``transaction_check_interval_s`` the half messages older than
``transaction_timeout_s`` (by born time, as RocketMQ) that are not done are checked:
the half message is put back to the half queue with ``TRANSACTION_CHECK_TIMES`` one
higher and the old one marked done, in one append (RocketMQ's ``putBackHalfMsgQueue``:
the check count lives in the CommitLog, so it survives a restart), then a live
producer of its group is asked about the new copy (``actors.broker.client.
producer_manager``); its answers come back batched, as ``end_transactions``. After
``transaction_check_max`` checks the half message is discarded: marked done and copied
to ``TRANS_CHECK_MAX_TIME_TOPIC``. A round is batched: up to ``_CHECK_CHUNK`` half
messages share one append (their copies and one op message naming them all) and one
call per producer group, so a backlog of 10,000 is a handful of appends.

The half messages of multi-message transactions are the transaction coordinator's:
for those it asks the coordinator, and ends those it aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from actors.broker.client.producer_manager import ProducerManager
from actors.broker.runtime import BrokerRuntime
from actors.broker.transaction.bridge import TransactionalMessageBridge, epoch_of
from actors.protocol.names import TXN_COORDINATOR_NAME
from storage import transaction
from storage.errors import BrokerUnavailableError
from storage.message import Message, MessageExt

log = logging.getLogger("raymq.actors.broker.transaction.check_service")

_CHECK_CHUNK = 1024  # half messages per check append and relay call
_CHECK_CHUNK_BYTES = 8 << 20  # and their bodies

EndHalves = Callable[[str, bool, list[int | str]], Awaitable[int]]
"""Ends half messages of a multi-message transaction by CommitLog offset
(``EndTransactionProcessor.end_halves``)."""


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


class TransactionalMessageCheckService:
    """One broker's check rounds, on its event loop."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        bridge: TransactionalMessageBridge,
        producers: ProducerManager,
        end_halves: EndHalves,
    ) -> None:
        self.rt = runtime
        self.bridge = bridge
        self.producers = producers
        self.end_halves = end_halves
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = self.rt.loop.create_task(self._check_loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

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
        ``end_transactions``)."""
        bridge = self.bridge
        async with bridge.lock:  # the done set changes only with the lock held
            await bridge.ensure_loaded()
        config = self.rt.config
        timeout_ms = int(config.transaction_timeout_s * 1000)
        handled = 0
        pending = await self.rt.run(bridge.pending_halves)
        async with bridge.lock:
            bridge.forget_done()
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
                global_txns[gtxn] = (owner, epoch_of(half), born)
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
        bridge = self.bridge
        check_max = self.rt.config.transaction_check_max
        async with bridge.lock:
            todo = [h for h in halves if not bridge.is_done(h.queue_offset)]  # not ended meanwhile
            if not todo:
                return 0
            again = [h for h in todo if transaction.check_times(h) < check_max]
            maxed = [h for h in todo if transaction.check_times(h) >= check_max]
            op = transaction.op_message([h.queue_offset for h in todo])
            batch = bridge.encode(
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
            put = await bridge.write(batch)
            bridge.mark_done(h.queue_offset for h in todo)
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
            relay = self.producers.live_producer(group)
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
            if not self.bridge.still_pending(halves_of[txn_id]):
                continue  # ended since the scan
            try:
                state: str = await asyncio.wait_for(
                    coordinator.resolve.remote(txn_id, owner, epoch, born_ms), 10.0
                )
            except Exception as exc:  # noqa: BLE001 - the next round asks again
                log.warning("transaction %s: the coordinator did not answer: %s", txn_id, exc)
                continue
            if state == "abort":  # a commit is applied by the coordinator alone
                left = self.bridge.still_pending(halves_of[txn_id])
                if left:
                    offsets: list[int | str] = [h.commitlog_offset for h in left]
                    ended += await self.end_halves(txn_id, False, offsets)
                self.rt.stats["txn_resolved"] += 1
        return ended
