"""DLedger mode: a broker group that is a Raft group and elects its master.

The consensus is ``storage.raft.RaftNode``, a pure state machine; this module is
its shell in the Broker actor. It ticks the node from the event loop, carries
its messages to the other members as Ray actor calls (one call per member per
drain, so every message produced in one loop iteration shares it), persists
what the node asks before anything is sent, and applies commits.

The log is the CommitLog itself (``actors.broker.ha.raft_log``). The leader puts a batch
into its store as usual (offsets, store timestamps, its host), proposes that
CommitLog range as one entry, and acknowledges the put once a majority holds
it; followers append the leader's exact bytes at the same offsets and build
their own ConsumeQueues from them. So every member's store holds the same
bytes up to the commit index, and a follower that held an uncommitted,
divergent tail cuts it off (``truncate_commitlog``) when the leader's log says
so. A put is one entry, but everything proposed while a drain is pending rides
in the same ``AppendEntries``.

* Reads: a member serves only committed records (a pull that finds only
  uncommitted ones waits for the commit).
* Routing: the leader registers with the NameServers as broker id 0 with its
  term as ``master_epoch`` (so a deposed leader is refused); followers register
  as ``1 + their configured id``. Clients watching the NameServers re-route at
  once.
* Failover: each member keeps a ``wait_closed`` call pending on every other one;
  Ray fails it as soon as the actor or its node dies, and the survivors elect a
  new leader at once instead of after an election timeout.
* Metadata: followers copy topics, consumer offsets and delay progress from the
  leader (SlaveSynchronize); only the leader runs the schedule service, and its
  deliveries go through the Raft log like any put. Lite topics' sends and consumer
  state go through the log too (``actors.broker.lite.raft``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from actors.broker.ha.dledger_transport import PeerLink, from_wire, to_wire
from actors.broker.ha.raft_log import OWN_ENTRY, CommitLogRaftLog
from actors.broker.ha.replication import LocalPut, OffsetTable, Replication, stop_tasks
from actors.broker.ha.slave_sync import SlaveSynchronize
from actors.protocol.errors import PromotionRefusedError
from actors.protocol.names import MASTER_ID, broker_actor_name
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError
from storage.message import GetStatus, PutStatus, RawGetResult
from storage.raft import (
    HardState,
    RaftConfig,
    RaftNode,
    Ready,
    RequestVote,
    Role,
    SoftState,
)
from storage.raft.errors import NotLeaderError, RaftError
from storage.schedule import ScheduleMessageService
from storage.store import PutBatchResult
from storage.timer import TimerMessageService

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.broker.ha.dledger")

STAGGER_MS = 150
_OFF_QUEUEOFFSET = 20
_OFF_PHYS = 28


class _LeaderStore:
    """The store as the leader's schedule service sees it: as is, except that a delivery
    (``_put_encoded``) goes through the Raft log and returns once committed."""

    def __init__(self, shell: DLedgerReplication) -> None:
        self._shell = shell
        self._store = shell.store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _put_encoded(self, batch: EncodedBatch) -> PutBatchResult:
        shell = self._shell
        fut = asyncio.run_coroutine_threadsafe(shell.put_internal(batch), shell.loop)
        return fut.result(shell.config.sync_replication_timeout_s + 5.0)


class DLedgerReplication(Replication):
    one_phase = False  # a one-phase commit's group is no entry shape of the log yet

    def __init__(self, broker: BrokerRuntime) -> None:
        self.loop = broker.loop
        self.closed = False
        super().__init__(broker)
        cfg = self.config
        self.name = cfg.actor_name
        self.members = {broker_actor_name(cfg.broker_name, p): p for p in cfg.dledger_peers}
        # durable before it is acknowledged, whatever the store's flush mode (raft_log.py)
        self.raft_log = CommitLogRaftLog(self.store, self.store.root / "raft")
        self._hard_file = self.store.config_file("raftHardState")
        saved = self._hard_file.load()
        hard = HardState(int(saved.get("term", 0)), saved.get("votedFor"))
        tick = cfg.dledger_tick_ms
        election = max(2, cfg.dledger_election_timeout_ms // tick)
        self.node = RaftNode(
            self.name,
            list(self.members),
            log=self.raft_log,
            hard_state=hard,
            applied_index=0,
            config=RaftConfig(
                election_timeout_ticks=(election, 2 * election),
                heartbeat_ticks=max(1, min(election - 1, cfg.dledger_heartbeat_ms // tick)),
                max_append_bytes=cfg.ha_transfer_batch_bytes,
                max_append_entries=4096,
                max_inflight=1,  # fewer, larger batches: Ray calls cost more than waiting
                # survivors of a leader campaign one after the other, far enough apart
                # that Ray's notices reaching them some ms apart cannot split the vote
                death_notice_stagger_ticks=max(1, -(-STAGGER_MS // tick)),
            ),
        )
        self._links = {n: PeerLink(self, n) for n in self.members if n != self.name}
        self._waiters: dict[int, tuple[int, asyncio.Future[bool]]] = {}
        self.readable_end = self.raft_log.base  # the CommitLog up to here is committed
        self._committed = self.loop.create_future()
        self._drain_pending = False
        self._draining = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._registered_as: int | None = None
        self._reregister = asyncio.Lock()
        self.sync = SlaveSynchronize(
            broker, self.leader_handle, cfg.slave_sync_interval_s, self.learned
        )
        self._leader_handle_cache: tuple[str, Any] | None = None
        self.leader_changes = 0
        self.death_notices: dict[str, float] = {}  # peer -> time.monotonic() of the last

    def _schedule_factory(self) -> Callable[[], Any] | None:
        return lambda: ScheduleMessageService(_LeaderStore(self))  # type: ignore[arg-type]

    def _timer_factory(self) -> Callable[[], Any] | None:
        return lambda: TimerMessageService(_LeaderStore(self), self.store.timer_wheel)  # type: ignore[arg-type]

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.services.start()  # the schedule service starts when this member leads
        for link in self._links.values():
            link.connect()
        self._tasks.append(self.loop.create_task(self._tick_loop()))
        self._tasks.append(self.loop.create_task(self.sync.run()))
        log.info(
            "%s: DLedger member of %s (term %d, log %r)",
            self.name,
            sorted(self.members),
            self.node.term,
            self.raft_log,
        )

    async def stop(self) -> None:
        self.closed = True
        for link in self._links.values():
            link.close()
        tasks, self._tasks = self._tasks, []
        await stop_tasks(tasks, self.name)
        self._fail_waiters(BrokerUnavailableError(f"{self.name} is shutting down"))
        self.services.stop()
        await self.broker.run(self.raft_log.close)

    async def _tick_loop(self) -> None:
        tick_s = self.config.dledger_tick_ms / 1000
        first = min(self.members)
        while True:
            await asyncio.sleep(tick_s)
            node = self.node
            if (
                node.term == 0
                and node.leader_id is None
                and self.name == first
                and all(link.handle is not None for link in self._links.values())
            ):
                node.start_election_now()  # a new group: no need to wait for a timeout
            node.tick()
            self.kick()

    # ------------------------------------------------------------ the shell's loop
    def kick(self) -> None:
        """Drain the node soon; everything produced until then shares the drain."""
        if not self._drain_pending:
            self._drain_pending = True
            self.loop.call_soon(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_pending = False
        if not self._draining:
            self._draining = True
            self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self.node.has_ready():
                await self._handle(self.node.ready())
        except Exception:
            log.exception("%s: Raft step failed", self.name)
        finally:
            self._draining = False

    async def _handle(self, ready: Ready) -> None:
        # 1. persist what the messages promise, 2. send, 3. apply
        if ready.hard_state is not None:
            hs = ready.hard_state
            await self.broker.run(self._hard_file.save, {"term": hs.term, "votedFor": hs.voted_for})
        if ready.log_truncated_from is not None or len(ready.log_appended):
            # one fsync for the whole drain; the loop goes on (and the log may grow) meanwhile
            end = self.raft_log.write_index()
            await self.broker.run(self.raft_log.flush, end)
        if ready.messages:
            wire, run = to_wire(ready.messages, self.raft_log)
            run_ref = ray.put(run) if run is not None else None
            by_peer: dict[str, list[Any]] = defaultdict(list)
            for msg, raw in zip(ready.messages, wire):
                by_peer[msg.dst].append(raw)
            for peer, msgs in by_peer.items():
                self._links[peer].send(msgs, run_ref)
        if len(ready.log_appended) and not self.node.is_leader:
            # a follower's entries: acknowledged above, dispatched to its queues now
            await self.broker.run(self.store.dispatch_replicated)
        if len(ready.committed):
            self._apply(ready.committed)
        if ready.soft_state is not None:
            self._on_soft_state(ready.soft_state)

    def _apply(self, committed: range) -> None:
        for index in committed:
            waiter = self._waiters.pop(index, None)
            if waiter is not None and not waiter[1].done():
                waiter[1].set_result(self.raft_log.term_at(index) == waiter[0])
        self.readable_end = max(self.readable_end, self.raft_log.end_of(committed[-1]))
        fut, self._committed = self._committed, self.loop.create_future()
        fut.set_result(None)

    def _on_soft_state(self, soft: SoftState) -> None:
        was_leader = self._registered_as == MASTER_ID
        if soft.role is Role.LEADER and not was_leader:
            self.leader_changes += 1
            log.warning(
                "%s: leader of %s in term %d", self.name, self.config.broker_name, soft.term
            )
            self.services.start_schedule()
        elif soft.role is not Role.LEADER and was_leader:
            log.warning("%s: no longer the leader (term %d)", self.name, soft.term)
            self.services.stop_schedule()
        if soft.leader_id is not None and soft.leader_id != self.name:
            self.sync.kick()
        if (soft.role is Role.LEADER) != was_leader or self._registered_as is None:
            self._tasks = [t for t in self._tasks if not t.done()]
            self._tasks.append(self.loop.create_task(self._register()))

    async def _register(self) -> None:
        """Register as what this member is now (id 0 while leading) and leave the other id."""
        async with self._reregister:
            now = self.registered_id
            if now == self._registered_as:
                return
            old, self._registered_as = self._registered_as, now
            await self.broker.register_all()
            if old is not None:
                await self._unregister(old)

    def on_peer_dead(self, peer: str) -> None:
        log.info("%s: Ray reports %s dead", self.name, peer)
        self.death_notices[peer] = time.monotonic()
        self.node.on_peer_dead(peer)
        self.kick()

    async def raft_receive(self, messages: list[Any], run: Any = None) -> None:
        node = self.node
        for msg in from_wire(messages, run):
            try:
                node.receive(msg)
            except RaftError:
                log.exception("%s: a Raft message broke a safety check: %r", self.name, msg)
                raise
            if isinstance(msg, RequestVote) and msg.force and self._better_candidate(msg):
                # Another member learned that the leader died, but this one holds more of the
                # log and cannot vote for it: rather than wait for an election timeout (its
                # own death notice may be late), it campaigns now and wins.
                node.start_election_now()
        self.kick()

    def _better_candidate(self, msg: RequestVote) -> bool:
        raft_log = self.raft_log
        return self.node.role is Role.FOLLOWER and (raft_log.last_term, raft_log.last_index) > (
            msg.last_log_term,
            msg.last_log_index,
        )

    def _fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for _, fut in waiters.values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()

    # ------------------------------------------------------------ NameServers
    @property
    def role(self) -> str:  # type: ignore[override]
        return "MASTER" if self.node.is_leader else "SLAVE"

    @property
    def registered_id(self) -> int:
        return MASTER_ID if self.node.is_leader else self.config.broker_id + 1

    @property
    def master_epoch(self) -> int:
        return self.node.term if self.node.is_leader else 0

    async def leader_handle(self) -> Any:
        """The actor handle of the group's leader; None while none is known or this
        member leads."""
        leader = self.node.leader_id
        if leader is None or leader == self.name:
            return None
        link = self._links.get(leader)
        return link.handle if link is not None else None

    # ------------------------------------------------------------ data path
    async def put(self, batch: EncodedBatch, local_put: LocalPut) -> PutBatchResult:
        return await self._propose(batch, internal=False)

    def puts_at_once(self) -> bool:
        return False  # every put is a proposal to the group

    async def put_internal(self, batch: EncodedBatch) -> PutBatchResult:
        """A delivery of the schedule service (already validated and converted)."""
        return await self._propose(batch, internal=True)

    async def _propose(self, batch: EncodedBatch, *, internal: bool) -> PutBatchResult:
        node = self.node
        if not node.is_leader:
            raise BrokerUnavailableError(
                f"broker {self.name} is not the DLedger leader of {self.config.broker_name} "
                f"(leader: {node.leader_id or 'being elected'})"
            )
        # put and propose in one step of the event loop: entries tile the CommitLog
        if self.store.dispatched_offset < self.store.commitlog.max_offset:
            self.store.dispatch_replicated()  # entries it took as a follower, before its own
        start = self.raft_log.end
        put = self.store._put_encoded if internal else self.store.put_encoded
        result = put(batch)
        try:
            self.raft_log.prewritten(self.store.commitlog.max_offset)
            proposal = node.propose([OWN_ENTRY])
        except BaseException as exc:
            self.raft_log.prewritten(None)
            self.store.truncate_commitlog(start)
            if isinstance(exc, NotLeaderError):
                raise BrokerUnavailableError(f"broker {self.name}: {exc}") from None
            raise
        fut: asyncio.Future[bool] = self.loop.create_future()
        self._waiters[proposal.last_index] = (proposal.term, fut)
        self.kick()
        try:
            committed = await asyncio.wait_for(
                asyncio.shield(fut), self.config.sync_replication_timeout_s
            )
        except asyncio.TimeoutError:
            result.status = PutStatus.FLUSH_SLAVE_TIMEOUT  # stored here, not by a majority yet
            return result
        if not committed:
            raise BrokerUnavailableError(
                f"broker {self.name} lost the leadership before the batch committed"
            )
        return result

    def readable(self, raw: RawGetResult, offset: int) -> tuple[RawGetResult, bool]:
        if raw.status is not GetStatus.FOUND or not raw.count:
            return raw, False
        end = self.readable_end
        data = raw.data
        sizes = getattr(raw, "sizes", None)
        if sizes is not None:
            lengths = np.asarray(sizes, dtype=np.int64)
            starts = np.cumsum(lengths) - lengths
        else:
            positions, pos = [], 0
            while pos < len(data):
                positions.append(pos)
                pos += int.from_bytes(data[pos : pos + 4], "big")
            starts = np.asarray(positions, dtype=np.int64)
        last = int(starts[-1])
        if int.from_bytes(data[last + _OFF_PHYS : last + _OFF_PHYS + 8], "big") < end:
            return raw, False  # all committed: the common case
        keep = 0
        for at in starts.tolist():
            if int.from_bytes(data[at + _OFF_PHYS : at + _OFF_PHYS + 8], "big") >= end:
                break
            keep += 1
        if keep == 0:
            return self.nothing_yet(raw, offset), True
        cut = int(starts[keep])
        at = cut + _OFF_QUEUEOFFSET
        changes: dict[str, Any] = {
            "data": data[:cut],
            "count": keep,
            "next_offset": int.from_bytes(data[at : at + 8], "big"),
        }
        if sizes is not None:
            changes["sizes"] = sizes[:keep]
        return dataclasses.replace(raw, **changes), False

    async def wait_readable(self, timeout_s: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._committed), timeout_s)

    def on_commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        if not self.node.is_leader:
            self.sync.record_local(group, offsets)

    def config_snapshot(self) -> dict[str, Any]:
        if not self.node.is_leader:
            raise BrokerUnavailableError(f"broker {self.name} is not the DLedger leader")
        return super().config_snapshot()

    def local_offsets(self) -> OffsetTable:
        return dict(self.sync.local)

    async def promote(self, role: str | None, min_offset: int, force: bool) -> dict[str, Any]:
        raise PromotionRefusedError(
            f"broker {self.name} is a DLedger member: its group elects its master "
            f"(the leader is {self.node.leader_id or 'being elected'})"
        )

    def status(self) -> dict[str, Any]:
        node = self.node
        return {
            "role": self.role,
            "broker_role": "DLEDGER",
            "registered_id": self.registered_id,
            "master_epoch": self.master_epoch,
            "raft_role": node.role.value,
            "term": node.term,
            "leader": node.leader_id,
            "commit_index": node.commit_index,
            "last_index": self.raft_log.last_index,
            "committed_offset": self.readable_end,
            "leader_changes": self.leader_changes,
            "death_notices": dict(self.death_notices),
            "raft_members": list(node.members),
            "metadata_syncs": self.sync.rounds,
            # on the leader: the last log index each follower is known to hold
            "match_index": (
                {peer: node.match_index(peer) for peer in node.peers} if node.is_leader else {}
            ),
        }
