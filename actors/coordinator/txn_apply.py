"""The transaction coordinator's side that tells the brokers: each decision applied at
every participant (``Broker.end_transaction_batch``, over the brokers' sockets) and
``done`` logged once all took it, in the order decided, retried every
``retry_interval_s`` while a broker is down; and a new producer epoch's fence raised on
every master. ``TransactionCoordinator`` (``actors.coordinator.txn``) is built on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

from ray.exceptions import RayActorError

from actors.namesrv.brokers import BrokerHandles
from actors.namesrv.client import NameServerClient, discover_nameservers
from actors.protocol.data_path import DataPath
from actors.protocol.rpc import PendingCall
from storage.errors import BrokerUnavailableError
from storage.txn_log import COMMIT, OPEN, Offsets, TransactionLog, TxnRecord

log = logging.getLogger("raymq.actors.coordinator.txn")

_COMPACT_EVERY = 10_000  # log records between compactions, at least


def _answer(call: Any) -> Any:
    """A broker call's answer to await: a Ray ObjectRef as it is, a data-path socket's
    :class:`PendingCall` as an asyncio future."""
    if isinstance(call, PendingCall):
        return asyncio.wrap_future(call.future())
    return call


def _offsets_for(offsets: Offsets, broker: str) -> dict[str, dict[tuple[str, int], int]]:
    return {g: {(t, q): o for t, q, o in qs} for g, qs in offsets.get(broker, {}).items()}


class DecisionApplier:
    """Applies one coordinator's logged decisions at the brokers and fences them."""

    namespace: str
    retry_interval_s: float
    keep_done_ms: int
    log: TransactionLog
    stats: Counter[str]
    _nameservers: list[str] | None
    _brokers: BrokerHandles | None
    _data_path: DataPath
    _master_cache: dict[str, Any]
    _lock: asyncio.Lock
    _fresh: set[str]
    _told: set[tuple[str, str]]
    _applied: dict[str, asyncio.Event]
    _queue: asyncio.Queue[TxnRecord]
    _wake: asyncio.Event
    _closing: bool

    async def _io_call(self, fn: Any, *args: Any) -> Any:
        raise NotImplementedError

    async def _masters(self, refresh: bool = False) -> dict[str, Any]:
        """Broker name -> master handle, from the NameServers when asked to refresh (or
        never asked yet): a commit costs no NameServer call."""
        if self._brokers is None:
            names = self._nameservers or await self._io_call(discover_nameservers, self.namespace)
            ns = NameServerClient(names, self.namespace)
            self._brokers = BrokerHandles(ns, wrap=self._data_path.wrap)
        if refresh or not self._master_cache:
            self._master_cache = await self._io_call(self._brokers.masters)
        return self._master_cache

    async def _apply(self, txn: TxnRecord, again: bool = False) -> bool:
        """Tell every participant the decision; log ``done`` when all applied it.
        ``again``: even when done (a broker skips half messages it ended)."""
        if txn.state == OPEN or (txn.done and not again):
            return txn.done
        commit = txn.state == COMMIT
        try:
            masters = await self._masters()
        except Exception as exc:  # noqa: BLE001 - the drive loop tries again
            log.warning("transaction %s: no broker list (%s)", txn.txn_id, exc)
            return False
        names = sorted(txn.participants())
        if any(b not in masters for b in names):
            masters = await self._masters(refresh=True)
        missing = [b for b in names if b not in masters]
        calls = []
        for b in names:
            if b not in masters:
                continue
            retry = again or txn.txn_id not in self._fresh or (txn.txn_id, b) in self._told
            self._told.add((txn.txn_id, b))
            call = masters[b].end_transaction_batch.remote(
                txn.txn_id,
                commit,
                txn.halves.get(b, []),  # None: the broker finds them by the id
                _offsets_for(txn.offsets, b) if commit else None,
                txn.tid,
                txn.epoch,
                retry,
            )
            calls.append(asyncio.wait_for(_answer(call), 30.0))
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            log.warning("transaction %s: a broker did not apply %s: %r", txn.txn_id, txn.state, r)
        if missing:
            log.warning("transaction %s: no live master of %s", txn.txn_id, missing)
        if failed or missing:
            self._master_cache = {}  # a master may have changed: ask the NameServers again
            return False
        async with self._lock:
            if not txn.done:
                await self._io_call(self.log.done, txn)
                self.stats["commit_done" if commit else "abort_done"] += 1
        self._fresh.discard(txn.txn_id)
        for b in names:
            self._told.discard((txn.txn_id, b))
        applied = self._applied.pop(txn.txn_id, None)
        if applied is not None:
            applied.set()
        return True

    async def _fence_brokers(self, tid: str, epoch: int) -> None:
        try:
            masters = await self._masters()
        except Exception as exc:  # noqa: BLE001 - the commit-time checks still hold
            log.warning("fencing %s: no broker list (%s)", tid, exc)
            return
        calls = [
            asyncio.wait_for(h.fence_transactional.remote(tid, epoch), 10.0)
            for h in masters.values()
        ]
        rolled = 0
        missed = []
        for name, r in zip(masters, await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(r, BaseException):
                log.warning("fencing %s at epoch %d: a broker did not take it: %r", tid, epoch, r)
                if not isinstance(r, RayActorError):
                    missed.append(name)
            else:
                rolled += int(r)
        if missed:
            # a live master without the fence could take the old instance's one-phase
            # commit (actors.broker.transaction.one_phase); one that is gone takes every fence from
            # here before its first. So the new instance does not start yet
            raise BrokerUnavailableError(
                f"transactional id {tid!r}: epoch {epoch} logged, but {', '.join(missed)} "
                "did not take its fence: try again"
            )
        if rolled:
            self.stats["halves_rolled_back_fenced"] += rolled
            log.warning("fencing %s at epoch %d rolled back %d half messages", tid, epoch, rolled)

    async def _apply_loop(self) -> None:
        """Fresh decisions applied one transaction at a time, in the order decided (each
        to its brokers at once): what a broker shows follows the commit order, also when
        the producers do not wait for it.

        A transaction a broker did not take (down, restarting, no master: the call fails
        at once) is not tried again here: the loop goes on to the next one, and the
        drive loop retries every decision not done, in the order decided, every
        ``retry_interval_s``. So a broker down holds up no transaction of the others (one
        that hangs unanswered holds this loop up to the call's 30 s timeout); a waiting
        commit of the stuck one waits for those retries (``end``, up to
        ``apply_wait_s``)."""
        while not self._closing:
            txn = await self._queue.get()
            try:
                done = await self._apply(txn)
            except Exception as exc:  # noqa: BLE001 - the drive loop tries again
                log.warning("transaction %s: applying failed: %r", txn.txn_id, exc)
                done = False
            if not done:
                self._wake.set()

    async def _drive_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.retry_interval_s)
            self._wake.clear()
            try:
                await self._drive_once()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("transaction coordinator round failed")

    async def _drive_once(self) -> None:
        for t in [self.log.txns[txn_id] for txn_id in self.log.undone]:
            await self._apply(t)
        if self.log.compaction_due(_COMPACT_EVERY):
            async with self._lock:
                forgot = await self._io_call(self.log.compact, self.keep_done_ms)
            log.info("transaction log compacted: %d done transactions forgotten", forgot)
