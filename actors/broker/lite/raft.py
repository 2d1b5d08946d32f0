"""Lite sends and consumer state in a Raft (DLedger) group: the leader proposes them
through the group's log like any put and answers once a majority holds them; every
member indexes only committed records (``LiteStore(committed=...)``), so a lite read
sees only committed messages, and a new leader's lite store catches up before its first
lite send or read.

Consumer state (committed offsets, subscriptions, lite topics deleted by hand) travels
as state records (:mod:`storage.lite.state`): the leader proposes a change, and every
member applies it once committed, the leader too (:meth:`RaftLiteLog.change`), so a new
leader holds every change its predecessor acknowledged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actors.broker.ha import DLedgerReplication
from actors.broker.runtime import BrokerRuntime
from storage.errors import BrokerUnavailableError, OffsetOutOfRangeError
from storage.lite import LiteStore, encode_state
from storage.message import Message, PutStatus


class RaftLiteLog:
    """A broker's lite sends through its Raft group's log."""

    def __init__(self, runtime: BrokerRuntime, store: LiteStore, raft: DLedgerReplication) -> None:
        self.rt = runtime
        self.store = store
        self.raft = raft

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
        applied if it commits later) or this member does not lead."""
        await self.caught_up()
        batch = encode_state(op, self.rt.store.config.max_message_size)
        result = await self.raft.put_internal(batch)
        if result.status is not PutStatus.PUT_OK:
            raise BrokerUnavailableError(
                f"broker {self.rt.config.actor_name}: a lite {op['op']} was not committed by "
                f"a majority of the group in time ({result.status.value})"
            )
        await self.rt.run(self.store.catch_up)

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


async def _no_local_put(batch: Any) -> Any:
    raise AssertionError("a Raft group's put is its proposal")  # never called by DLedger
