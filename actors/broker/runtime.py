"""What every part of a broker shares: its store, managers, event loop and I/O threads.

RocketMQ's processors and services each hold the ``BrokerController`` and reach
the managers through it; here they hold a :class:`BrokerRuntime`, which is that
controller as the parts see it: plain parts (the store, topic config, consumer
offsets, consumers, offset fences, held pulls, stream checkpoints), the loop the
actor runs on and its I/O pool, and the NameServer handles. It knows neither the
Ray methods (``actors.broker.broker``) nor the broker's role in its group
(``actors.broker.ha``), so both can depend on it without a circle.

Registration with the NameServers belongs to ``actors.broker.out.registration``; a part
that changed what the NameServers must know (a topic created, a role taken) calls
:meth:`BrokerRuntime.register_all`, which the Broker wires to it at start, or
:meth:`BrokerRuntime.request_registration` to have the heartbeat loop run early.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import ray

from actors.broker.client.consumer_manager import ConsumerManager
from actors.broker.faults import Faults
from actors.broker.longpolling.pull_hold_service import PullRequestHoldService
from actors.broker.offset.consumer_offset_manager import ConsumerOffsetManager
from actors.broker.offset.fence_table import OffsetFenceTable
from actors.broker.offset.stream_checkpoints import StreamCheckpoints
from actors.broker.topic.topic_config_manager import TopicConfigManager
from actors.config.broker import BrokerConfig
from storage import MessageStore
from storage.errors import BrokerUnavailableError

log = logging.getLogger("raymq.actors.broker.broker")
T = TypeVar("T")


def default_store_dir(namespace: str, actor_name: str) -> str:
    """``~/raymq/store/<namespace>/<actor name>`` on the broker's node."""
    return str(Path.home() / "raymq" / "store" / namespace / actor_name)


async def _not_wired() -> int:
    raise RuntimeError("BrokerRuntime.register_all used before the broker wired it")


class BrokerRuntime:
    """The shared parts of one broker; built on the actor's event loop, in ``__init__``."""

    def __init__(self, config: BrokerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.incarnation = uuid.uuid4().hex
        ctx = ray.get_runtime_context()
        self.node_id: str = ctx.get_node_id()
        self.node_ip = config.broker_ip or ray.util.get_node_ip_address()
        self.addr = f"{self.node_ip}:{config.listen_port}"
        self.store_dir = config.store_dir or default_store_dir(config.namespace, config.actor_name)
        self.io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="broker-io")
        # the store's services run by the broker's role (a slave's schedule service must not)
        self.store = MessageStore(
            config.store_config(self.store_dir, self.addr), start_services=False
        )
        # ASYNC_FLUSH puts are a copy into the mapped file: cheaper on the event loop
        # than a thread hop
        self.inline_puts = config.inline_async_puts and not self.store.config.sync_flush
        self.topics = TopicConfigManager(
            self.store.config_file("topics"),
            config.broker_name,
            auto_create=config.auto_create_topic_enable,
            default_queue_nums=config.default_topic_queue_nums,
        )
        self.offsets = ConsumerOffsetManager(self.store.config_file("consumerOffset"))
        self.stream_checkpoints = StreamCheckpoints(self.store.config_file("streamCheckpoint"))
        self.consumers = ConsumerManager(config.channel_expired_s)
        self.fences = OffsetFenceTable()  # set by group coordinators, see actors.protocol.fencing
        self.faults = Faults(config.actor_name)  # injected by tests and drills
        self.holds = PullRequestHoldService(loop)
        self.store.add_dispatch_listener(self.holds.on_dispatch)
        self.data_addr = ""  # the data path's ip:port once it listens (actors/broker/listener.py)
        self.grpc_addr = ""  # the gRPC endpoint's ip:port once it listens (actors/broker/grpc)
        self.closing = False
        self.fenced: str | None = None
        """Why the broker takes no writes now (its cluster lease lapsed), or None."""
        self.lease_renewed = time.monotonic()
        """When the cluster last answered the broker's lease (``actors.broker.lease``)."""
        self.started = time.time()
        self.stats: dict[str, int] = {
            "put_msgs": 0,
            "put_bytes": 0,
            "put_batches": 0,
            "put_timed": 0,  # puts (sends and send-backs) timed into put_micros
            "put_micros": 0,  # their total time, store and replication included
            "shared_batches": 0,  # of put_batches: read from a producer's shared ring
            "put_single": 0,  # of put_batches: single sends put in plain values (put_one_send)
            "put_out_of_order": 0,  # idempotent sends refused for a run missing before them
            "get_msgs": 0,
            "pulls": 0,
            "txn_committed": 0,  # transactions (actors/broker/transaction/service.py)
            "txn_one_phase": 0,  # committed here alone (actors/broker/transaction/one_phase.py)
            "txn_one_phase_repeated": 0,  # a commit sent again: answered, not written
            "txn_rolled_back": 0,
            "txn_checks": 0,
            "txn_discarded": 0,
            "txn_resolved": 0,  # multi-message transactions' halves the coordinator aborted
            "txn_scans": 0,  # reads of every pending half message (check rounds, ends by id, lists)
        }
        self.group_gets: dict[str, int] = {}
        """Messages served to each consumer group by pulls and pops (the console's consume
        TPS, RocketMQ's GROUP_GET_NUMS); counted once per pull, not per message."""
        self.subscription_groups_changed: Callable[[dict[str, Any]], None] = lambda _: None
        """Told a ``subscriptionGroup.json`` a slave copied from its master (set by the POP
        processor: its FIFO groups follow)."""
        self.registration_due = asyncio.Event()
        self.register_all: Callable[[], Awaitable[int]] = _not_wired
        """Register with every NameServer now (``actors.broker.out.registration``)."""
        self.replay_txn_offsets: Callable[[], int] | None = None
        """Re-apply the offsets of one-phase commits the offset table may lack (set by the
        broker, ``actors.broker.transaction.one_phase``; a promotion calls it)."""
        self._nameservers: dict[str, Any] = {}

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the broker's I/O threads, off its event loop."""
        return await self.loop.run_in_executor(self.io, fn, *args)

    def request_registration(self) -> None:
        """Have the heartbeat loop register with the NameServers now, not at its next beat."""
        self.registration_due.set()

    def nameserver(self, name: str) -> Any:
        """The NameServer actor ``name`` (cached; blocking: call through :meth:`run`)."""
        handle = self._nameservers.get(name)
        if handle is None:
            handle = ray.get_actor(name, namespace=self.config.namespace)
            self._nameservers[name] = handle
        return handle

    def writable(self) -> bool:
        """Whether the broker may take writes: not fenced, and its lease not lapsed now
        (checked at each write, so a process that wakes from a pause longer than its
        lease acknowledges nothing before the cluster has answered it again)."""
        if self.fenced is not None:
            return False
        lease = self.config.cluster_lease_s
        return lease <= 0 or time.monotonic() - self.lease_renewed <= lease

    def puts_now(self, role: Any) -> bool:
        """Whether a put may be done and answered at once, on the event loop: puts are
        inline (ASYNC_FLUSH), the broker open and writable, and its role (``Replication``)
        has nothing to wait for (no slave, no proposal). The sends' frame reader answers
        such a send from its callback (``SendMessageProcessor.send_now``,
        ``LiteProcessor.send_now``)."""
        return self.inline_puts and not self.closing and self.writable() and role.puts_at_once()

    def check_writable(self) -> None:
        """Raise ``BrokerUnavailableError`` unless :meth:`writable` (see ``lease``)."""
        if not self.writable():
            raise BrokerUnavailableError(
                self.fenced
                or f"broker {self.config.actor_name}: its cluster lease lapsed "
                f"(cluster_lease_s={self.config.cluster_lease_s:g}): it takes no writes "
                "until the cluster answers it again"
            )

    def forget_nameserver(self, name: str) -> None:
        """A call to ``name`` failed: look it up anew next time (it may have restarted)."""
        self._nameservers.pop(name, None)
