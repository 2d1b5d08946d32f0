"""The part of a Broker that makes it one member of a broker group.

A RocketMQ broker group is a master with slaves (``actors.broker.ha.master_slave``) or a DLedger
Raft group that elects its master (``actors.broker.ha.dledger``). Either way the Broker
actor owns one :class:`Replication` and routes through it everything whose
meaning depends on the broker's place in the group:

* the write path (``put``): a master stores locally and, as SYNC_MASTER, waits
  for a slave; a DLedger leader acknowledges once a majority holds the batch;
  a slave or follower refuses;
* what a pull may return (``readable``): a DLedger member serves only
  committed records; with ``slave_read_enable`` a pull that lags far behind is
  pointed at a slave (``PullAnswer.suggest_broker_id``);
* how it registers with the NameServers (``registered_id``, ``master_epoch``)
  and what their answers mean (``on_registered``: a master replaced by a newer
  epoch steps down);
* the store's background services: only a master runs the schedule service,
  because only a master may write to its CommitLog.

Invariant: a broker writes to its CommitLog only as the master (or DLedger
leader) of its group, or by appending bytes its master (leader) wrote at the
same offsets, so every member's CommitLog is a prefix of, or diverges only in
an unacknowledged tail from, the master's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from actors.protocol.errors import PromotionRefusedError
from actors.protocol.names import MASTER_ID
from actors.protocol.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
    is_retry_topic,
)
from actors.protocol.wire import PullAnswer
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError
from storage.message import GetStatus, RawGetResult
from storage.schedule import SCHEDULE_TOPIC, ScheduleMessageService
from storage.services import (
    CleanCommitLogService,
    FlushConsumeQueueService,
    FlushRealTimeService,
    ServiceThread,
)
from storage.store import MessageStore, PutBatchResult
from storage.timer import TIMER_TOPIC, TimerMessageService

if TYPE_CHECKING:
    from actors.broker.runtime import BrokerRuntime

log = logging.getLogger("raymq.actors.ha")

LocalPut = Callable[[EncodedBatch], Awaitable[PutBatchResult]]
OffsetTable = dict[tuple[str, str], dict[int, int]]

_PHYS = struct.Struct(">q")
_OFF_PHYS = 28  # PHYSICALOFFSET in a CommitLog record


async def stop_tasks(tasks: list[asyncio.Task[Any]], owner: str, again_s: float = 1.0) -> None:
    """Cancel ``tasks`` and wait until every one has ended. One still running
    ``again_s`` after its cancellation is cancelled again, with a warning naming where
    it was: a cancellation can be lost (``asyncio.wait_for`` before Python 3.12 returns
    the result when what it waits for completes as it is cancelled, and a loop around
    it goes on), and a promotion or a shutdown waiting on such a task would wait
    forever."""
    running = list(tasks)
    while running:
        for task in running:
            task.cancel()
        _, still = await asyncio.wait(running, timeout=again_s)
        for task in still:
            frames = task.get_stack(limit=1)
            where = f"{frames[0].f_code.co_name}:{frames[0].f_lineno}" if frames else "?"
            log.warning("%s: %s did not end when cancelled (at %s): again", owner, task, where)
        running = list(still)
    for task in tasks:  # what a task raised on its way out is of no use now: retrieved
        if not task.cancelled():
            task.exception()


def with_suggestion(raw: RawGetResult, broker_id: int) -> PullAnswer:
    values = {f.name: getattr(raw, f.name) for f in dataclasses.fields(RawGetResult)}
    return PullAnswer(**values, suggest_broker_id=broker_id)


def first_commitlog_offset(raw: RawGetResult) -> int:
    """The CommitLog offset of the first record of a FOUND pull."""
    return int(_PHYS.unpack_from(raw.data, _OFF_PHYS)[0])


def physical_memory() -> int:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


class StoreServices:
    """The store's background services, started by the broker's role: flush, checkpoint
    and expiry always; the schedule and timer services (which write) only on a master."""

    def __init__(
        self,
        store: MessageStore,
        schedule_factory: Callable[[], Any] | None = None,
        timer_factory: Callable[[], Any] | None = None,
    ):
        self.store = store
        self._always: list[ServiceThread] = []
        self._schedule: ScheduleMessageService | None = None
        self._schedule_factory = schedule_factory
        self._fresh = True  # store.schedule was never started
        self._timer: TimerMessageService | None = None
        self._timer_factory = timer_factory

    def start(self) -> None:
        store = self.store
        if not store.config.sync_flush:
            self._always.append(FlushRealTimeService(store))
        self._always.append(FlushConsumeQueueService(store))
        self._always.append(CleanCommitLogService(store))
        for service in self._always:
            service.start()
        store.watch_disk()  # puts do not wait for statvfs (the store stops it on close)

    @property
    def schedule(self) -> ScheduleMessageService | None:
        return self._schedule

    def start_schedule(self) -> None:
        if self._schedule is not None:
            return
        if self._schedule_factory is not None:
            self._schedule = self._schedule_factory()
        elif self._fresh:
            self._schedule = self.store.schedule
        else:  # a ServiceThread cannot start twice; a new one re-reads delayOffset.json
            self._schedule = ScheduleMessageService(self.store)
        self._fresh = False
        assert self._schedule is not None
        self._schedule.start()
        if self.store.config.timer_wheel_enable and self._timer is None:
            # a new service each time (a thread starts once); the wheel is the store's
            self._timer = (
                self._timer_factory()
                if self._timer_factory is not None
                else TimerMessageService(self.store, self.store.timer_wheel)
            )
            self._timer.start()

    def stop_schedule(self) -> None:
        svc, self._schedule = self._schedule, None
        if svc is not None:
            svc.stop()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.stop()

    @property
    def timer(self) -> TimerMessageService | None:
        """The running timer service (a master's), or None."""
        return self._timer

    def delay_offsets(self) -> dict[int, int]:
        svc = self._schedule or self.store.schedule
        return dict(svc.offsets)

    def stop(self) -> None:
        self.stop_schedule()
        for service in self._always:
            service.stop()
        self._always.clear()


class Replication:
    """The broker's role in its group. This base is a lone master (ASYNC_MASTER with no
    slaves configured behaves exactly like it): subclasses add the rest."""

    role = "ASYNC_MASTER"
    one_phase = True  # takes one-phase commits (actors.broker.transaction.one_phase)

    def __init__(self, broker: BrokerRuntime) -> None:
        self.broker = broker
        self.store = broker.store
        self.config = broker.config
        self.services = StoreServices(broker.store, self._schedule_factory(), self._timer_factory())
        self.learned: set[str] = set()
        """Topics this replica learned from replicated records, not yet from its master's
        metadata (SlaveSynchronize keeps them until the master's snapshot names them)."""
        broker.store.add_dispatch_listener(self._learn_topic)

    def _learn_topic(self, topic: str, queue_id: int, max_offset: int) -> None:
        """A replica (slave, DLedger follower) dispatched records of a topic it has no
        config for, or of a queue beyond it: the master created the topic after the last
        metadata sync. Adopt a config from the data at once (read and write queues to cover
        it; retry and DLQ topics as the broker makes them), so that the records are
        readable here, and routable, even if the master dies before the next sync.
        SlaveSynchronize replaces it with the master's own config when it next runs."""
        if self.is_master or topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            return
        topics = self.broker.topics
        known = topics.get(topic)
        if known is not None and queue_id < known.read_queue_nums:
            return
        if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
            config = TopicConfig(topic, queue_id + 1, queue_id + 1, PERM_WRITE)
        else:
            nums = max(
                queue_id + 1, 1 if is_retry_topic(topic) else self.config.default_topic_queue_nums
            )
            if known is not None:
                nums = max(nums, known.read_queue_nums, known.write_queue_nums)
            config = TopicConfig(topic, nums, nums, known.perm if known else PERM_READ | PERM_WRITE)
        topics.put(config)
        self.learned.add(topic)
        log.info(
            "%s: learned topic %s (%d queues) from replicated records",
            self.config.actor_name,
            topic,
            config.read_queue_nums,
        )
        self.broker.loop.call_soon_threadsafe(self.broker.request_registration)

    def _schedule_factory(self) -> Callable[[], Any] | None:
        return None

    def _timer_factory(self) -> Callable[[], Any] | None:
        return None

    # -- lifecycle
    def start(self) -> None:
        self.services.start()
        self.services.start_schedule()

    async def stop(self) -> None:
        self.services.stop()

    async def ready(self) -> None:
        """Returns once the broker may register (a returning master first gathers the
        consumer offsets its slaves took while it was gone)."""

    # -- NameServer registration
    @property
    def registered_id(self) -> int:
        return self.config.broker_id

    async def _unregister(self, registered_id: int) -> None:
        """Take this broker's registration as ``registered_id`` off every NameServer
        (best effort: a registration nobody refreshes expires anyway)."""
        b = self.broker
        for name in b.config.nameservers:
            try:
                handle = await b.run(b.nameserver, name)
                await asyncio.wait_for(
                    handle.unregister_broker.remote(
                        self.config.broker_name, registered_id, b.incarnation
                    ),
                    2.0,
                )
            except Exception:  # noqa: BLE001 - it expires anyway
                continue

    @property
    def master_epoch(self) -> int:
        return 0

    @property
    def is_master(self) -> bool:
        return self.registered_id == MASTER_ID

    def on_registered(self, answers: list[dict[str, Any]]) -> None:
        """The NameServers' answers to a registration round."""

    # -- data path
    async def put(self, batch: EncodedBatch, local_put: LocalPut) -> PutBatchResult:
        return await local_put(batch)

    def puts_at_once(self) -> bool:
        """Whether :meth:`put` would do nothing but ``local_put`` now (no slave to wait
        for, no proposal, no registration pending): a send may then be stored and
        answered without a task of its own (``SendMessageProcessor.send_now``)."""
        return True

    def readable(self, raw: RawGetResult, offset: int) -> tuple[RawGetResult, bool]:
        """What a pull may return of ``raw``; True when only records that are not yet
        committed were found (the pull should wait for :meth:`wait_readable`)."""
        return raw, False

    async def wait_readable(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for more of the CommitLog to become readable."""

    def on_commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """A consumer committed ``offsets`` here."""

    # -- group RPCs (a member calls these on another through the Broker actor)
    def config_snapshot(self) -> dict[str, Any]:
        """What a slave (follower) copies from its master: topics, offsets, delay progress
        and subscription groups (their FIFO flags, ``subscriptionGroup.json``)."""
        b = self.broker
        return {
            "topics": b.topics.snapshot(),
            "offsets": b.offsets.snapshot(),
            "txn_markers": b.offsets.txn_markers,
            "delay_offsets": self.services.delay_offsets(),
            "subscription_groups": b.store.config_file("subscriptionGroup").load(),
        }

    async def transfer(self, *args: Any) -> Any:
        raise BrokerUnavailableError(
            f"broker {self.config.actor_name} is not a master of a master/slave group"
        )

    def local_offsets(self) -> OffsetTable:
        return {}

    async def log_tail(self, offset: int, max_bytes: int) -> Any:
        raise BrokerUnavailableError(
            f"broker {self.config.actor_name} is not a slave of a master/slave group"
        )

    def merge_offsets(self, table: OffsetTable) -> int:
        return self.broker.offsets.merge_max(table)

    async def promote(self, role: str | None, min_offset: int, force: bool) -> dict[str, Any]:
        raise PromotionRefusedError(
            f"broker {self.config.actor_name} is {self.role}: only a slave can be promoted"
        )

    async def raft_receive(self, messages: list[Any], run: Any = None) -> None:
        raise BrokerUnavailableError(f"broker {self.config.actor_name} is not a DLedger member")

    def status(self) -> dict[str, Any]:
        return {
            "role": "MASTER" if self.is_master else "SLAVE",
            "broker_role": self.role,
            "registered_id": self.registered_id,
        }

    # -- helpers for subclasses
    def nothing_yet(self, raw: RawGetResult, offset: int) -> RawGetResult:
        return RawGetResult(
            GetStatus.OFFSET_OVERFLOW_ONE, b"", 0, offset, raw.min_offset, raw.max_offset
        )
