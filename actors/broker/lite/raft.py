"""Lite sends and consumer state in a Raft (DLedger) group: the leader proposes them
through the group's log like any put and answers once a majority holds them; every
member indexes only committed records (``LiteStore(committed=...)``), so a lite read
sees only committed messages, and a new leader's lite store catches up before its first
lite send or read.

Consumer state (committed offsets, subscriptions, lite topics deleted by hand) travels
as state records (:mod:`storage.lite.state`): the leader proposes a change, and every
member applies it once committed, the leader too (:meth:`RaftLiteLog.change`), so a new
leader holds every change its predecessor acknowledged. The changes asked for while one
entry of them is under way go together in the next (group commit): the acks of many
lite topics cost one round of the log, not one each.

TTL expiry too: no member expires lite topics on its own clock. Every
``expire_interval_ms`` the leader looks for what is past its parent's TTL and proposes
``expire`` records (:meth:`RaftLiteLog.expire_due`); every member deletes the topics
named there that had no write since the leader looked, at the same point of the log,
and their subscriptions end with them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from actors.broker.ha import DLedgerReplication
from actors.broker.runtime import BrokerRuntime
from storage.errors import BrokerUnavailableError, OffsetOutOfRangeError
from storage.lite import LiteStore
from storage.lite.state import encode_states
from storage.message import Message, PutStatus

MAX_CHANGES = 512
"""Consumer state changes proposed in one entry of the log at most."""
EXPIRE_NAMES = 2048
"""Lite topic names one ``expire`` record carries at most: applying one holds the lite
store's lock a few milliseconds."""

log = logging.getLogger("raymq.actors.broker.lite")


class RaftLiteLog:
    """A broker's lite sends through its Raft group's log."""

    def __init__(self, runtime: BrokerRuntime, store: LiteStore, raft: DLedgerReplication) -> None:
        self.rt = runtime
        self.store = store
        self.raft = raft
        self._queued: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._proposing: asyncio.Task[None] | None = None
        self._expiring: asyncio.Task[None] | None = None
        self.rounds = 0
        """Entries of consumer state changes proposed (each one log round)."""
        self.changes = 0
        """Consumer state changes proposed in them."""

    async def send(
        self, parent: str, messages: list[tuple[str, Message]]
    ) -> tuple[list[str], list[int], list[str], PutStatus]:
        """Propose ``messages`` (``(lite topic, message)`` each) and wait for the commit:
        their lite topics, lite offsets, message ids and the put's status
        (``FLUSH_SLAVE_TIMEOUT`` and offsets -1 when a majority did not take them in
        time: they are indexed when it does)."""
        store = self.store
        await self.caught_up()
        proposal = store.prepare(parent, messages)
        try:
            result = await self.raft.put(proposal.batch, _no_local_put)
        except BaseException:
            store.release(proposal)
            raise
        if result.status is PutStatus.PUT_OK:
            done = await self.rt.run(store.settle, proposal, result.commitlog_offsets)
            offsets = done.lite_offsets.tolist()
        else:
            store.release(proposal)
            offsets = [-1] * len(messages)
        return proposal.lites, offsets, list(proposal.batch.uniq_keys), result.status

    async def change(self, op: dict[str, Any]) -> None:
        """Propose a consumer state change (:mod:`storage.lite.state`) and return once
        the group committed it and this member applied it. ``BrokerUnavailableError``
        when a majority did not take it within ``sync_replication_timeout_s`` (it is
        applied if it commits later) or this member does not lead.

        Changes asked for while a proposal of them is under way wait for it and go
        together, in the order asked, as one entry of the log: one round for the acks
        of many lite topics (at most :data:`MAX_CHANGES` per entry)."""
        await self.caught_up()
        encode_states([op], self.rt.store.config.max_message_size)  # checked before queued
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((op, fut))
        if self._proposing is None:
            self._proposing = asyncio.get_running_loop().create_task(self._propose_queued())
        await fut

    async def _propose_queued(self) -> None:
        """Propose the changes queued, one entry at a time, until none is left."""
        batch: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        try:
            while self._queued:
                batch = self._queued[:MAX_CHANGES]
                del self._queued[:MAX_CHANGES]
                try:
                    await self._propose([op for op, _ in batch])
                except Exception as exc:  # noqa: BLE001 - each caller of the entry gets it
                    _answer(batch, exc)
                else:
                    _answer(batch, None)
        finally:
            self._proposing = None
            # cancelled (the broker closes): the callers still waiting get an error
            _answer(batch + self._queued, BrokerUnavailableError("the broker is closing"))
            self._queued.clear()

    async def _propose(self, ops: list[dict[str, Any]]) -> None:
        batch = encode_states(ops, self.rt.store.config.max_message_size)
        result = await self.raft.put_internal(batch)
        self.rounds += 1
        self.changes += len(ops)
        if result.status is not PutStatus.PUT_OK:
            kinds = ", ".join(sorted({op["op"] for op in ops}))
            raise BrokerUnavailableError(
                f"broker {self.rt.config.actor_name}: lite {kinds} ({len(ops)} changes) not "
                f"committed by a majority of the group in time ({result.status.value})"
            )
        await self.rt.run(self.store.catch_up)

    def start_expiring(self) -> None:
        """Every ``expire_interval_ms``, while this member leads: :meth:`expire_due`."""
        self._expiring = self.rt.loop.create_task(self._keep_expiring())

    async def _keep_expiring(self) -> None:
        interval = self.store.config.expire_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire_due()
            except Exception as exc:  # noqa: BLE001 - the next turn looks again
                log.info("lite expiry of %s not proposed: %s", self.rt.config.actor_name, exc)

    async def expire_due(self) -> int:
        """As the leader: propose the expiry of the lite topics past their parent's TTL
        (``expire`` records of :data:`EXPIRE_NAMES` names at most, one after another)
        and return once every member may apply them; how many were named. A member
        that does not lead proposes nothing."""
        if not self.raft.node.is_leader:
            return 0
        await self.caught_up()
        # a record's body within half the largest message a store takes (a name is 128
        # bytes at most, 3 more in JSON)
        most = max(1, min(EXPIRE_NAMES, self.rt.store.config.max_message_size // 2 // 131))
        due = await self.rt.run(self.store.due_for_expiry, None, most)
        for parent, seen, names in due:
            await self.change({"op": "expire", "parent": parent, "seen": seen, "names": names})
        named = sum(len(names) for _, _, names in due)
        if named:
            log.info("lite expiry of %d topics committed by the group", named)
        return named

    def close(self) -> None:
        if self._proposing is not None:
            self._proposing.cancel()
        if self._expiring is not None:
            self._expiring.cancel()

    async def caught_up(self) -> None:
        """The lite store has indexed every committed record. A new leader knows what
        its predecessors committed once an entry of its own term (its election's no-op)
        commits: it waits for that first, at most ``sync_replication_timeout_s``, before
        it answers its first lite send or read."""
        raft = self.raft
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.rt.config.sync_replication_timeout_s
        while not _own_term_committed(raft):
            left = deadline - loop.time()
            if left <= 0:
                break
            await raft.wait_readable(left)
        if self.store.behind():
            await self.rt.run(self.store.catch_up)


def _own_term_committed(raft: DLedgerReplication) -> bool:
    """Not the leader, or a leader that committed an entry of its own term."""
    node = raft.node
    if not node.is_leader:
        return True
    try:
        return raft.raft_log.term_at(node.commit_index) == node.term
    except OffsetOutOfRangeError:
        return True


def _answer(
    waiting: list[tuple[dict[str, Any], asyncio.Future[None]]], exc: Exception | None
) -> None:
    for _, fut in waiting:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


async def _no_local_put(batch: Any) -> Any:
    raise AssertionError("a Raft group's put is its proposal")  # never called by DLedger
