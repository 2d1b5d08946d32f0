"""Master/slave replication (RocketMQ 4's HAService), one side or the other of it.

A group is a master (broker id 0) and slaves (ids >= 1), each a Broker actor
on its own node and disk. Every slave runs an :class:`~actors.broker.ha.ha_client.HAClient`
(pulling the master's CommitLog byte for byte) and a
:class:`~actors.broker.ha.slave_sync.SlaveSynchronize` (topics, consumer offsets,
delay progress); the master answers them with its
:class:`~actors.broker.ha.ha_service.HAService`. This module is the role a broker plays
and how it changes: promotion, demotion, where a slave finds its master.

``broker_role``:

* ``ASYNC_MASTER``: a put returns after the local write (and flush);
* ``SYNC_MASTER``: a put also waits until some slave reports an offset at or
  past its end (RocketMQ's GroupTransferService). Concurrent puts share the
  slave's round trips, since one long-polled answer carries everything written
  meanwhile. No slave in sync: ``SLAVE_NOT_AVAILABLE`` at once; none in time:
  ``FLUSH_SLAVE_TIMEOUT``;
* ``SLAVE``: refuses writes; serves reads when the master is gone (or, with
  ``slave_read_enable``, to consumers far behind).

Without Raft a group whose master is gone is read-only until an operator
promotes a slave (:meth:`MasterSlaveReplication.promote`): the slave starts a
new master epoch (``actors.broker.ha.epochs``) and registers as id 0; the NameServers
refuse the old master from then on, and when it returns it becomes a slave
that first cuts off whatever it wrote that the new master never had.

Invariants: a put acknowledged ``PUT_OK`` by a SYNC_MASTER is in the CommitLog
of at least one slave; only a slave at or past the last such offset can be
promoted; a master serves writes only after the NameServers accepted it (a
deposed master returning learns of its successor before it takes a write), and a
master restarting behind a slave of its epoch (a power loss took its unflushed tail)
first copies that slave's tail, so no acknowledged queue offset is given twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import ray

from actors.broker.ha.epochs import Epochs, HAState
from actors.broker.ha.ha_client import HAClient, TransferReply
from actors.broker.ha.ha_service import HAService
from actors.broker.ha.master_restart import GATHER_TIMEOUT_S, MasterStart, gather_slave_offsets
from actors.broker.ha.replication import (
    LocalPut,
    OffsetTable,
    Replication,
    first_commitlog_offset,
    physical_memory,
    stop_tasks,
    with_suggestion,
)
from actors.broker.ha.slave_sync import SlaveSynchronize
from actors.protocol.errors import PromotionRefusedError
from actors.protocol.names import MASTER_ID, broker_actor_name
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError, InvalidConfigError
from storage.message import GetStatus, RawGetResult
from storage.store import PutBatchResult

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.ha")

SLAVE = "SLAVE"
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
EX_MASTER_SLAVE_ID = 1000
"""The id a deposed master (configured as id 0) registers under as a slave."""
_BEHIND_ON_SLAVE = (GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.OFFSET_TOO_SMALL)
REGISTER_RETRY_S = 1.0
"""A master no NameServer has accepted yet registers again after this long."""
SLOW_PROMOTION_S = 5.0  # a promotion slower than this logs each step's time


class _StepTimer:
    """Times the steps of a promotion, to say which one was slow when it is."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self._steps.append((step, now - self._last))
        self._last = now

    def report(self, what: str) -> None:
        total = self._last - self._start
        if total >= SLOW_PROMOTION_S:
            log.warning(
                "%s took %.1f s: %s",
                what,
                total,
                ", ".join(f"{step} {took:.2f} s" for step, took in self._steps),
            )


class MasterSlaveReplication(Replication):
    def __init__(self, broker: BrokerRuntime) -> None:
        super().__init__(broker)
        self.loop = broker.loop
        self.state = HAState(self.store.config_file("haState"))
        self.role = self.state.role or self.config.role  # a promotion outlives restarts
        self.service = HAService(self)  # the master's side: slaves, acks, waiting puts
        self._writable = asyncio.Event()
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._master_name: str | None = None
        self._master_handle: Any = None
        self.client: HAClient | None = None
        self.sync: SlaveSynchronize | None = None
        self.starting = MasterStart(self)  # a master (re)starting: its catch-up first
        window = self.config.slave_read_window_bytes
        self.read_window = window if window is not None else int(physical_memory() * 0.4)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.services.start()
        if self.role == SLAVE:
            self._start_slave()
            self._ready.set()
        else:  # the schedule service starts once the NameServers accept this master
            self.state.ensure_started(self.store.commitlog.max_offset)
            self.service.catching_up = True
            self._tasks.append(self.loop.create_task(self._gather_then_ready()))

    async def stop(self) -> None:
        await self._stop_tasks()
        self.service.fail_waiters(
            BrokerUnavailableError(f"{self.config.actor_name} is shutting down")
        )
        self.services.stop()

    async def _stop_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        await stop_tasks(tasks, self.config.actor_name)

    async def ready(self) -> None:
        await self._ready.wait()

    def _start_slave(self) -> None:
        self.client = HAClient(self)
        self.sync = SlaveSynchronize(
            self.broker, self.master_handle, self.config.slave_sync_interval_s, self.learned
        )
        self._tasks.append(self.loop.create_task(self.client.run()))
        self._tasks.append(self.loop.create_task(self.sync.run()))

    async def _gather_then_ready(self) -> None:
        """A master (re)starting catches up from its slaves (``master_restart``), then
        takes writes from its log's end; it registers once ready."""
        try:
            await self.starting.run()
        finally:
            self.service.writes_from(self.store.commitlog.max_offset)
            self._ready.set()

    # ------------------------------------------------------------ NameServers
    @property
    def registered_id(self) -> int:
        if self.role != SLAVE:
            return MASTER_ID
        return self.config.broker_id or EX_MASTER_SLAVE_ID

    @property
    def master_epoch(self) -> int:
        return self.state.epoch

    def on_registered(self, answers: list[dict[str, Any]]) -> None:
        if self.role == SLAVE:
            for answer in answers:
                master = answer.get("master")
                if master and master != self.config.actor_name and master != self._master_name:
                    self._master_name = master
                    self._master_handle = None
            return
        for answer in answers:
            if (
                not answer.get("accepted", True)
                and answer.get("master_epoch", 0) > self.state.epoch
            ):
                self._tasks.append(
                    self.loop.create_task(self.demote(answer.get("master"), answer["master_epoch"]))
                )
                return
        if self._writable.is_set():
            return
        if self.config.nameservers and not any(a.get("accepted", True) for a in answers):
            # no NameServer took this master yet (none answered): a slave may have been
            # promoted meanwhile, so it takes no write before one does; ask again soon
            self.loop.call_later(REGISTER_RETRY_S, self.broker.request_registration)
            return
        self.services.start_schedule()
        self._writable.set()

    async def group_members(self) -> dict[int, str]:
        """Registered id -> actor name of this group's live members, per the NameServers
        (none when none answers)."""
        return await self.nameserver_members() or {}

    async def nameserver_members(self) -> dict[int, str] | None:
        """The group's live members per the first NameServer to answer; None when none
        of the configured ones answers (a NameServer restarting, a busy machine)."""
        b = self.broker
        if not b.config.nameservers:
            return {}
        for name in b.config.nameservers:
            try:
                handle = await b.run(b.nameserver, name)
                info = await asyncio.wait_for(handle.get_cluster_info.remote(), 2.0)
            except Exception:  # noqa: BLE001 - try the next NameServer
                continue
            members = info["brokers"].get(self.config.broker_name, {}).get("members", {})
            return {int(bid): m["actor_name"] for bid, m in members.items()}
        return None

    def get_actor(self, name: str) -> Any:
        return ray.get_actor(name, namespace=self.config.namespace)

    async def master_handle(self) -> Any:
        """The master's actor (slave side), found by name; None while there is none."""
        if self._master_handle is not None:
            return self._master_handle
        name = self._master_name or broker_actor_name(self.config.broker_name, MASTER_ID)
        if name == self.config.actor_name or self.role != SLAVE:
            return None
        try:
            self._master_handle = await self.broker.run(self.get_actor, name)
        except ValueError:
            await self.forget_master()
        return self._master_handle

    async def forget_master(self) -> None:
        """The master did not answer: look it up again (a slave may have been promoted)."""
        self._master_handle = None
        members = await self.group_members()
        master = members.get(MASTER_ID)
        if master and master != self.config.actor_name:
            self._master_name = master

    # ------------------------------------------------------------ data path
    async def put(self, batch: EncodedBatch, local_put: LocalPut) -> PutBatchResult:
        if self.role == SLAVE:
            raise BrokerUnavailableError(
                f"broker {self.config.actor_name} is a slave: it takes no writes "
                f"(its master is {self._master_name or 'gone'})"
            )
        if not self._writable.is_set():
            try:
                await asyncio.wait_for(self._writable.wait(), self.config.register_timeout_s)
            except asyncio.TimeoutError:
                raise BrokerUnavailableError(
                    f"broker {self.config.actor_name} is not registered as master yet"
                ) from None
        result = await local_put(batch)
        if self.role == "SYNC_MASTER" and len(result):
            last = int(result.commitlog_offsets[-1])
            end = last + self.store.commitlog.size_at(last)
            result.status = await self.service.wait_for_slave(end)
        return result

    def puts_at_once(self) -> bool:
        # a slave's refusal, the wait for registration and a SYNC_MASTER's wait for its
        # slave are :meth:`put`'s, on the general path
        return self.role == "ASYNC_MASTER" and self._writable.is_set()

    def readable(self, raw: RawGetResult, offset: int) -> tuple[RawGetResult, bool]:
        if self.role == SLAVE and (
            raw.status in _BEHIND_ON_SLAVE
            or (raw.status is GetStatus.NO_MESSAGE_IN_QUEUE and offset > 0)
        ):
            # an offset out of this slave's queue is one it has not built yet (or has no
            # longer): a pull waits here and goes back to the master, and the consumer's
            # offset stays where it is (RocketMQ: PULL_RETRY_IMMEDIATELY on a slave)
            return with_suggestion(self.nothing_yet(raw, offset), MASTER_ID), False
        if not self.config.slave_read_enable or raw.status is not GetStatus.FOUND:
            return raw, False
        behind = self.store.commitlog.max_offset - first_commitlog_offset(raw)
        if self.role == SLAVE:
            return (
                (with_suggestion(raw, MASTER_ID), False)
                if behind <= self.read_window
                else (
                    raw,
                    False,
                )
            )
        if behind > self.read_window:
            slaves = self.service.live_slaves()
            if slaves:
                best = max(slaves, key=lambda s: s.ack)
                return with_suggestion(raw, best.registered_id), False
        return raw, False

    def on_commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        if self.role == SLAVE and self.sync is not None:
            self.sync.record_local(group, offsets)

    # ------------------------------------------------------------ master side
    async def transfer(self, *args: Any) -> TransferReply:
        return await self.service.transfer(*args)

    def config_snapshot(self) -> dict[str, Any]:
        if self.role == SLAVE:
            raise BrokerUnavailableError(f"broker {self.config.actor_name} is a slave")
        return super().config_snapshot()

    def local_offsets(self) -> OffsetTable:
        return dict(self.sync.local) if self.sync is not None else {}

    async def log_tail(self, offset: int, max_bytes: int) -> tuple[int, Epochs, list[Any]]:
        """A slave's CommitLog for a master that restarted behind it: its end at the last
        whole record (what arrived of a record is not the master's to reuse), its epochs
        and up to ``max_bytes`` from ``offset``, not past that end."""
        if self.role != SLAVE:
            raise BrokerUnavailableError(f"broker {self.config.actor_name} is not a slave")
        await self.broker.run(self.store.dispatch_replicated)
        end = self.store.dispatched_offset
        size = min(max_bytes, end - offset)
        chunks = self.service.read(offset, size) if size > 0 else []
        return end, list(self.state.epochs), chunks

    # ------------------------------------------------------------ role changes
    async def promote(self, role: str | None, min_offset: int, force: bool) -> dict[str, Any]:
        """Make this slave the master (``raymq broker promote``)."""
        name = self.config.actor_name
        if self.role != SLAVE:
            raise PromotionRefusedError(f"broker {name} is already {self.role}")
        new_role = role or self.config.master_role
        if new_role not in MASTER_ROLES:
            raise InvalidConfigError(f"role={new_role!r}: must be one of {MASTER_ROLES}")
        client = self.client
        if client is not None and client.connected and not force:
            raise PromotionRefusedError(
                f"broker {name} still replicates from master {client.master}: a live master "
                "is not replaced (force=True overrides)"
            )
        master = (await self.group_members()).get(MASTER_ID)
        if master is not None and master != name and not force:
            raise PromotionRefusedError(
                f"broker {name}: {master} is registered as master of "
                f"{self.config.broker_name} (it came back meanwhile): a live master is not "
                "replaced (force=True overrides)"
            )
        steps = _StepTimer()
        await self.broker.run(self.store.dispatch_replicated)  # what arrived is whole records
        steps.mark("dispatch")
        end = self.store.dispatched_offset  # the last whole record
        needed = max(min_offset, self.state.confirmed, client.confirmed if client else 0)
        if end < needed:
            raise PromotionRefusedError(
                f"broker {name} holds the commitlog up to offset {end}, behind the last "
                f"acknowledged SYNC_MASTER offset {needed}: promoting it would lose "
                "acknowledged messages; promote a slave that has them"
            )
        await self._stop_tasks()
        steps.mark("stop_tasks")
        await self.broker.run(self.store.dispatch_replicated)  # bytes that came meanwhile
        end = self.store.dispatched_offset
        if self.sync is not None:  # commits consumers made here now belong to the master
            self.broker.offsets.merge_max(self.sync.local)
        if self.broker.replay_txn_offsets is not None:  # one-phase commits' offsets the
            await self.broker.run(self.broker.replay_txn_offsets)  # snapshot did not hold
        self.client = self.sync = None
        if self.store.commitlog.max_offset > end:
            await self.broker.run(self.store.truncate_commitlog, end)
        steps.mark("dispatch_and_truncate")
        old_id = self.registered_id
        epoch = self.state.begin_epoch(end)
        self.state.set_role(new_role)
        self.role = new_role
        self.service.clear()
        self.service.writes_from(None)
        self.services.start_schedule()
        self._ready.set()
        log.warning(
            "%s promoted to %s of %s in epoch %d at commitlog offset %d",
            name,
            new_role,
            self.config.broker_name,
            epoch,
            end,
        )
        await self._unregister(old_id)
        steps.mark("unregister")
        with contextlib.suppress(Exception):  # commits consumers made to the other slaves
            await asyncio.wait_for(
                gather_slave_offsets(self, await self.group_members(), self.get_actor),
                GATHER_TIMEOUT_S,
            )
        steps.mark("gather_slave_offsets")
        await self.broker.register_all()
        steps.mark("register")
        await self._depose_old_master()
        steps.report(f"{name} promotion")
        return {"broker": name, "role": new_role, "epoch": epoch, "commitlog_offset": end}

    async def _depose_old_master(self) -> None:
        """A master configured as id 0 that restarted and registered in its old epoch
        while this slave was being promoted takes writes until its next registration is
        refused: have it register now, so it learns of the new epoch and becomes a slave
        at once (best effort: a master that is down learns it when it registers)."""
        old = broker_actor_name(self.config.broker_name, MASTER_ID)
        if old == self.config.actor_name:
            return
        try:
            handle = await self.broker.run(self.get_actor, old)
            await asyncio.wait_for(handle.register_all.remote(), GATHER_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - down: the NameServers refuse it later
            log.debug("%s: asking %s to register: %s", self.config.actor_name, old, exc)

    def newer_epoch(self, slave: str, epoch: int) -> None:
        """A slave asking this master for the CommitLog follows a newer epoch: a newer
        master replaced this one while it was away (and the NameServers it registered
        with did not know: one restarted): it becomes a slave at once."""
        if self.role == SLAVE:
            return
        log.warning(
            "%s: slave %s follows epoch %d, newer than this master's %d",
            self.config.actor_name,
            slave,
            epoch,
            self.state.epoch,
        )
        self._tasks.append(self.loop.create_task(self.demote(None, epoch)))

    async def demote(self, master: str | None, epoch: int) -> None:
        """The NameServers know a newer master: become its slave."""
        if self.role == SLAVE:
            return
        log.warning(
            "%s: %s is master of %s in epoch %d (this broker was in epoch %d): becoming a slave",
            self.config.actor_name,
            master,
            self.config.broker_name,
            epoch,
            self.state.epoch,
        )
        self.role = SLAVE
        self.state.set_role(SLAVE)
        self.state.max_epoch = max(self.state.max_epoch, epoch)
        self._writable.clear()
        self.service.fail_waiters(
            BrokerUnavailableError(f"broker {self.config.actor_name} was deposed by {master}")
        )
        self.service.clear()
        self.services.stop_schedule()
        self._master_name = master
        self._master_handle = None
        await self._unregister(MASTER_ID)
        self._start_slave()
        self.broker.request_registration()

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": "SLAVE" if self.role == SLAVE else "MASTER",
            "broker_role": self.role,
            "registered_id": self.registered_id,
            "master_epoch": self.state.epoch,
        }
        if self.role == SLAVE:
            c = self.client
            out["master"] = c.master if c is not None else self._master_name
            out["ha_connected"] = bool(c and c.connected)
            out["ha_confirmed_offset"] = c.confirmed if c is not None else self.state.confirmed
            out["ha_confirmed_saved"] = self.state.confirmed
            out["ha_master_offset"] = c.master_end if c is not None else 0
            out["ha_rounds"] = c.rounds if c is not None else 0
            out["ha_received_bytes"] = c.received if c is not None else 0
            out["metadata_syncs"] = self.sync.rounds if self.sync is not None else 0
        else:
            out["accepted_as_master"] = self._writable.is_set()
            if self.starting.waiting_for:  # starting: a registered slave has yet to answer
                out["waiting_for"] = list(self.starting.waiting_for)
            out.update(self.service.status())
        return out
