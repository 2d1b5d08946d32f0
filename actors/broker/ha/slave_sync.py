"""SlaveSynchronize: a slave (or DLedger follower) copies its master's metadata.

Every ``slave_sync_interval_s`` the slave pushes the consumer offsets it took
itself (consumers commit to a slave while the master is gone), then fetches
the master's topics, consumer offsets, delay progress and subscription groups (the
FIFO groups of POP consumption) and adopts them.

Invariant: after a round, the slave's topics equal the master's (plus any it
learned from replicated records since the master's snapshot was taken), and its
consumer offsets equal the master's except for queues a consumer committed to
the slave since, which keep the larger offset; a consumer's committed offset
never goes backwards when the master comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from actors.broker.ha.replication import OffsetTable

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.ha")

MasterLookup = Callable[[], Awaitable[Any]]
CALL_TIMEOUT_S = 10.0


def merge_into(table: OffsetTable, other: OffsetTable) -> None:
    for key, queues in other.items():
        mine = table.setdefault(key, {})
        for qid, offset in queues.items():
            mine[qid] = max(offset, mine.get(qid, -1))


class SlaveSynchronize:
    def __init__(
        self,
        broker: BrokerRuntime,
        master: MasterLookup,
        interval_s: float,
        learned: set[str] | None = None,
    ) -> None:
        self.broker = broker
        self.learned = learned if learned is not None else set()
        """Topics learned from replicated records (``Replication.learned``): kept until the
        master's snapshot names them, since a snapshot taken just before the master created
        one must not delete it."""
        self._master = master
        self.interval_s = interval_s
        self.local: OffsetTable = {}  # commits taken here, not yet merged by the master
        self._delay: dict[int, int] | None = None
        self._groups: dict[str, Any] | None = None  # the master's subscriptionGroup.json
        self.last_sync = 0.0
        self.rounds = 0  # metadata snapshots applied
        self._kick = asyncio.Event()

    def record_local(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        for (topic, qid), offset in offsets.items():
            mine = self.local.setdefault((topic, group), {})
            mine[qid] = max(offset, mine.get(qid, -1))

    def kick(self) -> None:
        """Sync now (a new master was found)."""
        self._kick.set()

    async def run(self) -> None:
        while True:
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the master may be gone; try again later
                log.debug("%s: metadata sync failed: %s", self.broker.config.actor_name, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval_s)
            self._kick.clear()

    async def sync_once(self) -> bool:
        handle = await self._master()
        if handle is None:
            return False
        if self.local:
            pushed, self.local = self.local, {}
            try:
                await asyncio.wait_for(handle.ha_merge_offsets.remote(pushed), CALL_TIMEOUT_S)
            except BaseException:
                merge_into(self.local, pushed)
                raise
        snapshot = await asyncio.wait_for(handle.ha_config_snapshot.remote(), CALL_TIMEOUT_S)
        await self.broker.run(self.apply, snapshot)
        self.last_sync = asyncio.get_running_loop().time()
        self.rounds += 1
        return True

    def apply(self, snapshot: dict[str, Any]) -> None:
        b = self.broker
        theirs = snapshot["topics"]
        mine = b.topics.snapshot()
        changed = False
        for name, tc in theirs.items():
            self.learned.discard(name)
            if mine.get(name) != tc:
                b.topics.put(tc)
                changed = True
        for name in mine.keys() - theirs.keys() - self.learned:
            changed |= b.topics.delete(name)
        offsets: OffsetTable = {k: dict(v) for k, v in snapshot["offsets"].items()}
        merge_into(offsets, self.local)
        b.offsets.replace(offsets)
        # the master's one-phase commit markers whose offsets its table holds: a promotion
        # re-applies those of later markers (actors.broker.transaction.one_phase)
        b.offsets.txn_markers = int(snapshot.get("txn_markers", 0) or 0)
        delay = {int(k): int(v) for k, v in snapshot.get("delay_offsets", {}).items()}
        if delay != self._delay:
            b.store.config_file("delayOffset").save(
                {"offsetTable": {str(k): v for k, v in sorted(delay.items())}}
            )
            self._delay = delay
        groups = snapshot.get("subscription_groups")
        if isinstance(groups, dict) and groups != self._groups:
            b.store.config_file("subscriptionGroup").save(groups)
            b.subscription_groups_changed(groups)
            self._groups = groups
        if changed:  # the NameServers route to this slave's topics when the master is gone
            b.loop.call_soon_threadsafe(b.request_registration)
